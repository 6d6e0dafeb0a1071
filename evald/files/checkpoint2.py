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

It creates the iteration directory, writes the shards (MindSpore writes ``x.tmp`` and renames it, so a
file under its final name is whole; with ``async_save`` later, in a background thread), ``common.json``
and ``metadata.json`` (each written to a temporary file and renamed into place), waits for every rank
(``barrier_world``), and only then does rank 0 write the tracker file, with a plain ``open(..., "w")``
(so an empty tracker means "being written"). MindFormers' own loader (``get_checkpoint_path``) trusts an
iteration through that file. It may write an iteration again (a resumed job saves into the same
``iteration_XXXXXXXX/``) and removes the oldest beyond ``keep_max_num``.

When an iteration is judged, and what for (docs/mindformers.md, "Checkpoint 2.0"):

* **Not yet** (``committed`` returns None: no verdict, no ledger row; judged again at every rescan and
  whenever the tracker changes): the tracker is absent, empty, not a number, or not a regular file of
  the directory (a link, a FIFO, a directory: refused and said once, never followed or waited on); the
  iteration is above the number it names; or the iteration is **incomplete**: no ``common.json``, or a
  model file ``metadata.json`` names is not there, or, without ``metadata.json``, no model file yet or
  model files of a save of several ranks (whose ``metadata.json`` comes after them). The tracker is
  only a necessary condition: whoever writes it wrong (a number from another run, 10**15, a
  hand edit) must not get a half-written iteration rejected, since it becomes complete later.
* **Rejected for good**, for what waiting cannot change, because MindFormers writes each file whole
  under its final name: a file that is not a regular file of the iteration (a link, a FIFO, a
  device, a hard link), too big, not JSON, or not MindFormers' layout (wrong types, names that are not
  plain names of the iteration); ``ckpt_status`` 1 (MindFormers' health monitor: ABNORMAL); chunks that
  do not tile their parameter; a model file whose header does not hold.
* **Pending** (CheckpointUnreadable): a file evald's user may not read (evald.files.access).

Every file is opened under the one rule (evald.contracts.safe_open): below the served checkpoint
directory (``root``) without following any link, without blocking, bounded.

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
import logging
import math
import os
import re
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from evald.contracts.partition import GAP, IRREGULAR, MAX_GRID_CELLS, OUTSIDE, OVERLAP, untiled
from evald.contracts.safe_open import UnsafeFile, kind_of, list_beneath, open_beneath, read_beneath
from evald.files import slices
from evald.files.access import permission_message
from evald.files.errors import CheckpointError, CheckpointUnreadable

log = logging.getLogger("evald.files.checkpoint2")

TRACKER = "latest_checkpointed_iteration.txt"
COMMON, METADATA = "common.json", "metadata.json"
ABNORMAL = 1                      # mindformers.checkpoint.utils.CkptHealthStatus.ABNORMAL
MAX_TRACKER_BYTES = 64            # MindFormers writes str(iteration): a few digits
MAX_JSON_BYTES = 256 << 20        # metadata.json of a large model is megabytes, never this
MAX_HEADER_BYTES = 100 << 20      # the safetensors reference implementation's limit
MAX_MODEL_FILE_BYTES = 1 << 44    # 16 TiB: no bound on what is read (the header and the network's fit are)
MAX_ENTRIES = 1 << 20             # entries of one iteration directory: a rank writes two files
MAX_NAME_BYTES = 255              # NAME_MAX: a longer file name can never be there
_ITERATION = re.compile(r"iteration_(?P<n>[0-9]{1,15})")
_MODEL_FILE = re.compile(r"(?:.+-)?model-(?P<rank>[0-9]{7})-(?P<world>[0-9]{7})\.safetensors", re.DOTALL)
_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
           "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool"}


PLANS_KEPT = 4                    # metadata.json files whose checked plan is kept (a large one: seconds to check)
_planned: dict[tuple, dict[str, "Param"]] = {}   # (dev, inode, size, mtime, ctime) -> its plan, oldest first


class IterationIncomplete(CheckpointError):
    """A file the iteration needs is not there (yet): while MindFormers may still be writing it, the
    iteration is not judged (``committed`` returns None); when it is being read, it is an error."""


def iteration_of(name: str) -> int | None:
    """The iteration of a directory named ``iteration_XXXXXXXX``, else None."""
    match = _ITERATION.fullmatch(name)
    return int(match["n"]) if match else None


def is_model_file(name: str) -> bool:
    """``<prefix>-model-<rank>-<world>.safetensors``: model shards (``-opt-`` files are the optimizer's)."""
    return bool(_MODEL_FILE.fullmatch(name))


def _below(path: Path, root: Path | None) -> tuple[Path, str]:
    """The trusted root ``path`` is opened below (default: its parent) and its path below it."""
    path = Path(path)
    root = Path(root) if root is not None else path.parent
    return root, path.relative_to(root).as_posix()


_said_about_tracker: dict[str, str] = {}   # tracker path -> the problem said about it (said once each)


def tracked_iteration(checkpoint_dir: Path, root: Path | None = None) -> int | None:
    """The iteration ``latest_checkpointed_iteration.txt`` names; None while it is absent or being written,
    or when it is not a small regular file of the directory (said once: a link is not MindFormers' tracker,
    a FIFO would block). CheckpointUnreadable if evald's user may not read it."""
    root, relative = _below(Path(checkpoint_dir) / TRACKER, root)
    path, shown = Path(root) / relative, f"{Path(checkpoint_dir).name}/{TRACKER}"
    try:
        data, _ = read_beneath(root, relative, MAX_TRACKER_BYTES)
    except FileNotFoundError:
        _said_about_tracker.pop(str(path), None)
        return None
    except PermissionError as exc:
        raise CheckpointUnreadable(permission_message(path, shown)) from exc
    except (UnsafeFile, OSError) as exc:
        _say_once(path, f"{exc}: MindFormers writes its tracker as a small regular file; it is not read, and no "
                        f"iteration beside it counts as committed until it is one")
        return None
    text = data.strip()
    if text.isdigit():   # bytes: ASCII digits only
        _said_about_tracker.pop(str(path), None)
        return int(text)
    if text:
        _say_once(path, f"{shown} holds {data[:MAX_TRACKER_BYTES]!r}, not an iteration number: no iteration "
                        f"beside it counts as committed until it names one")
    return None


def _say_once(path: Path, problem: str) -> None:
    if _said_about_tracker.get(str(path)) != problem:
        _said_about_tracker[str(path)] = problem
        log.error("%s", problem)


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


def committed(iter_dir: Path, root: Path | None = None) -> int | str | None:
    """The step of a committed, complete iteration directory; a reason it never will be evaluated; or None
    (not yet: the tracker does not commit it, or it is incomplete). The module docstring has the rule.

    ``root``: the served checkpoint directory ``iter_dir`` is in (default: its parent); nothing below it is
    reached through a link. CheckpointUnreadable when a file evald must read is not readable by evald's user.
    """
    iter_dir = Path(iter_dir)
    step = iteration_of(iter_dir.name)
    if step is None:
        return None
    root, relative = _below(iter_dir, root)
    tracked = tracked_iteration(iter_dir.parent, root)
    if tracked is None or step > tracked:
        return None  # being written, or its save never finished: MindFormers does not trust it either
    try:
        common = _json(root, f"{relative}/{COMMON}", f"{iter_dir.name}/{COMMON}")
    except FileNotFoundError:
        return None  # incomplete: MindFormers writes common.json after the shards
    except CheckpointUnreadable:
        raise
    except CheckpointError as exc:
        return str(exc)
    if not isinstance(common, dict):
        return f"{iter_dir.name}/{COMMON}: not MindFormers' common.json (a JSON object); not evaluated"
    if common.get("ckpt_status") == ABNORMAL:
        return (f"{iter_dir.name}: MindFormers' checkpoint health monitor marked it abnormal (ckpt_status "
                f"{ABNORMAL} in {COMMON}); not evaluated")
    try:
        plan(iter_dir, root)
    except IterationIncomplete:
        return None
    except FileNotFoundError:
        return None  # removed while it was judged: the intake sees it gone
    except CheckpointUnreadable:
        raise
    except CheckpointError as exc:
        return str(exc)
    return step


def plan(iter_dir: Path, root: Path | None = None) -> dict[str, Param]:
    """Every model parameter of the iteration: its whole shape, dtype and stored chunks (model files only).

    IterationIncomplete when a model file ``metadata.json`` names is not there (or, without it, no model
    file or the files of several ranks); CheckpointError when ``metadata.json`` is malformed, names a file
    that is not a plain name of the iteration or not a regular file, or the chunks of a parameter do not
    tile it. ``root`` as in ``committed``.
    """
    iter_dir = Path(iter_dir)
    root, relative = _below(iter_dir, root)
    shown = f"{iter_dir.name}/{METADATA}"
    try:
        data, info = _read(root, f"{relative}/{METADATA}", shown)
    except FileNotFoundError:
        return _plan_from_files(iter_dir, root, relative)
    # An incomplete iteration is judged again at every rescan, and a found one planned again when it is read:
    # the same metadata.json (MindFormers renames it into place; a write changes its ctime) is checked once.
    key = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
    params = _planned.pop(key, None) or _params(_parse(data, shown), iter_dir.name)
    _planned[key] = params
    while len(_planned) > PLANS_KEPT:
        _planned.pop(next(iter(_planned)))
    params = dict(params)    # the caller's own dict: the kept one stays as checked
    entries = _entries(root, relative, iter_dir.name)
    named = sorted({c.file for p in params.values() for c in p.chunks})
    for file in named:
        if file in entries and not stat.S_ISREG(entries[file]):
            raise CheckpointError(f"{iter_dir.name}/{file}: {kind_of(entries[file])}, not a regular file: not "
                                  f"what MindFormers writes; not read")
    missing = [f for f in named if f not in entries]
    if missing:
        raise IterationIncomplete(f"{iter_dir.name}: model file{'s' if len(missing) > 1 else ''} "
                                  f"{', '.join(missing[:8])}{', ...' if len(missing) > 8 else ''} named in "
                                  f"{METADATA} {'are' if len(missing) > 1 else 'is'} not there")
    return params


def _params(metadata: object, where: str) -> dict[str, Param]:
    """The model parameters ``metadata.json`` describes, every value checked for its type (the file decides
    them: a list where a number belongs, a name with ``/``, an offset of 10**30); CheckpointError if off."""
    shown = f"{where}/{METADATA}"

    def bad(what: str) -> CheckpointError:
        return CheckpointError(f"{shown}: not MindFormers' metadata layout ({what}); not evaluated")

    if not isinstance(metadata, dict):
        raise bad("not a JSON object")
    described, storage = metadata.get("state_dict_metadata"), metadata.get("storage_data")
    if not isinstance(described, dict) or not isinstance(storage, dict):
        raise bad("state_dict_metadata and storage_data must be objects")
    params: dict[str, Param] = {}
    model_file: dict[str, str | None] = {}   # file_name -> the plain name of a model file, or None
    for name, meta in described.items():
        if not isinstance(meta, dict) or not isinstance(meta.get("properties"), dict):
            raise bad(f"{name[:200]!r} is not an object with properties")
        shape = _ints(meta.get("global_shape"))
        if shape is None:
            raise bad(f"the global_shape of {name[:200]!r} is not a list of integers")
        dtype_name = meta["properties"].get("dtype")
        if not isinstance(meta.get("chunk"), list):
            raise bad(f"the chunk of {name[:200]!r} is not a list")
        chunks = []
        for chunk in meta["chunk"]:
            offset = _ints(chunk.get("global_offset")) if type(chunk) is dict else None
            local = _ints(chunk.get("local_shape")) if type(chunk) is dict else None
            if offset is None or local is None:
                raise bad(f"a chunk of {name[:200]!r} is not an object with a global_offset and a local_shape, "
                          f"each a list of integers")
            stored = storage.get(str((name, offset)))
            if stored is None:
                raise CheckpointError(f"{shown}: no file stores {name[:200]!r} at offset {list(offset)[:16]}")
            if type(stored) is not list or not all(type(w) is dict and type(w.get("file_name")) is str
                                                   for w in stored):
                raise bad(f"the storage of {name[:200]!r} is not a list of objects with a file_name")
            file = None
            for where in stored:
                known = where["file_name"]
                if known not in model_file:
                    model_file[known] = _plain_name(known, shown) if is_model_file(known) else None
                file = model_file[known]
                if file is not None:
                    break
            if file is None:
                break  # stored in optimizer files only: optimizer state, not a model parameter
            chunks.append(Chunk(_full_offset(offset, shape, name), local, file))
        else:
            if not isinstance(dtype_name, str):
                raise bad(f"the dtype of {name[:200]!r} is not a string")
            params[name] = Param(shape, _numpy_dtype_of_ms(dtype_name, name), tuple(chunks))
    if not params:
        raise CheckpointError(f"{shown}: names no model parameter stored in a model file")
    for name, param in params.items():
        problem = _tiling_problem(param)
        if problem:
            raise CheckpointError(f"{where}: {name[:200]!r}: {problem}")
    return params


def _ints(value: object) -> tuple[int, ...] | None:
    """A list of JSON integers (not booleans, floats or strings) as a tuple, else None."""
    if type(value) is not list or not all(type(d) is int for d in value):
        return None
    return tuple(value)


def _entries(root: Path, relative: str, where: str) -> dict[str, int]:
    """The iteration's entries (name -> lstat mode), listed without following a link."""
    try:
        return {e.name: e.mode for e in list_beneath(root, relative, MAX_ENTRIES)}
    except PermissionError as exc:
        raise CheckpointUnreadable(permission_message(Path(root) / relative, where)) from exc
    except UnsafeFile as exc:
        raise CheckpointError(f"{_short(exc, Path(root) / relative, where)}; not evaluated") from None
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise CheckpointError(f"{where}: cannot be listed ({exc.strerror})") from None


def _plan_from_files(iter_dir: Path, root: Path, relative: str) -> dict[str, Param]:
    entries = _entries(root, relative, iter_dir.name)
    files = sorted(name for name in entries if is_model_file(name))
    if not files:
        raise IterationIncomplete(f"{iter_dir.name}: neither {METADATA} nor a model file "
                                  f"(<prefix>-model-0000000-0000001.safetensors) yet")
    worlds = sorted({int(_MODEL_FILE.fullmatch(f)["world"]) for f in files})
    if worlds[-1] > 1:
        raise IterationIncomplete(f"{iter_dir.name}: model files of a save of {worlds[-1]} ranks and no "
                                  f"{METADATA} yet (MindFormers writes it after them)")
    params: dict[str, Param] = {}
    for file in files:
        for name, (dtype, shape, _, _) in header(iter_dir, file, root)[0].items():
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


def stored_pieces(iter_dir: Path, params: dict[str, Param], root: Path | None = None
                  ) -> dict[str, list[slices.Piece]]:
    """Every parameter's chunks as pieces of files (byte offset, region), each checked against its file's
    header (read and checked once per file) and ``metadata.json``: dtype and local shape."""
    iter_dir = Path(iter_dir)
    headers: dict[str, tuple[dict, int]] = {}
    out: dict[str, list[slices.Piece]] = {}
    for name, param in params.items():
        pieces = out[name] = []
        for chunk in param.chunks:
            if chunk.file not in headers:
                headers[chunk.file] = header(iter_dir, chunk.file, root)
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

def header(iter_dir: Path, file: str, root: Path | None = None
           ) -> tuple[dict[str, tuple[str, tuple[int, ...], int, int]], int]:
    """The checked header of model file ``file`` of ``iter_dir`` (``_header_fd``), opened under the one rule
    below ``root`` (default: the directory holding ``iter_dir``)."""
    root, relative = _below(Path(iter_dir) / file, root if root is not None else Path(iter_dir).parent)
    shown = f"{Path(iter_dir).name}/{file}"
    try:
        opened = open_beneath(root, relative, MAX_MODEL_FILE_BYTES)
    except FileNotFoundError as exc:
        raise CheckpointError(f"{shown}: deleted before it could be read") from exc
    except PermissionError as exc:
        raise CheckpointUnreadable(permission_message(Path(root) / relative, shown)) from exc
    except UnsafeFile as exc:
        raise CheckpointError(f"{_short(exc, Path(root) / relative, shown)}: not what MindFormers writes; "
                              f"not read") from None
    except OSError as exc:
        raise CheckpointError(f"{shown}: cannot be read ({exc.strerror})") from None
    with opened:
        return _header_fd(opened.fd, opened.info.st_size, shown)


def _header_fd(fd: int, size: int, shown: str) -> tuple[dict[str, tuple[str, tuple[int, ...], int, int]], int]:
    """``{name: (numpy dtype, shape, begin, end)}`` and where the data starts; every entry checked:
    a known dtype, a size that matches its shape, inside the file; the data exactly fills the file."""
    if size < 8:
        raise CheckpointError(f"{shown}: {size} bytes, not a safetensors file (truncated?)")
    (length,) = struct.unpack("<Q", _pread_exact(fd, 8, 0, shown))
    if length > min(MAX_HEADER_BYTES, size - 8):
        raise CheckpointError(f"{shown}: its header claims {length} bytes of a {size}-byte file: truncated or "
                              f"not a safetensors file")
    try:
        raw = json.loads(_pread_exact(fd, length, 8, shown))
    except (ValueError, RecursionError) as exc:
        raise CheckpointError(f"{shown}: its header is not JSON: corrupt") from exc
    if not isinstance(raw, dict):
        raise CheckpointError(f"{shown}: its header is not a JSON object: corrupt")
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
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            raise CheckpointError(f"{shown}: header entry {name[:200]!r} is malformed or of an unknown dtype") from exc
        want = math.prod(shape) * _np_dtype(dtype).itemsize
        if min(shape, default=0) < 0 or not 0 <= begin <= end <= data_len or end - begin != want:
            raise CheckpointError(f"{shown}: {name[:200]!r} claims bytes [{begin}, {end}) for {dtype}"
                                  f"{list(shape)[:16]} ({want} bytes) in {data_len} bytes of data: truncated or corrupt")
        ends = max(ends, end)
        out[name] = (dtype, shape, begin, end)
    if ends != data_len:
        raise CheckpointError(f"{shown}: its tensors end at byte {ends} of {data_len} bytes of data: truncated "
                              f"or not what its header says")
    return out, data_start


def _pread_exact(fd: int, n: int, offset: int, shown: str) -> bytes:
    data = os.pread(fd, n, offset)
    if len(data) != n:
        raise CheckpointError(f"{shown}: ended early (read {len(data)} of {n} bytes at {offset}): truncated while "
                              f"evald read it")
    return data


# ---------------------------------------------------------------- helpers

def _json(root: Path, relative: str, shown: str) -> object:
    """A small JSON file of the iteration, read under the one rule. FileNotFoundError when absent;
    CheckpointUnreadable for a permission problem; CheckpointError for anything else that is off."""
    return _parse(_read(root, relative, shown)[0], shown)


def _read(root: Path, relative: str, shown: str) -> tuple[bytes, os.stat_result]:
    """The bytes of a small file of the iteration and the ``fstat`` they came from (``_json``'s errors)."""
    try:
        return read_beneath(root, relative, MAX_JSON_BYTES)
    except PermissionError as exc:
        raise CheckpointUnreadable(permission_message(Path(root) / relative, shown)) from exc
    except UnsafeFile as exc:
        raise CheckpointError(f"{_short(exc, Path(root) / relative, shown)}: not what MindFormers writes; "
                              f"not read") from None
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise CheckpointError(f"{shown}: cannot be read ({exc.strerror})") from None


def _parse(data: bytes, shown: str) -> object:
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise CheckpointError(f"{shown}: not valid JSON ({str(exc)[:200]})") from None


def _short(exc: UnsafeFile, path: Path, shown: str) -> str:
    """What safe_open says about ``path``, naming it as the iteration's file (as every reason here does)."""
    return str(exc).replace(str(path), shown)


def _numpy_dtype_of_ms(name: str, param: str) -> str:
    """MindSpore's dtype name in metadata.json (``Float32``, ``BFloat16``) as numpy's."""
    table = {"float64": "float64", "float32": "float32", "float16": "float16", "bfloat16": "bfloat16",
             "int64": "int64", "int32": "int32", "int16": "int16", "int8": "int8", "uint8": "uint8",
             "bool": "bool", "bool_": "bool"}
    found = table.get(name.lower())
    if found is None:
        raise CheckpointError(f"{METADATA}: {param[:200]!r} has dtype {name[:100]!r}, which evald does not read")
    return found


def _np_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        try:
            import mindspore  # noqa: F401  (registers bfloat16 with numpy)
        except ImportError:
            pass
    return np.dtype(name)


def _full_offset(offset: tuple[int, ...], shape: tuple[int, ...], name: str) -> tuple[int, ...]:
    """MindFormers writes ``(0,)`` for an unsharded tensor of any rank."""
    if len(offset) == len(shape):
        return offset
    if all(o == 0 for o in offset):
        return (0,) * len(shape)
    raise CheckpointError(f"{METADATA}: {name[:200]!r}: offset {list(offset)[:16]} does not fit a tensor of shape "
                          f"{list(shape)[:16]}")


def _plain_name(name: str, shown: str) -> str:
    if ("/" in name or "\\" in name or "\x00" in name or name in (".", "..") or not name
            or len(os.fsencode(name)) > MAX_NAME_BYTES):
        raise CheckpointError(f"{shown}: file name {name[:300]!r} is not a plain name in the iteration "
                              f"directory; not read")
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
