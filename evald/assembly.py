"""A step from the parts of a partitioned snapshot: wait for every part, check they fit, load them.

A partitioned snapshot (evald.contracts.partition) is N part directories, each
committed on its own. The step counts as committed only when all N are and
together they hold every parameter exactly once: no gap, no overlap, slices
tiling each full shape (the evaluation network's own parameter list is checked
when the step is loaded, evald.weights). Parts from different runs, or that
disagree on how many parts make the step, are an error at once. A step whose
parts stay incomplete for ``timeout_s`` is recorded as incomplete, naming the
missing parts and their ranks; it is never evaluated half-built.

``PartGroups`` is the intake side (in memory: after a restart the rescan finds
the parts again and the wait starts over; a part already in the ledger is not
read again). ``load_parts`` is the pipeline side: it reads the parts again,
checks them again, and reads each file once, straight into the parameters'
memory where it can (evald.hot_swap); tensor-parallel slices are merged with
MindSpore's own tools (evald.slice_merge).
"""

from __future__ import annotations

import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from evald.checkpoints import PARTS, CheckpointDeleted, CheckpointError, Found
from evald.contracts import layout
from evald.contracts.partition import group_name, parse_group_name, part_dir_name, tiling_problem
from evald.confinement import confined
from evald.hot_swap import NetworkMismatch, NetworkWeights
from evald.swap_check import PartsRead

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


# ---------------------------------------------------------------- loading


def load_parts(weights: NetworkWeights, ckpt_dir: Path, group: str) -> PartsRead:
    """Swap in the step the parts named by ``group`` make up; CheckpointError says what is wrong.
    Returns the parts it read, for the swap check (evald.swap_check)."""
    step, count = parse_group_name(group) or (None, None)
    if step is None or count is None:
        raise CheckpointError(f"{group}: not the name of a partitioned step")
    parts = []
    for index in range(count):
        path = Path(ckpt_dir) / part_dir_name(step, index, count)
        if not os.path.lexists(path):
            raise CheckpointDeleted(f"{path.name}: deleted before it could be evaluated")
        try:
            with confined(Path(ckpt_dir), path.name, directory=True):  # no link out of the directory
                parts.append((path, layout.read_manifest(path)))
        except layout.LayoutError as exc:
            raise CheckpointError(str(exc)) from exc
    problem = fit_problem([(p.name, m) for p, m in parts], complete=True)
    if problem:
        raise CheckpointError(f"step {step}: {problem}")
    specs = {p.name: (p.sliced.global_shape if p.sliced else p.shape, np.dtype(p.dtype))
             for _, m in parts for p in m.params}
    try:
        weights.check_fit(specs, complete=True, strict=True)
    except NetworkMismatch as exc:
        raise CheckpointError(f"the {count} parts of step {step} do not make up the evaluation network: "
                              f"{str(exc).split(': ', 1)[1]}") from exc
    views = weights.destinations() or {}
    weights.valid = False
    rest: dict[str, np.ndarray] = {}
    sliced: dict[str, list] = {}
    for path, manifest in parts:
        into = {}
        for p in manifest.params:
            view = views.get(p.name)
            if view is None or view.dtype != np.dtype(p.dtype):
                continue
            if p.sliced is None:
                into[p.name] = view
            elif p.sliced.layout is None:   # rows of the parameter: read straight into them
                into[p.name] = view[p.sliced.region[0][0]:p.sliced.region[0][1]]
        try:
            with confined(Path(ckpt_dir), path.name, directory=True):
                arrays = layout.read_checkpoint(path, manifest, into=into)
        except layout.LayoutError as exc:
            raise (CheckpointDeleted(str(exc)) if not path.exists() else CheckpointError(str(exc))) from exc
        for p in manifest.params:
            if p.name in into:
                continue
            if p.sliced is None:
                rest[p.name] = arrays[p.name]
            else:
                sliced.setdefault(p.name, []).append((p.sliced, arrays[p.name]))
    if sliced:
        from evald.slice_merge import merge_slices

        rest.update(merge_slices(sliced))
    weights.assign(rest)
    weights.valid = True
    return PartsRead(tuple(parts))
