"""Reading a checkpoint's weights into the network, and fitting names to the network's.

evald-layout checkpoints are verified against their manifest (sizes, hash) as they are
read (evald.contracts.layout, evald.hot_swap); foreign files are read with MindSpore's own
loader. Every problem is a CheckpointError whose message is recorded in the ledger.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Mapping

import numpy as np

from evald import name_fit
from evald.checkpoints import FOREIGN_KINDS, PARTS, CheckpointDeleted, CheckpointError, CheckpointUnreadable
from evald.confinement import confined, foreign_limit
from evald.contracts import layout
from evald.file_access import Unreadable, check_readable
from evald.hot_swap import NetworkMismatch, NetworkWeights
from evald.swap_check import PartsRead


def load_into(weights: NetworkWeights, path: Path, kind: str
              ) -> layout.Manifest | dict[str, np.ndarray] | PartsRead:
    """Swap the checkpoint at ``path`` into the network; CheckpointError says what is wrong with it.

    evald-layout: the fit is checked from the manifest before a byte is read, then every file is
    read once, verified as it is read, straight into the parameters' memory where it can be.
    Foreign: MindSpore reads the file; the weights are picked out by name and copied in.
    Parts of a partitioned snapshot (``path`` names them all): evald.assembly.
    Returns what the swap can be checked against (evald.swap_check): the manifest, the parts,
    or the foreign file's weights as MindSpore loaded them.
    """
    if kind == PARTS:
        from evald.assembly import load_parts

        return load_parts(weights, path.parent, path.name)
    if not path.exists():
        raise CheckpointDeleted(f"{path.name}: deleted before it could be evaluated")
    if kind in FOREIGN_KINDS:
        try:
            arrays = load_foreign(path, network_bytes=network_bytes(weights.specs))
        except CheckpointUnreadable as exc:  # readable when found (evald.intake checks), not any more
            raise CheckpointUnreadable(f"{exc}. It could be read when evald found it: fix the permission, "
                                       f"then put the step back in the queue") from exc
        loaded = match_names(arrays, weights.specs, strict=False)
        weights.assign(loaded)
        return loaded
    try:
        with confined(path.parent, path.name, directory=True):  # never read through a link out of the directory
            manifest = layout.read_manifest(path)
            weights.load(path, manifest, strict=True)
        return manifest
    except (layout.LayoutError, NetworkMismatch) as exc:
        if not path.exists():
            raise CheckpointDeleted(f"{path.name}: deleted before it could be evaluated") from exc
        raise CheckpointError(str(exc)) from exc


def load_foreign(path: Path, choice: Callable[[str], bool] | None = None, network_bytes: int | None = None
                 ) -> dict[str, np.ndarray]:
    """A foreign file read by MindSpore: only a regular file of the directory (no link, FIFO, device),
    of a sane size (evald.confinement.foreign_limit), and still the same file after the read."""
    import mindspore as ms

    fmt = "safetensors" if path.suffix == ".safetensors" else "ckpt"
    try:  # before MindSpore, whose message for it ("May not have permission") ends in "corrupt" here
        check_readable(path)
    except Unreadable as exc:
        raise CheckpointUnreadable(str(exc)) from exc
    with confined(path.parent, path.name, directory=False, limit=foreign_limit(network_bytes)):
        try:
            params = ms.load_checkpoint(str(path), format=fmt, choice_func=choice)
        except (ValueError, RuntimeError, OSError) as exc:
            raise CheckpointError(f"{path.name}: MindSpore cannot read it ({str(exc).splitlines()[0][:300]}); "
                                  f"truncated, empty or corrupt") from exc
        return {name: p.asnumpy() for name, p in params.items() if hasattr(p, "asnumpy")}  # not str entries


def network_bytes(specs: Mapping[str, tuple]) -> int:
    """Bytes of the network's weights (``{name: (shape, numpy dtype or None)}``; None counts 4 a value)."""
    return sum(int(np.prod(shape, dtype=np.int64)) * (dtype.itemsize if dtype is not None else 4)
               for shape, dtype in specs.values())


def match_names(weights: Mapping[str, np.ndarray], expected: Mapping[str, tuple], *, strict: bool
                ) -> dict[str, np.ndarray]:
    """Map checkpoint entries onto the network's parameter names, or raise naming every problem.

    ``expected`` is ``{name: (shape, dtype)}``. Names match exactly or through a prefix
    common to every name on one side (evald.name_fit): the checkpoint's (``model.w``
    under a train cell; never an optimizer moment such as ``adam_m.model.w``) or the
    network's (``net.w`` when the model factory wraps the model). With ``strict``
    (evald layout) every entry must match; otherwise (foreign files, which hold
    optimizer state too) the others are dropped.
    """
    # Optimizer state is saved as "<state>.<weight name>" ("adam_m.model.w", "adam_v.model.w"), so
    # "model.w", "adam_m.model.w" and "adam_v.model.w" all end with ".w"; picking per entry let the
    # Adam second moments overwrite the real weight. name_fit picks ONE pair of prefixes for all names.
    chosen = name_fit.fit(weights, expected).mapping
    matched = {target: weights[name] for name, target in chosen.items()}
    unexpected = sorted(set(weights) - set(chosen))
    missing = sorted(set(expected) - set(matched))
    mismatched = [f"{n}: checkpoint {tuple(a.shape)} vs network {tuple(expected[n][0])}"
                  for n, a in matched.items() if tuple(a.shape) != tuple(expected[n][0])]
    problems = []
    if missing:
        problems.append(f"missing parameters {_few(missing)}")
    if strict and unexpected:
        problems.append(f"unexpected parameters {_few(unexpected)}")
    if mismatched:
        problems.append(f"shape mismatch {_few(mismatched)}")
    if problems:
        raise CheckpointError("checkpoint does not fit the evaluation network: " + "; ".join(problems)
                              + f" ({name_fit.explain(weights, expected)})")
    return matched


def _few(items: list[str], limit: int = 8) -> str:
    shown = ", ".join(items[:limit])
    return f"[{shown}{', …' if len(items) > limit else ''}] ({len(items)})"
