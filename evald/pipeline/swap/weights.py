"""Reading a checkpoint's weights into the network, and fitting names to the network's.

evald-layout checkpoints are verified against their manifest (sizes, hash) as they are
read (evald.contracts.layout, evald.pipeline.swap.hot_swap); foreign files are read with MindSpore's own
loader. Every problem is a CheckpointError whose message is recorded in the ledger.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Mapping

import numpy as np

from evald.contracts import layout
from evald.contracts.partition import parse_group_name, part_dir_name
from evald.files.confine import confined
from evald.files.errors import CheckpointDeleted, CheckpointError, CheckpointUnreadable
from evald.files.foreign import load_foreign
from evald.files.parts import fit_problem
from evald.files import checkpoint2
from evald.files.recognise import CHECKPOINT2, FOREIGN_KINDS, FOREIGN_WEIGHTS, PARTS
from evald.pipeline.swap import dtypes, name_fit
from evald.pipeline.swap import training_state
from evald.pipeline.swap.hot_swap import NetworkMismatch, NetworkWeights
from evald.pipeline.swap.slice_merge import merge_slices
from evald.pipeline.swap.swap_check import PartsRead

_RANK_DIR = re.compile(r"rank_[0-9]{1,6}")


def load_into(weights: NetworkWeights, path: Path, kind: str
              ) -> layout.Manifest | dict[str, np.ndarray] | PartsRead:
    """Swap the checkpoint at ``path`` into the network; CheckpointError says what is wrong with it.

    evald-layout: the fit is checked from the manifest before a byte is read, then every file is
    read once, verified as it is read, straight into the parameters' memory where it can be.
    Foreign: MindSpore reads the file; the weights are picked out by name and copied in.
    Parts of a partitioned snapshot (``path`` names them all): ``load_parts``.
    A MindFormers Checkpoint 2.0 iteration: ``load_checkpoint2`` (its model files only).
    Returns what the swap can be checked against (evald.pipeline.swap.swap_check): the manifest, the parts,
    or the foreign file's weights as MindSpore loaded them.
    """
    if kind == PARTS:
        return load_parts(weights, path.parent, path.name)
    if not path.exists():
        raise CheckpointDeleted(f"{path.name}: deleted before it could be evaluated")
    if kind == CHECKPOINT2:
        return load_checkpoint2(weights, path)
    if kind in FOREIGN_KINDS:
        try:
            arrays = load_foreign(path, network_bytes=network_bytes(weights.specs))
        except CheckpointUnreadable as exc:  # readable when found (evald.intake.intake checks), not any more
            raise CheckpointUnreadable(f"{exc}. It could be read when evald found it: fix the permission, "
                                       f"then put the step back in the queue") from exc
        # A weights-only file (MindFormers' checkpoint_network/) holds no optimizer state: nothing may be left out.
        try:
            loaded = match_names(arrays, weights.specs, strict=kind == FOREIGN_WEIGHTS)
        except CheckpointError as exc:
            ranks = model_parallel_ranks(path)
            if ranks:
                raise CheckpointError(model_parallel_message(path, ranks, str(exc))) from exc
            raise
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


def model_parallel_ranks(path: Path) -> list[str]:
    """The ``rank_N`` directories beside the one holding ``path`` when there are several (a legacy
    per-rank save of a parallel job), else []."""
    rank_dir = Path(path).parent
    if not _RANK_DIR.fullmatch(rank_dir.name):
        return []
    try:
        ranks = sorted((e.name for e in os.scandir(rank_dir.parent) if e.is_dir() and _RANK_DIR.fullmatch(e.name)),
                       key=lambda n: int(n[5:]))
    except OSError:
        return []
    return ranks if len(ranks) > 1 else []


def model_parallel_message(path: Path, ranks: list[str], problem: str) -> str:
    """What a legacy per-rank file of a model-parallel job lacks, and MindSpore's documented way through."""
    shown = f"{path.parent.parent.name}/{path.parent.name}/{path.name}"
    return (f"{shown}: {problem}. The job saved per rank ({', '.join(ranks[:4])}{', ...' if len(ranks) > 4 else ''}: "
            f"{len(ranks)} ranks), and {path.parent.name} holds only its shard of a model-parallel (tensor or "
            f"pipeline parallel) job. What is missing is the strategy file that says how the shards fit together "
            f"(the training's strategy_ckpt_save_file, ./ckpt_strategy.ckpt by default; "
            f"MindFormers: output/strategy/ckpt_strategy_rank_0.ckpt; merge several with "
            f"mindspore.parallel.merge_pipeline_strategys): evald does not merge shards without it. Merge them "
            f"into whole weights with MindSpore's own tools and serve the result: "
            f"mindspore.parallel.convert_checkpoints('{path.parent.parent.name}', 'merged', 'model', "
            f"src_strategy_file='ckpt_strategy.ckpt') for .ckpt files, or "
            f"mindspore.parallel.unified_safetensors('{path.parent.parent.name}', 'ckpt_strategy.ckpt', 'merged') "
            f"for .safetensors (docs/mindformers.md, 'Model-parallel checkpoints'); or save MindFormers' "
            f"Checkpoint 2.0 (iteration_*/ with metadata.json), which evald reads as it is")


def network_bytes(specs: Mapping[str, tuple]) -> int:
    """Bytes of the network's weights (``{name: (shape, numpy dtype or None)}``; None counts 4 a value)."""
    return sum(int(np.prod(shape, dtype=np.int64)) * (dtype.itemsize if dtype is not None else 4)
               for shape, dtype in specs.values())


def match_names(weights: Mapping[str, np.ndarray], expected: Mapping[str, tuple], *, strict: bool
                ) -> dict[str, np.ndarray]:
    """Map checkpoint entries onto the network's parameter names, or raise naming every problem.

    ``expected`` is ``{name: (shape, dtype)}``. Names match exactly or through a prefix
    common to every name on one side (evald.pipeline.swap.name_fit): the checkpoint's (``model.w``
    under a train cell; never an optimizer moment such as ``adam_m.model.w``) or the
    network's (``net.w`` when the model factory wraps the model). With ``strict``
    (evald layout, a weights-only foreign file) every entry must match; otherwise (a full
    foreign checkpoint) the entries that are recognisably optimizer or loss-scale state
    (evald.pipeline.swap.training_state) are dropped, and any other entry not in the network fails.
    """
    # Optimizer state is saved as "<state>.<weight name>" ("adam_m.model.w", "adam_v.model.w"), so
    # "model.w", "adam_m.model.w" and "adam_v.model.w" all end with ".w"; picking per entry let the
    # Adam second moments overwrite the real weight. name_fit picks ONE pair of prefixes for all names.
    fitted = name_fit.fit(weights, expected)
    chosen = fitted.mapping
    matched = {target: weights[name] for name, target in chosen.items()}
    unexpected = sorted(set(weights) - set(chosen))
    if not strict:
        # A moment names its weight as the optimizer saw it: with or without the train cell's prefix.
        weight_names = {*weights, *(n[len(fitted.strip):] for n in weights if n.startswith(fitted.strip)), *expected}
        unexpected = [n for n in unexpected if not training_state.is_training_state(n, weight_names)]
    missing = sorted(set(expected) - set(matched))
    mismatched = [f"{n}: checkpoint {tuple(a.shape)} vs network {tuple(expected[n][0])}"
                  for n, a in matched.items() if tuple(a.shape) != tuple(expected[n][0])]
    problems = []
    if missing:
        problems.append(f"missing parameters {_few(missing)}")
    if unexpected:
        problems.append(f"unexpected parameters {_few(unexpected)}"
                        + ("" if strict else f": {training_state.rule()}"))
    if mismatched:
        problems.append(f"shape mismatch {_few(mismatched)}")
    hint = f" ({name_fit.explain(weights, expected)})" if problems else ""
    kinds = dtypes.refusal({n: (getattr(a, "dtype", None), expected[n][1]) for n, a in matched.items()})
    if kinds:   # evald.pipeline.swap.dtypes: the one rule of every loader
        problems.append(kinds)
    if problems:
        raise CheckpointError("checkpoint does not fit the evaluation network: " + "; ".join(problems) + hint)
    return matched


def _few(items: list[str], limit: int = 8) -> str:
    shown = ", ".join(items[:limit])
    return f"[{shown}{', …' if len(items) > limit else ''}] ({len(items)})"


def load_checkpoint2(weights: NetworkWeights, iter_dir: Path) -> dict[str, np.ndarray]:
    """Swap in a Checkpoint 2.0 iteration: every model parameter assembled from the byte ranges of its
    shards through ``metadata.json`` (evald.files.checkpoint2), never an optimizer file. Every parameter
    of the network must be there and every model parameter must fit it (strict, like a weights-only
    file). Returns the arrays read, for the swap check."""
    try:
        params = checkpoint2.plan(iter_dir)
        match_names({n: _Shape(p.shape, p.dtype) for n, p in params.items()}, weights.specs, strict=True)  # before a byte
        arrays = checkpoint2.read_whole(iter_dir, params)
    except FileNotFoundError as exc:
        raise CheckpointDeleted(f"{iter_dir.name}: deleted before it could be evaluated") from exc
    loaded = match_names(arrays, weights.specs, strict=True)
    weights.valid = False
    weights.assign(loaded)
    weights.valid = True
    return loaded


class _Shape:
    """Stands for an array in a fit check made before any byte is read: a shape and dtype, no data."""

    def __init__(self, shape: tuple[int, ...], dtype: str) -> None:
        self.shape, self.dtype = tuple(shape), dtype


def load_parts(weights: NetworkWeights, ckpt_dir: Path, group: str) -> PartsRead:
    """Swap in the step the parts named by ``group`` make up; CheckpointError says what is wrong.
    Returns the parts it read, for the swap check (evald.pipeline.swap.swap_check)."""
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
    to_net = name_fit.to_network_names(specs, weights.specs)   # a wrapper's "net." as for a whole snapshot
    try:
        weights.check_fit({to_net[n]: s for n, s in specs.items()}, complete=True, strict=True)
    except NetworkMismatch as exc:
        raise CheckpointError(f"the {count} parts of step {step} do not make up the evaluation network: "
                              f"{str(exc).split(': ', 1)[1]}") from exc
    live = weights.destinations() or {}
    views = {n: live[to_net[n]] for n in specs if to_net[n] in live}   # by checkpoint name
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
                rest[to_net[p.name]] = arrays[p.name]
            else:
                sliced.setdefault(to_net[p.name], []).append((p.sliced, arrays[p.name]))
    if sliced:
        rest.update(merge_slices(sliced))
    weights.assign(rest)
    weights.valid = True
    return PartsRead(tuple(parts))
