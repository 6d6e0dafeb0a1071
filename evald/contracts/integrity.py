"""The integrity checks a manifest may name: one digest per weights file, taken as it is written and read.

Part of the checkpoint layout contract (docs/checkpoint-layout.md, "MANIFEST.json"; why
these two: docs/performance.md, "Integrity check"). A manifest names its check as
``"hash": {"algorithm": NAME, "version": V}``; a reader verifies only the (name, version)
pairs listed in ``CHECKS`` and refuses any other before a weights file is opened.

Version 1 of both: one digest per file, over all its bytes in order, written as the
lowercase hex that the by-hand command prints (``sha256sum``; ``xxh128sum`` from the xxHash
tools, which prints the canonical big-endian form of XXH3-128 with seed 0, as the
``xxhash`` package's ``xxh3_128().hexdigest()`` does).

* ``xxh3-128`` (the default): non-cryptographic, about 27 GB/s per core on the CI machine,
  15x sha256. It detects corruption (bit flips, torn or partial copies, a file replaced by
  another) as well as sha256 does, with a 2**-128 chance of missing one; it does not resist
  someone who crafts a file to match a digest (docs/security.md).
* ``sha256``: cryptographic, for those who want a digest nobody can match on purpose
  (``EvaldHook(hash_algorithm="sha256")``, ``EVALD_HASH=sha256``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Callable

try:
    import xxhash
except ImportError:  # a dependency of evald; refused with a clear error when a manifest needs it
    xxhash = None

DEFAULT = "xxh3-128"
WRITTEN_VERSION = 1


class UnknownCheck(ValueError):
    """A manifest names an integrity check (algorithm or version) this code does not verify."""


@dataclass(frozen=True)
class Check:
    algorithm: str
    version: int
    hex_digits: int
    cryptographic: bool
    by_hand: str                    # the command that prints the same digest of a file
    _factory: Callable[[], Any]

    def new(self):
        """A fresh hasher: ``update(bytes-like)``, ``hexdigest()``; releases the GIL on large updates."""
        return self._factory()


def _xxh3_128():
    if xxhash is None:
        raise UnknownCheck("the xxh3-128 integrity check needs the xxhash package, which is not installed "
                           "here: pip install xxhash (a dependency of evald)")
    return xxhash.xxh3_128()


CHECKS: dict[tuple[str, int], Check] = {
    ("xxh3-128", 1): Check("xxh3-128", 1, 32, False, "xxh128sum", _xxh3_128),
    ("sha256", 1): Check("sha256", 1, 64, True, "sha256sum", hashlib.sha256),
}
ALGORITHMS = tuple(dict.fromkeys(name for name, _ in CHECKS))  # what a writer may choose


def known() -> str:
    return ", ".join(f"{c.algorithm} version {c.version}" for c in CHECKS.values())


def lookup(algorithm: Any, version: Any, source: str = "<manifest>") -> Check:
    """The check a manifest names, or UnknownCheck naming the file, the value and what to do."""
    check = CHECKS.get((algorithm, version)) if isinstance(version, int) and not isinstance(version, bool) else None
    if check is None:
        same_name = [c.version for c in CHECKS.values() if c.algorithm == algorithm]
        what = (f"this evald verifies {algorithm} only in version {', '.join(map(str, same_name))}" if same_name
                else f"this evald verifies {known()}")
        raise UnknownCheck(f"{source}: integrity check hash.algorithm={algorithm!r}, hash.version={version!r} is "
                           f"not one this evald verifies ({what}); upgrade evald to a version that knows it, or "
                           f"write the snapshots with a check it knows (EvaldHook(hash_algorithm=...), "
                           f"EVALD_HASH: {' or '.join(ALGORITHMS)})")
    try:
        check.new()  # xxh3-128 without the xxhash package
    except UnknownCheck as exc:
        raise UnknownCheck(f"{source}: {exc}") from None
    return check


def for_writing(algorithm: str | None) -> Check:
    """The check a writer uses (``None``: the default); ValueError naming the choices otherwise."""
    name = DEFAULT if algorithm is None else algorithm
    check = CHECKS.get((name, WRITTEN_VERSION))
    if check is None:
        raise UnknownCheck(f"integrity check {name!r} is not one the checkpoint layout knows; choose "
                           f"{' or '.join(ALGORITHMS)} (docs/checkpoint-layout.md)")
    check.new()  # xxh3-128 without the xxhash package: refused now, not at the first snapshot
    return check
