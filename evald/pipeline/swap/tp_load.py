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
with what to use instead.

Integrity: a tensor-parallel group refuses exactly what one device refuses. One device reads every
weights file of evald's layout whole and checks it against its manifest's digest; a rank reads only the
byte ranges of its slices, so the group shares that check out: every rank computes the same list of the
checkpoint's weights files and the same assignment of them to ranks (``verify_share``, balanced by bytes),
and rank r streams the files assigned to it through the same check one device makes
(evald.contracts.safetensors_io.verify_file: size, header, digest, in one bounded buffer), besides reading
its slices. Every file is verified once by the group, whichever rank holds which slices, and a bad one is a
CheckpointFileBad with one device's reason, which the group records as failed whichever rank found it
(evald.pipeline.group.evaluator). The files a rank reads slices from are opened under the one rule (no
link, FIFO or device; the manifest's size) as one device opens them. A rank alone (``verify_share``
(0, 1), the default) verifies every file. MindFormers' Checkpoint 2.0 has no digest: one device and every
rank check the same headers and metadata (evald.files.checkpoint2) and nothing more.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from evald.contracts import layout, parallel_io
from evald.contracts import safetensors_io as sio
from evald.contracts.partition import parse_group_name, part_dir_name
from evald.files import checkpoint2
from evald.files.confine import confined
from evald.files.errors import CheckpointDeleted, CheckpointError, CheckpointFileBad
from evald.files.parts import fit_problem, pieces_of_parts
from evald.files.recognise import CHECKPOINT2, EVALD, PARTS
from evald.files.slices import Piece, plan_reads, read_region, tp_region
from evald.pipeline.swap import dtypes, name_fit


@dataclass(frozen=True)
class Stored:
    shape: tuple[int, ...]
    dtype: str
    pieces: tuple[Piece, ...]


@dataclass(frozen=True)
class RankRead:
    """What one rank read: its arrays (by network name), the bytes it read for its slices, and the bytes of
    the weights files it verified (its share of the group's whole-file checks)."""

    arrays: dict[str, np.ndarray]
    bytes_read: int
    bytes_verified: int = 0
    files_verified: tuple[str, ...] = ()


@dataclass(frozen=True)
class StoredCheckpoint:
    """A checkpoint as a tensor-parallel rank reads it: every parameter's pieces, and every weights file
    with a digest to verify (safetensors_io.verify_file's arguments, layout.file_jobs; none for Checkpoint
    2.0, which has no digest)."""

    params: dict[str, Stored]
    files: tuple[Mapping[str, Any], ...] = ()


def verify_share(files: Sequence[Mapping[str, Any]], index: int, count: int) -> list[Mapping[str, Any]]:
    """The files rank ``index`` of ``count`` verifies: every rank computes the same assignment from the same
    list, and each file goes to exactly one rank. Largest first, each to the rank with the fewest bytes so
    far (the lowest rank on a tie), so the ranks hash about the same number of bytes even when files differ
    in size or are fewer than the ranks (then some ranks verify none)."""
    if not 0 <= index < count:
        raise ValueError(f"rank {index} is not one of {count}")
    load = [0] * count
    mine = []
    for job in sorted(files, key=lambda j: (-int(j["nbytes"]), str(j["path"]))):
        rank = min(range(count), key=lambda r: (load[r], r))
        load[rank] += int(job["nbytes"])
        if rank == index:
            mine.append(job)
    return mine


def stored_params(path: Path, kind: str) -> dict[str, Stored]:
    """Every parameter of the checkpoint at ``path``: its whole shape, dtype and stored pieces."""
    return stored_checkpoint(path, kind).params


def stored_checkpoint(path: Path, kind: str) -> StoredCheckpoint:
    """Every parameter of the checkpoint at ``path`` (its whole shape, dtype and stored pieces, each file
    opened with no link followed below ``path``'s directory) and every weights file to verify."""
    path = Path(path)
    if kind == CHECKPOINT2:
        params = checkpoint2.plan(path)
        return StoredCheckpoint({n: Stored(params[n].shape, params[n].dtype,
                                           tuple(dataclasses.replace(piece, root=path.parent) for piece in p))
                                 for n, p in checkpoint2.stored_pieces(path, params).items()})
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
        return _of_evald_layout(parts)
    if kind == EVALD:
        try:
            with confined(path.parent, path.name, directory=True):
                manifest = layout.read_manifest(path)
        except layout.LayoutError as exc:
            raise CheckpointError(str(exc)) from exc
        return _of_evald_layout([(path, manifest)])
    raise CheckpointError(f"{path.name}: a {kind} checkpoint is read whole by MindSpore's loader, so a "
                          f"tensor-parallel eval rank cannot read only its slices from it; save evald's layout "
                          f"(EvaldHook/EvaldCallback) or MindFormers' Checkpoint 2.0, or evaluate it on one device")


def _of_evald_layout(parts: Sequence[tuple[Path, layout.Manifest]]) -> StoredCheckpoint:
    try:
        files = tuple(job for part, manifest in parts for job in layout.file_jobs(part, manifest))
    except layout.LayoutError as exc:  # a file's declared size is not its tensors' (one device says the same)
        raise CheckpointError(str(exc)) from exc
    return StoredCheckpoint({n: Stored(s, d, tuple(p)) for n, (s, d, p) in pieces_of_parts(parts).items()}, files)


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
              into: Mapping[str, np.ndarray] | None = None, *, share: tuple[int, int] = (0, 1)) -> RankRead:
    """This rank's slice of every network parameter (``specs``: ``{name: (shape, dtype)}`` of the rank's
    network), by network name; CheckpointError if the checkpoint does not fit the rank's network or a file
    is bad (CheckpointFileBad). ``into``: the parameters' live host memory by name
    (NetworkWeights.destinations): each slice that fits is read straight into it, so the rank holds its share
    once (the caller marks the weights invalid first: a failed read leaves a mix). ``share``: (index, count)
    of the weights files this rank verifies (``verify_share``); a rank of a group passes (its rank, the
    group's size) and the ranks together verify every file once; the default, (0, 1), verifies them all."""
    stored = stored_checkpoint(path, kind)
    to_net = name_fit.to_network_names(stored.params, specs)
    by_net = {to_net[n]: s for n, s in stored.params.items()}
    missing = sorted(set(specs) - set(by_net))
    unexpected = sorted(n for n in by_net if n not in specs)
    if missing or unexpected:
        raise CheckpointError("checkpoint does not fit the evaluation network: "
                              + "; ".join(f"{what} {names[:8]} ({len(names)})" for what, names in
                                          (("missing parameters", missing), ("unexpected parameters", unexpected))
                                          if names)
                              + f" ({name_fit.explain(stored.params, specs)})")
    dims = cut_dims(by_net, {n: tuple(s[0]) for n, s in specs.items()}, degree)
    kinds = dtypes.refusal({n: (by_net[n].dtype, spec[1]) for n, spec in specs.items()})
    if kinds:   # before a byte is read: evald.pipeline.swap.dtypes, the rule of every loader
        raise CheckpointError(f"checkpoint does not fit the evaluation network: {kinds}")
    mine = verify_share(stored.files, *share)
    verified = _verify(mine)
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
    return RankRead(arrays, total, verified, tuple(str(job["path"]) for job in mine))


def _verify(files: Sequence[Mapping[str, Any]]) -> int:
    """Verify ``files`` as one device does (size, header, digest), streamed; the bytes verified."""
    try:
        return parallel_io.verify_files(files)
    except sio.WeightsFileMissing as exc:
        raise CheckpointDeleted(f"{exc.path.name}: deleted before it could be read") from exc
    except sio.WeightsFileError as exc:
        raise CheckpointFileBad(str(exc)) from exc
