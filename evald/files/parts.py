"""A step from the parts of a partitioned snapshot: wait for every part, and check that they fit together.

A partitioned snapshot (evald.contracts.partition) is N part directories, each
committed on its own. The step counts as committed only when all N are and
together they hold every parameter exactly once: no gap, no overlap, slices
tiling each full shape (the evaluation network's own parameter list is checked
when the step is loaded, evald.pipeline.swap.weights). Parts from different runs, or that
disagree on how many parts make the step, are an error at once. A step whose
parts stay incomplete for ``timeout_s`` is recorded as incomplete, naming the
missing parts and their ranks; it is never evaluated half-built.

``PartGroups`` is what the intake uses (in memory: after a restart the rescan finds
the parts again and the wait starts over; a part already in the ledger is not
read again). ``fit_problem`` is the one check that the parts make up a step; the
pipeline (evald.pipeline.swap.weights.load_parts) runs it again when it reads them.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from dataclasses import dataclass, field
from typing import Sequence

from evald.contracts import layout
from evald.contracts.partition import group_name, tiling_problem
from evald.files.recognise import PARTS, Found
from evald.files.slices import Piece

INCOMPLETE = "incomplete"   # the first word of the reason an incomplete step is recorded with


@dataclass(frozen=True)
class Assembled:
    """Every part arrived and they fit: the step is read from ``found`` (kind PARTS)."""

    found: Found
    members: tuple[str, ...]


@dataclass(frozen=True)
class Unusable:
    """The step cannot be read from these parts: ``reason`` says why (``incomplete`` for a timeout)."""

    step: int
    reason: str
    source: str                     # the name the ledger gives the step (partition.group_name)
    members: tuple[str, ...]
    found_via: str
    run_id: str | None = None
    commit_time: float | None = None


@dataclass
class _Waiting:
    since: float                                   # time.monotonic() of the first part
    found_via: str
    parts: dict[str, Found] = field(default_factory=dict)


class PartGroups:
    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._waiting: dict[int, _Waiting] = {}

    @property
    def waiting(self) -> bool:
        return bool(self._waiting)

    def is_waiting(self, step: int) -> bool:
        return step in self._waiting

    def add(self, part: Found, found_via: str, run_id: str | None = None,
            now: float | None = None) -> Assembled | Unusable | None:
        """One part found; the step once it is complete (or cannot be), else None."""
        group = self._waiting.setdefault(part.step, _Waiting(now or time.monotonic(), found_via))
        group.parts[part.name] = part
        manifests = [(f.name, f.manifest) for f in group.parts.values()]
        problem = fit_problem(manifests, run_id, complete=False)
        count = part.manifest.parts.count  # type: ignore[union-attr]
        if problem is None and len(group.parts) == count:
            problem = fit_problem(manifests, run_id, complete=True)
            if problem is None:
                del self._waiting[part.step]
                newest = max((f.commit_time or 0.0) for f in group.parts.values())
                found = Found(group_name(part.step, count), part.step, PARTS, part.run_id, newest or None)
                return Assembled(found, tuple(sorted(group.parts)))
        if problem is None:
            return None
        return self._give_up(part.step, problem)

    def expired(self, now: float | None = None) -> list[Unusable]:
        """Steps whose parts have waited ``timeout_s`` without completing: recorded as incomplete."""
        now = now or time.monotonic()
        out = []
        for step, group in sorted(self._waiting.items()):
            if now - group.since < self.timeout_s:
                continue
            info = next(iter(group.parts.values())).manifest.parts  # type: ignore[union-attr]
            present = {f.manifest.parts.index for f in group.parts.values()}  # type: ignore[union-attr]
            missing = [i for i in range(info.count) if i not in present]
            out.append(self._give_up(step, (
                f"{INCOMPLETE}: {len(present)} of the {info.count} parts of step {step} were committed within "
                f"{self.timeout_s:g}s; missing part{'s' if len(missing) > 1 else ''} "
                f"{', '.join(map(str, missing))} (rank{'s' if len(missing) > 1 else ''} "
                f"{', '.join(str(info.ranks[i]) for i in missing)}); the step is not evaluated half-built")))
        return out

    def _give_up(self, step: int, reason: str) -> Unusable:
        group = self._waiting.pop(step)
        first = min(group.parts.values(), key=lambda f: f.name)
        source = group_name(step, first.manifest.parts.count)  # type: ignore[union-attr]
        return Unusable(step, reason, source, tuple(sorted(group.parts)), group.found_via, first.run_id,
                        max((f.commit_time or 0.0) for f in group.parts.values()) or None)


def fit_problem(parts: Sequence[tuple[str, layout.Manifest]], run_id: str | None = None, *,
                complete: bool) -> str | None:
    """Why these parts of one step cannot make it up (``complete``: they should be all of them), or None."""
    runs = Counter(m.run_id for _, m in parts)
    if len(runs) > 1:
        usual = run_id if run_id in runs else runs.most_common(1)[0][0]
        odd = [f"{name} (rank {m.parts.rank}) is from run {m.run_id!r}" for name, m in parts  # type: ignore[union-attr]
               if m.run_id != usual]
        return f"parts from another run: {'; '.join(odd)}, the other parts from run {usual!r}"
    shapes = {(m.parts.count, m.parts.ranks) for _, m in parts}  # type: ignore[union-attr]
    if len(shapes) > 1:
        return (f"the parts disagree on how the step was split (part count and writer ranks: "
                f"{sorted((c, list(r)) for c, r in shapes)})")
    if not complete:
        return None
    pieces: dict[str, list] = {}
    for name, m in parts:
        for p in m.params:
            pieces.setdefault(p.name, []).append((name, p))
    for param, held in pieces.items():
        if len({p.dtype for _, p in held}) > 1:
            return f"{param!r} has different dtypes in different parts ({', '.join(n for n, _ in held)})"
        problem = tiling_problem(param, [(n, p.sliced, p.shape) for n, p in held])
        if problem is None and any(p.sliced is not None and p.sliced.layout is None and
                                   p.sliced.region[1:] != tuple((0, d) for d in p.sliced.global_shape[1:])
                                   for _, p in held):
            problem = f"{param!r}: a slice without a layout may only cut the first dimension"
        if problem:
            return problem
    return None


def pieces_of_parts(parts: Sequence[tuple[Path, layout.Manifest]]
                    ) -> dict[str, tuple[tuple[int, ...], str, list[Piece]]]:
    """Every parameter of a step's parts (checked by ``fit_problem``): its full shape, dtype and the
    stored pieces (file, byte offset, region), for a tensor-parallel rank's reads (evald.files.slices).
    Each piece's file is opened with no link followed below the directory holding the parts, and must have
    the size its manifest declares."""
    out: dict[str, tuple[tuple[int, ...], str, list[Piece]]] = {}
    for part_dir, manifest in parts:
        sizes = {f.name: f.bytes for f in manifest.files}   # every file a param names is listed (manifest.py)
        for p in manifest.params:
            if p.offset is None:
                raise ValueError(f"{part_dir.name}: {p.name!r} has no byte offset in its manifest")
            full = p.sliced.global_shape if p.sliced is not None else p.shape
            region = p.sliced.region if p.sliced is not None else tuple((0, d) for d in p.shape)
            piece = Piece(Path(part_dir) / p.file, p.offset, region, Path(part_dir).parent, sizes[p.file])
            out.setdefault(p.name, (tuple(full), p.dtype, []))[2].append(piece)
    return out
