"""A tensor-parallel eval rank's weights: its slice of every parameter, read from whatever layout the
checkpoint was written in, and nothing else.

The rank's network (built by the model factory for this degree and rank) says what the rank holds:
a parameter whose shape equals the checkpoint's whole shape is held whole; one whose shape is the
whole shape with exactly one dimension divided by the degree is this rank's slice along that
dimension (rank r holds the r-th of the degree equal pieces, Megatron's rule). Anything else is an
error naming the parameter, both shapes and the degree. The slices are read through
evald.files.slices: only their byte ranges, from

* a MindFormers Checkpoint 2.0 iteration (its model files' chunks, evald.files.checkpoint2);
* evald's partitioned snapshot (its parts' slices or row ranges, whatever TP degree wrote them);
* a whole evald snapshot (each tensor is one piece).

A foreign ``.ckpt``/``.safetensors`` file is read whole by MindSpore's loader, so it is refused here
with what to use instead. Integrity: offsets, shapes and dtypes come from the manifest or the
metadata and the files' headers, the pieces must tile each wanted slice, and every read must
return its full length; a whole-file digest cannot be checked from part of a file
(docs/performance.md, "Reshard on read").
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np

from evald.contracts import layout
from evald.contracts.partition import parse_group_name, part_dir_name
from evald.files import checkpoint2
from evald.files.confine import confined
from evald.files.errors import CheckpointDeleted, CheckpointError
from evald.files.parts import fit_problem, pieces_of_parts
from evald.files.recognise import CHECKPOINT2, EVALD, PARTS
from evald.files.slices import Piece, plan_reads, read_region, tp_region
from evald.pipeline.swap import name_fit


@dataclass(frozen=True)
class Stored:
    shape: tuple[int, ...]
    dtype: str
    pieces: tuple[Piece, ...]


@dataclass(frozen=True)
class RankRead:
    """What one rank read: its arrays (by network name) and the bytes it read."""

    arrays: dict[str, np.ndarray]
    bytes_read: int


def stored_params(path: Path, kind: str) -> dict[str, Stored]:
    """Every parameter of the checkpoint at ``path``: its whole shape, dtype and stored pieces."""
    path = Path(path)
    if kind == CHECKPOINT2:
        params = checkpoint2.plan(path)
        return {n: Stored(params[n].shape, params[n].dtype, tuple(p))
                for n, p in checkpoint2.stored_pieces(path, params).items()}
    if kind == PARTS:
        step, count = parse_group_name(path.name) or (None, None)
        if step is None or count is None:
            raise CheckpointError(f"{path.name}: not the name of a partitioned step")
        parts = []
        for index in range(count):
            part = path.parent / part_dir_name(step, index, count)
            if not os.path.lexists(part):
                raise CheckpointDeleted(f"{part.name}: deleted before it could be evaluated")
            try:
                with confined(path.parent, part.name, directory=True):
                    parts.append((part, layout.read_manifest(part)))
            except layout.LayoutError as exc:
                raise CheckpointError(str(exc)) from exc
        problem = fit_problem([(p.name, m) for p, m in parts], complete=True)
        if problem:
            raise CheckpointError(f"step {step}: {problem}")
        return {n: Stored(s, d, tuple(p)) for n, (s, d, p) in pieces_of_parts(parts).items()}
    if kind == EVALD:
        try:
            with confined(path.parent, path.name, directory=True):
                manifest = layout.read_manifest(path)
        except layout.LayoutError as exc:
            raise CheckpointError(str(exc)) from exc
        return {n: Stored(s, d, tuple(p)) for n, (s, d, p) in pieces_of_parts([(path, manifest)]).items()}
    raise CheckpointError(f"{path.name}: a {kind} checkpoint is read whole by MindSpore's loader, so a "
                          f"tensor-parallel eval rank cannot read only its slices from it; save evald's layout "
                          f"(EvaldHook/EvaldCallback) or MindFormers' Checkpoint 2.0, or evaluate it on one device")


def cut_dims(stored: Mapping[str, Stored], local: Mapping[str, tuple[int, ...]], degree: int
             ) -> dict[str, int | None]:
    """For each network parameter (``local``: its shape on this rank), the dimension this rank holds
    1/degree of, or None when it holds it whole; CheckpointError naming every parameter that is neither."""
    out, problems = {}, []
    for name, shape in local.items():
        whole = stored[name].shape
        if tuple(shape) == tuple(whole):
            out[name] = None
            continue
        dims = [d for d, (a, b) in enumerate(zip(shape, whole)) if a != b]
        if len(shape) == len(whole) and len(dims) == 1 and shape[dims[0]] * degree == whole[dims[0]]:
            out[name] = dims[0]
        else:
            problems.append(f"{name}: rank holds {list(shape)}, checkpoint {list(whole)}")
    if problems:
        raise CheckpointError(f"these parameters are neither whole nor one dimension cut into {degree} equal "
                              f"slices: {'; '.join(problems[:8])}{' ...' if len(problems) > 8 else ''} (the model "
                              f"factory builds each rank's shard from EVALD_TP_DEGREE / EVALD_TP_RANK)")
    return out


def read_rank(path: Path, kind: str, specs: Mapping[str, tuple], degree: int, rank: int,
              into: Mapping[str, np.ndarray] | None = None) -> RankRead:
    """This rank's slice of every network parameter (``specs``: ``{name: (shape, dtype)}`` of the rank's
    network), by network name; CheckpointError if the checkpoint does not fit the rank's network.
    ``into``: the parameters' live host memory by name (NetworkWeights.destinations): each slice that fits
    is read straight into it, so the rank holds its share once (the caller marks the weights invalid
    first: a failed read leaves a mix)."""
    stored = stored_params(path, kind)
    to_net = name_fit.to_network_names(stored, specs)
    by_net = {to_net[n]: s for n, s in stored.items()}
    missing = sorted(set(specs) - set(by_net))
    unexpected = sorted(n for n in by_net if n not in specs)
    if missing or unexpected:
        raise CheckpointError("checkpoint does not fit the evaluation network: "
                              + "; ".join(f"{what} {names[:8]} ({len(names)})" for what, names in
                                          (("missing parameters", missing), ("unexpected parameters", unexpected))
                                          if names)
                              + f" ({name_fit.explain(stored, specs)})")
    dims = cut_dims(by_net, {n: tuple(s[0]) for n, s in specs.items()}, degree)
    arrays, total = {}, 0
    for name, param in by_net.items():
        want = tp_region(param.shape, dims[name], degree, rank)
        dtype = np.dtype(param.dtype)
        try:
            arrays[name], nbytes = read_region(plan_reads(param.pieces, want, dtype.itemsize), want, dtype,
                                               (into or {}).get(name))
        except FileNotFoundError as exc:
            raise CheckpointDeleted(f"{Path(exc.filename or '').name}: deleted before it could be read") from exc
        total += nbytes
    return RankRead(arrays, total)
