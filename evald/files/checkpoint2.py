"""MindFormers' Checkpoint 2.0: which ``iteration_XXXXXXXX/`` directories are committed, and reading
their model shards (never the optimizer's) into whole tensors.

MindFormers 2.0's ``save_checkpoint`` (``mindformers/checkpoint/checkpoint.py``, 2.0.0) writes, under
its checkpoint directory (``OUTPUT/checkpoint`` by default)::

    iteration_00000020/
        <prefix>-model-<rank:07d>-<world:07d>.safetensors    each rank's model shards, under the
                                                              parameters' own names
        <prefix>-opt-<rank:07d>-<world:07d>.safetensors      the optimizer's (never read by evald)
        common.json          {epoch_num, step_num, global_step, loss_scale, global_batch_size, ckpt_status}
        metadata.json        world > 1 only: {"state_dict_metadata": {param: {properties: {dtype, ...},
                             global_shape, axis_fragmentations, layout, chunk: [{global_offset,
                             local_shape}]}}, "storage_data": {"('param', (offset...))": [{file_name,
                             storage_rank, rank_group}]}}
    latest_checkpointed_iteration.txt                         the newest complete iteration

It creates the iteration directory first (removing an old one of the same number), writes the
shards, ``common.json`` and ``metadata.json``, waits for every rank (``barrier_world``), and only then
does rank 0 write the tracker file: MindFormers' own loader (``get_checkpoint_path``) trusts an
iteration through that file. So evald counts ``iteration_K`` as committed when the tracker names an
iteration >= K (MindFormers writes iterations in increasing order; it removes a directory before
writing it again) and the directory holds ``common.json`` and every model file ``metadata.json``
names. An iteration above the tracker is being written (or its save died): never read. MindFormers
writes the tracker with a plain ``open(..., "w")``, so an empty or partial tracker means "not yet".
``ckpt_status`` 1 (MindFormers' health monitor: ABNORMAL) rejects the iteration.

Without ``metadata.json`` (a single-card save; MindFormers' loader does the same, in
``generate_default_metadata_from_checkpoint``) every tensor of every model file is a whole parameter.

The step is the iteration number (MindFormers names the directory after ``step_num``). MindFormers
writes no digest: each shard's bytes are checked against its file's header (dtype, shape, offsets
inside the file, the data exactly filling it) and the metadata (dtype, local shape), and the chunks
of every parameter must tile its global shape, no gap, no overlap. Only the byte ranges a reader
needs are touched (``os.pread``, evald.files.slices): whole tensors for one device, or a
tensor-parallel rank's slices (``read_slices``). Imports evald.files, evald.contracts and numpy.
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from evald.contracts.partition import GAP, IRREGULAR, MAX_GRID_CELLS, OUTSIDE, OVERLAP, untiled
from evald.files import slices
from evald.files.access import Unreadable, check_readable
from evald.files.errors import CheckpointError, CheckpointUnreadable

TRACKER = "latest_checkpointed_iteration.txt"
COMMON, METADATA = "common.json", "metadata.json"
ABNORMAL = 1                      # mindformers.checkpoint.utils.CkptHealthStatus.ABNORMAL
MAX_JSON_BYTES = 256 << 20        # metadata.json of a large model is megabytes, never this
MAX_HEADER_BYTES = 100 << 20      # the safetensors reference implementation's limit
_ITERATION = re.compile(r"iteration_(?P<n>[0-9]{1,15})")
_MODEL_FILE = re.compile(r"(?:.+-)?model-[0-9]{7}-[0-9]{7}\.safetensors")
_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
           "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool"}


def iteration_of(name: str) -> int | None:
    """The iteration of a directory named ``iteration_XXXXXXXX``, else None."""
    match = _ITERATION.fullmatch(name)
    return int(match["n"]) if match else None


def is_model_file(name: str) -> bool:
    """``<prefix>-model-<rank>-<world>.safetensors``: model shards (``-opt-`` files are the optimizer's)."""
    return bool(_MODEL_FILE.fullmatch(name))


def tracked_iteration(checkpoint_dir: Path) -> int | None:
    """The iteration ``latest_checkpointed_iteration.txt`` names; None while it is absent or being written.
    CheckpointUnreadable if evald's user may not read it."""
    path = Path(checkpoint_dir) / TRACKER
    try:
        check_readable(path, f"{Path(checkpoint_dir).name}/{TRACKER}")
        with open(path, "rb") as f:
            text = f.read(64).strip()
    except FileNotFoundError:
        return None
    except Unreadable as exc:
        raise CheckpointUnreadable(str(exc)) from exc
    return int(text) if text.isdigit() else None


@dataclass(frozen=True)
class Chunk:
    """One stored piece of a parameter: where it sits in the whole tensor and which file holds it."""

    offset: tuple[int, ...]
    shape: tuple[int, ...]
    file: str


@dataclass(frozen=True)
class Param:
    shape: tuple[int, ...]           # the whole tensor's
    dtype: str                       # numpy name
    chunks: tuple[Chunk, ...]


def committed(iter_dir: Path) -> int | str | None:
    """The step of a committed iteration directory; a reason it never will be evaluated; or None (not yet).

    CheckpointUnreadable when a file evald must read to judge it is not readable by evald's user.
    """
    iter_dir = Path(iter_dir)
    step = iteration_of(iter_dir.name)
    if step is None:
        return None
    tracked = tracked_iteration(iter_dir.parent)
    if tracked is None or step > tracked:
        return None  # being written, or its save never finished: MindFormers does not trust it either
    try:
        common = _json(iter_dir / COMMON)
    except FileNotFoundError:
        return (f"{iter_dir.name}: no {COMMON}, although {TRACKER} says iteration {tracked} is complete: "
                f"not a whole MindFormers save; not evaluated")
    if isinstance(common, dict) and common.get("ckpt_status") == ABNORMAL:
        return (f"{iter_dir.name}: MindFormers' checkpoint health monitor marked it abnormal (ckpt_status "
                f"{ABNORMAL} in {COMMON}); not evaluated")
    try:
        plan(iter_dir)
    except CheckpointUnreadable:
        raise
    except CheckpointError as exc:
        return str(exc)
    return step


def plan(iter_dir: Path) -> dict[str, Param]:
    """Every model parameter of the iteration: its whole shape, dtype and stored chunks (model files only).

    CheckpointError when ``metadata.json`` is malformed, names a file that is not there, or the chunks
    of a parameter do not tile it.
    """
    iter_dir = Path(iter_dir)
    try:
        metadata = _json(iter_dir / METADATA)
    except FileNotFoundError:
        return _plan_from_files(iter_dir)
    try:
        described, storage = metadata["state_dict_metadata"], metadata["storage_data"]
        params: dict[str, Param] = {}
        for name, meta in described.items():
            shape = tuple(int(d) for d in meta["global_shape"])
            dtype = _numpy_dtype_of_ms(str(meta["properties"]["dtype"]), name)
            chunks = []
            for chunk in meta["chunk"]:
                offset = tuple(int(d) for d in chunk["global_offset"])
                local = tuple(int(d) for d in chunk["local_shape"])
                where = storage.get(str((name, offset)))
                if where is None:
                    raise CheckpointError(f"{iter_dir.name}/{METADATA}: no file stores {name!r} at offset "
                                          f"{list(offset)}")
                files = [w["file_name"] for w in where if is_model_file(str(w["file_name"]))]
                if not files:
                    break  # stored in optimizer files only: optimizer state, not a model parameter
                chunks.append(Chunk(_full_offset(offset, shape), local, _plain_name(files[0], iter_dir)))
            else:
                params[name] = Param(shape, dtype, tuple(chunks))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        if isinstance(exc, CheckpointError):
            raise
        raise CheckpointError(f"{iter_dir.name}/{METADATA}: not MindFormers' metadata layout ({exc!r:.200})") from exc
    if not params:
        raise CheckpointError(f"{iter_dir.name}/{METADATA}: names no model parameter stored in a model file")
    for name, param in params.items():
        problem = _tiling_problem(param)
        if problem:
            raise CheckpointError(f"{iter_dir.name}: {name!r}: {problem}")
    missing = sorted({c.file for p in params.values() for c in p.chunks if not (iter_dir / c.file).is_file()})
    if missing:
        raise CheckpointError(f"{iter_dir.name}: model file{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
                              f"named in {METADATA} {'are' if len(missing) > 1 else 'is'} not there; not evaluated")
    return params


def _plan_from_files(iter_dir: Path) -> dict[str, Param]:
    files = sorted(e.name for e in os.scandir(iter_dir) if is_model_file(e.name))
    if not files:
        raise CheckpointError(f"{iter_dir.name}: neither {METADATA} nor a model file "
                              f"(<prefix>-model-0000000-0000001.safetensors); not evaluated")
    params: dict[str, Param] = {}
    for file in files:
        for name, (dtype, shape, _, _) in header(iter_dir / file)[0].items():
            if name in params:
                raise CheckpointError(f"{iter_dir.name}: {name!r} is in {params[name].chunks[0].file} and {file}, "
                                      f"and there is no {METADATA} to say how they fit together; not evaluated")
            params[name] = Param(shape, dtype, (Chunk((0,) * len(shape), shape, file),))
    return params


def model_bytes(params: dict[str, Param]) -> int:
    return sum(math.prod(p.shape) * np.dtype(p.dtype).itemsize for p in params.values())


def read_whole(iter_dir: Path, params: dict[str, Param]) -> dict[str, np.ndarray]:
    """Every parameter as one whole array, from the byte ranges of its chunks (CheckpointError if bad)."""
    return read_slices(iter_dir, params, {}, 1, 0)[0]


def stored_pieces(iter_dir: Path, params: dict[str, Param]) -> dict[str, list[slices.Piece]]:
    """Every parameter's chunks as pieces of files (byte offset, region), each checked against its file's
    header (read and checked once per file) and ``metadata.json``: dtype and local shape."""
    iter_dir = Path(iter_dir)
    headers: dict[str, tuple[dict, int]] = {}
    out: dict[str, list[slices.Piece]] = {}
    for name, param in params.items():
        pieces = out[name] = []
        for chunk in param.chunks:
            if chunk.file not in headers:
                headers[chunk.file] = header(iter_dir / chunk.file)
            entries, data_start = headers[chunk.file]
            entry = entries.get(name)
            if entry is None:
                raise CheckpointError(f"{iter_dir.name}/{chunk.file}: holds no tensor {name!r}, which "
                                      f"{METADATA} says it stores")
            dtype, shape, begin, _ = entry
            if dtype != param.dtype or shape != chunk.shape:
                raise CheckpointError(f"{iter_dir.name}/{chunk.file}: {name!r} is {dtype}{list(shape)} there, "
                                      f"{param.dtype}{list(chunk.shape)} in {METADATA}")
            region = tuple((o, o + s) for o, s in zip(chunk.offset, chunk.shape))
            pieces.append(slices.Piece(iter_dir / chunk.file, data_start + begin, region))
    return out


def read_slices(iter_dir: Path, params: dict[str, Param], cuts: dict[str, int | None], degree: int, rank: int
                ) -> tuple[dict[str, np.ndarray], int]:
    """Rank ``rank`` of a tensor-parallel group of ``degree``: each parameter's slice (1/degree along
    ``cuts[name]``; whole when the name is not in ``cuts`` or its cut is None), reading only the byte
    ranges of the chunks it needs (evald.files.slices). Returns the arrays and the bytes read.

    Every model file a read touches has its header checked first (dtype, shapes, offsets, size), and
    each chunk against ``metadata.json`` (dtype, local shape). CheckpointError if anything is off."""
    iter_dir = Path(iter_dir)
    out: dict[str, np.ndarray] = {}
    total = 0
    for name, pieces in stored_pieces(iter_dir, params).items():
        param = params[name]
        want = slices.tp_region(param.shape, cuts.get(name), degree, rank)
        dtype = _np_dtype(param.dtype)
        try:
            out[name], nbytes = slices.read_region(slices.plan_reads(pieces, want, dtype.itemsize), want, dtype)
        except FileNotFoundError as exc:
            raise CheckpointError(f"{iter_dir.name}: {Path(exc.filename or '').name} deleted before it could be "
                                  f"read") from exc
        except PermissionError as exc:
            raise CheckpointUnreadable(f"{iter_dir.name}/{Path(exc.filename or '').name}: permission denied") from exc
        total += nbytes
    return out, total


# ---------------------------------------------------------------- safetensors headers

def header(path: Path) -> tuple[dict[str, tuple[str, tuple[int, ...], int, int]], int]:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError as exc:
        raise CheckpointError(f"{path.parent.name}/{path.name}: deleted before it could be read") from exc
    except PermissionError as exc:
        raise CheckpointUnreadable(f"{path.parent.name}/{path.name}: permission denied") from exc
    try:
        return _header_fd(fd, path)
    finally:
        os.close(fd)


def _header_fd(fd: int, path: Path) -> tuple[dict[str, tuple[str, tuple[int, ...], int, int]], int]:
    """``{name: (numpy dtype, shape, begin, end)}`` and where the data starts; every entry checked:
    a known dtype, a size that matches its shape, inside the file; the data exactly fills the file."""
    size = os.fstat(fd).st_size
    shown = f"{path.parent.name}/{path.name}"
    if size < 8:
        raise CheckpointError(f"{shown}: {size} bytes, not a safetensors file (truncated?)")
    (length,) = struct.unpack("<Q", _pread_exact(fd, 8, 0, path))
    if length > min(MAX_HEADER_BYTES, size - 8):
        raise CheckpointError(f"{shown}: its header claims {length} bytes of a {size}-byte file: truncated or "
                              f"not a safetensors file")
    try:
        raw = json.loads(_pread_exact(fd, length, 8, path))
    except ValueError as exc:
        raise CheckpointError(f"{shown}: its header is not JSON: corrupt") from exc
    data_start, data_len = 8 + length, size - 8 - length
    out: dict[str, tuple[str, tuple[int, ...], int, int]] = {}
    ends = 0
    for name, entry in raw.items():
        if name == "__metadata__":
            continue
        try:
            dtype = _DTYPES[entry["dtype"]]
            shape = tuple(int(d) for d in entry["shape"])
            begin, end = (int(x) for x in entry["data_offsets"])
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"{shown}: header entry {name!r} is malformed or of an unknown dtype") from exc
        want = math.prod(shape) * _np_dtype(dtype).itemsize
        if min(shape, default=0) < 0 or not 0 <= begin <= end <= data_len or end - begin != want:
            raise CheckpointError(f"{shown}: {name!r} claims bytes [{begin}, {end}) for {dtype}{list(shape)} "
                                  f"({want} bytes) in {data_len} bytes of data: truncated or corrupt")
        ends = max(ends, end)
        out[name] = (dtype, shape, begin, end)
    if ends != data_len:
        raise CheckpointError(f"{shown}: its tensors end at byte {ends} of {data_len} bytes of data: truncated "
                              f"or not what its header says")
    return out, data_start


def _pread_exact(fd: int, n: int, offset: int, path: Path) -> bytes:
    data = os.pread(fd, n, offset)
    if len(data) != n:
        raise CheckpointError(f"{path.parent.name}/{path.name}: ended early (read {len(data)} of {n} bytes at "
                              f"{offset}): truncated while evald read it")
    return data


# ---------------------------------------------------------------- helpers

def _json(path: Path):
    try:
        check_readable(path, f"{path.parent.name}/{path.name}")
    except Unreadable as exc:
        raise CheckpointUnreadable(str(exc)) from exc
    if path.is_symlink() or not path.is_file():
        if not os.path.lexists(path):
            raise FileNotFoundError(path)
        raise CheckpointError(f"{path.parent.name}/{path.name}: not a regular file; not read")
    if path.stat().st_size > MAX_JSON_BYTES:
        raise CheckpointError(f"{path.parent.name}/{path.name}: larger than {MAX_JSON_BYTES} bytes; not read")
    try:
        return json.loads(path.read_bytes())
    except ValueError as exc:
        raise CheckpointError(f"{path.parent.name}/{path.name}: not valid JSON ({exc})") from exc


def _numpy_dtype_of_ms(name: str, param: str) -> str:
    """MindSpore's dtype name in metadata.json (``Float32``, ``BFloat16``) as numpy's."""
    table = {"float64": "float64", "float32": "float32", "float16": "float16", "bfloat16": "bfloat16",
             "int64": "int64", "int32": "int32", "int16": "int16", "int8": "int8", "uint8": "uint8",
             "bool": "bool", "bool_": "bool"}
    found = table.get(name.lower())
    if found is None:
        raise CheckpointError(f"{METADATA}: {param!r} has dtype {name!r}, which evald does not read")
    return found


def _np_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        try:
            import mindspore  # noqa: F401  (registers bfloat16 with numpy)
        except ImportError:
            pass
    return np.dtype(name)


def _full_offset(offset: tuple[int, ...], shape: tuple[int, ...]) -> tuple[int, ...]:
    """MindFormers writes ``(0,)`` for an unsharded tensor of any rank."""
    if len(offset) == len(shape):
        return offset
    if all(o == 0 for o in offset):
        return (0,) * len(shape)
    raise CheckpointError(f"offset {list(offset)} does not fit a tensor of shape {list(shape)}")


def _plain_name(name: str, iter_dir: Path) -> str:
    if "/" in name or "\\" in name or name in (".", "..") or not name:
        raise CheckpointError(f"{iter_dir.name}/{METADATA}: file name {name!r} is not a plain name in the "
                              f"iteration directory; not read")
    return name


def _tiling_problem(param: Param) -> str | None:
    """None when the chunks cover the whole tensor exactly once (evald.contracts.partition.untiled: every chunk
    inside it, no two overlapping, no element left out); else what is wrong, naming the chunks."""
    def outside(chunk: Chunk) -> str:
        return (f"a chunk at {list(chunk.offset)[:16]} of shape {list(chunk.shape)[:16]} is outside "
                f"{list(param.shape)[:16]}")

    odd = next((c for c in param.chunks if len(c.shape) != len(param.shape)), None)
    if odd is not None:
        return outside(odd)
    problem = untiled(param.shape, [tuple((o, o + s) for o, s in zip(c.offset, c.shape)) for c in param.chunks])
    if problem is None:
        return None
    chunks = [param.chunks[i] for i in problem.boxes]
    if problem.kind == OUTSIDE:
        return outside(chunks[0])
    if problem.kind == OVERLAP and chunks:
        return f"chunks at {list(chunks[0].offset)[:16]} and {list(chunks[1].offset)[:16]} overlap"
    if problem.kind == OVERLAP:
        return f"its stored chunks hold {problem.covered} elements of its {problem.total}: some overlap"
    if problem.kind == GAP:
        return (f"its stored chunks cover {problem.covered} of its {problem.total} elements: part of it is not "
                f"in any model file")
    assert problem.kind == IRREGULAR
    return (f"its {len(param.chunks)} chunks do not cut it into a grid, and checking them would take "
            f"{problem.cells} pieces (more than {MAX_GRID_CELLS}); not read")
