"""Safetensors files written and read with their integrity hash taken on the same pass.

Part of the checkpoint layout contract (evald.contracts.layout decides names,
manifest and commit; this module moves the bytes). The file format is
safetensors (https://huggingface.co/docs/safetensors): an 8-byte little-endian
header length N, N bytes of JSON ``{name: {"dtype", "shape", "data_offsets":
[begin, end]}}`` with offsets counted from the end of the header and tiling
the data with no holes, then the data, little-endian, C order.

Every byte is touched once. Writing hashes each chunk as it goes to the file,
so the file is never read back. Reading puts each chunk straight into its
destination array and hashes it there while it is still in the CPU cache.
evald.contracts.parallel_io runs several files at once. Neither mindspore nor
the safetensors package is imported.
"""

from __future__ import annotations

import json
import math
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np

from evald.contracts import integrity
from evald.contracts.safe_open import OpenedFile, UnsafeFile, open_beneath

# The integrity checks by name (version 1 of each; evald.contracts.integrity): a fresh hasher each call.
HASHES: dict[str, Callable[[], object]] = {c.algorithm: c.new for c in integrity.CHECKS.values() if c.version == 1}
CHUNK_BYTES = 4 << 20          # hashed while still in the CPU cache after its read/write
MAX_HEADER_BYTES = 100 << 20   # the safetensors reference implementation's limit too
_NO_LIMIT = 1 << 62            # a weights file's size is checked against its manifest instead
_TO_SAFETENSORS = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16",
                   "int64": "I64", "int32": "I32", "int16": "I16", "int8": "I8", "uint64": "U64",
                   "uint32": "U32", "uint16": "U16", "uint8": "U8", "bool": "BOOL"}
_FROM_SAFETENSORS = {v: k for k, v in _TO_SAFETENSORS.items()}


class WeightsFileError(ValueError):
    """A weights file is missing, of the wrong size or kind, malformed or corrupted."""


class WeightsFileMissing(WeightsFileError):
    """A weights file the manifest names is not there (deleted after the commit, by retention or a user)."""

    def __init__(self, path: Path) -> None:
        super().__init__(f"{path}: weights file missing (deleted after commit?)")
        self.path = Path(path)


class Abandoned(WeightsFileError):
    """Stopped because another file of the same checkpoint failed (that failure is the news)."""


class Unaccounted(WeightsFileError):
    """The header's tensors do not cover the whole file: bytes no tensor owns are never read or hashed."""


class ReadInterrupted(Exception):
    """A read stopped between chunks because the process was told to stop (a signal): not a verdict
    on the file, so deliberately not a WeightsFileError."""


_stop_reading: Callable[[], bool] | None = None


def stop_reading_when(check: Callable[[], bool] | None) -> None:
    """``check`` (the daemon's signal flag) is asked between chunks of every read; True stops it with
    ReadInterrupted, so a signal is answered within a chunk, whatever the file's size. None: never."""
    global _stop_reading
    _stop_reading = check


@dataclass(frozen=True)
class Segment:
    """One tensor inside a file: where its bytes are (absolute offset) and what they are."""

    name: str
    dtype: str                 # numpy dtype name, e.g. "float32"
    shape: tuple[int, ...]
    offset: int

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * numpy_dtype(self.dtype).itemsize


@dataclass(frozen=True)
class WrittenFile:
    name: str
    nbytes: int
    digest: str
    segments: tuple[Segment, ...]


def numpy_dtype(name: str) -> np.dtype:
    if name not in _TO_SAFETENSORS:
        raise WeightsFileError(f"dtype {name!r} is not one the checkpoint layout supports "
                               f"({', '.join(_TO_SAFETENSORS)})")
    try:
        return np.dtype(name)
    except TypeError as exc:  # bfloat16 needs ml_dtypes, which numpy alone does not have
        raise WeightsFileError(f"dtype {name!r} is not available in this numpy") from exc


def _bytes_of(array: np.ndarray) -> memoryview:
    # Through a uint8 view: bfloat16 (registered with numpy by mindspore) has no buffer format.
    return memoryview(array.reshape(-1).view(np.uint8)) if array.size else memoryview(b"")


# ---------------------------------------------------------------- writing


def write_file(path: Path, tensors: Sequence[tuple[str, np.ndarray]], algorithm: str,
               stop: threading.Event | None = None) -> WrittenFile:
    """Create ``path`` (it must not exist) holding ``tensors``, fsync it; hash as it is written."""
    # Widest items first: with a header padded to 8 bytes every tensor is then aligned to its itemsize.
    ordered = sorted(((n, _little_endian(n, a)) for n, a in tensors), key=lambda t: -t[1].dtype.itemsize)
    entries, begin = {}, 0
    for name, array in ordered:
        entries[name] = {"dtype": _TO_SAFETENSORS[array.dtype.name], "shape": list(array.shape),
                         "data_offsets": [begin, begin + array.nbytes]}
        begin += array.nbytes
    header = json.dumps(entries, separators=(",", ":")).encode()
    header += b" " * (-(8 + len(header)) % 8)
    start = 8 + len(header)
    digest = HASHES[algorithm]()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        os.fchmod(fd, 0o644)  # whatever the umask: evald may run as another user
        _write_hashed(fd, memoryview(len(header).to_bytes(8, "little") + header), digest, stop)
        for _, array in ordered:
            _write_hashed(fd, _bytes_of(array), digest, stop)
        os.fsync(fd)
    finally:
        os.close(fd)
    segments = tuple(Segment(n, a.dtype.name, tuple(int(d) for d in a.shape), start + entries[n]["data_offsets"][0])
                     for n, a in ordered)
    return WrittenFile(Path(path).name, start + begin, digest.hexdigest(), segments)


def _little_endian(name: str, array: np.ndarray) -> np.ndarray:
    array = np.asarray(array)
    if not array.flags.c_contiguous:  # not np.ascontiguousarray: it turns a 0-d array into 1-d
        array = array.copy(order="C")
    if array.dtype.name not in _TO_SAFETENSORS:
        raise WeightsFileError(f"{name}: dtype {array.dtype} cannot be stored in the checkpoint layout")
    return array.astype(array.dtype.newbyteorder("<")) if array.dtype.byteorder == ">" else array


def _write_hashed(fd: int, data: memoryview, digest, stop: threading.Event | None) -> None:
    for pos in range(0, len(data), CHUNK_BYTES):
        if stop is not None and stop.is_set():
            raise Abandoned("write abandoned: another file of this checkpoint failed")
        chunk = data[pos:pos + CHUNK_BYTES]
        digest.update(chunk)
        while chunk:
            chunk = chunk[os.write(fd, chunk):]


# ---------------------------------------------------------------- reading


def open_weights(path: Path, nbytes: int, root: Path | None = None) -> OpenedFile:
    """Weights file ``path`` opened under the one rule (evald.contracts.safe_open: no link below ``root``,
    default the file's own directory; never blocking; a regular file with one name) and of exactly the
    ``nbytes`` its manifest declares. Every reader of evald's layout opens its files here, so one device and
    a tensor-parallel rank say the same about the same file. The caller closes it (a context manager)."""
    root = Path(path).parent if root is None else Path(root)
    try:
        opened = open_beneath(root, Path(path).relative_to(root), _NO_LIMIT)
    except FileNotFoundError as exc:
        raise WeightsFileMissing(path) from exc
    except UnsafeFile as exc:
        raise WeightsFileError(str(exc)) from exc
    except OSError as exc:
        raise WeightsFileError(f"{path}: cannot be opened ({exc.strerror})") from exc
    if opened.info.st_size != nbytes:
        opened.close()
        raise WeightsFileError(f"{path}: {opened.info.st_size} bytes on disk but the manifest says {nbytes} "
                               f"(truncated or overwritten after commit)")
    return opened


def read_file(path: Path, *, nbytes: int, digest: str, algorithm: str,
              expected: Sequence[Segment] | None = None, into: Mapping[str, np.ndarray] | None = None,
              stop: threading.Event | None = None, root: Path | None = None) -> dict[str, np.ndarray]:
    """Read one file once, verifying its size before and its hash after; never past ``nbytes``.

    ``expected``: the segments the manifest declares (their header must say the
    same); None to take them from the header (version-1 manifests). Tensors named
    in ``into`` are read straight into those arrays, the others into new ones.
    ``root``: no link is followed below it (``open_weights``).
    """
    into = into or {}
    with open_weights(path, nbytes, root) as opened:
        fd = opened.fd
        hasher = HASHES[algorithm]()
        segments = _checked_header(fd, path, nbytes, digest, algorithm, expected, hasher, stop)
        out = {}
        for seg in segments:
            dest = into.get(seg.name)
            if dest is None:
                dest = np.empty(seg.shape, numpy_dtype(seg.dtype))
            else:
                _check_destination(path, seg, dest)
            _read_hashed(fd, path, _bytes_of(dest), hasher, stop)
            out[seg.name] = dest
    _compare(path, algorithm, hasher.hexdigest(), digest, "")
    return out


def verify_file(path: Path, *, nbytes: int, digest: str, algorithm: str,
                expected: Sequence[Segment] | None = None, stop: threading.Event | None = None,
                root: Path | None = None) -> int:
    """Check one file exactly as ``read_file`` does (size, header against ``expected``, digest), with the
    same errors, but keep none of its tensors: its bytes stream through one buffer of ``CHUNK_BYTES``. For a
    tensor-parallel rank, which reads only its slices and verifies its share of the files. The bytes hashed."""
    with open_weights(path, nbytes, root) as opened:
        hasher = HASHES[algorithm]()
        _checked_header(opened.fd, path, nbytes, digest, algorithm, expected, hasher, stop)
        _hash_rest(opened.fd, path, nbytes, hasher, stop)  # the tensors tile the rest (_read_header checked)
    _compare(path, algorithm, hasher.hexdigest(), digest, "")
    return nbytes


def _checked_header(fd: int, path: Path, nbytes: int, digest: str, algorithm: str,
                    expected: Sequence[Segment] | None, hasher, stop: threading.Event | None) -> list[Segment]:
    """The file's segments from its header (hashed), checked against ``expected``. A header that is wrong is
    told apart from a corrupted file by hashing the rest: a digest mismatch says corruption."""
    try:
        segments = _read_header(fd, path, nbytes, hasher)
        if expected is not None and sorted(segments, key=_key) != sorted(expected, key=_key):
            raise WeightsFileError(f"{path}: its safetensors header does not list the tensors, dtypes, "
                                   f"shapes and offsets the manifest does (written by another tool?)")
    except Unaccounted:
        raise  # a sparse or padded file: the bytes no tensor owns are not worth a read
    except WeightsFileError as exc:
        # Corruption or a lying manifest? Hash the rest (bounded by nbytes) to tell which.
        _hash_rest(fd, path, nbytes, hasher, stop)
        _compare(path, algorithm, hasher.hexdigest(), digest, f"; {str(exc).split(': ', 1)[1]}")
        raise
    return segments


def _compare(path: Path, algorithm: str, found: str, digest: str, also: str) -> None:
    if found != digest:
        raise WeightsFileError(f"{path}: {algorithm} {found[:16]}… does not match the manifest's "
                               f"{digest[:16]}… (corrupted on disk: bit flip or partial copy{also})")


def _hash_rest(fd: int, path: Path, nbytes: int, hasher, stop: threading.Event | None) -> None:
    remaining = nbytes - os.lseek(fd, 0, os.SEEK_CUR)
    scratch = memoryview(bytearray(min(CHUNK_BYTES, max(remaining, 0))))
    while remaining > 0:
        take = min(remaining, len(scratch))
        _read_hashed(fd, path, scratch[:take], hasher, stop)
        remaining -= take


def _key(seg: Segment):
    return seg.offset, seg.nbytes, seg.name   # empty tensors share an offset with the next one


def _read_header(fd: int, path: Path, nbytes: int, hasher) -> list[Segment]:
    if nbytes < 8:
        raise WeightsFileError(f"{path}: {nbytes} bytes is too short for a safetensors file")
    prefix = bytearray(8)
    _read_hashed(fd, path, memoryview(prefix), hasher, None)
    size = int.from_bytes(prefix, "little")
    if not 2 <= size <= min(MAX_HEADER_BYTES, nbytes - 8):
        raise WeightsFileError(f"{path}: header length {size} does not fit in the file's {nbytes} bytes; "
                               f"not a safetensors file")
    header = bytearray(size)
    _read_hashed(fd, path, memoryview(header), hasher, None)
    try:
        entries = json.loads(bytes(header))
        segments = [Segment(str(name), _FROM_SAFETENSORS[e["dtype"]], tuple(int(d) for d in e["shape"]),
                            8 + size + int(e["data_offsets"][0]))
                    for name, e in entries.items() if name != "__metadata__"]
        ends = {s.name: 8 + size + int(entries[s.name]["data_offsets"][1]) for s in segments}
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
        # str, not repr: a UnicodeDecodeError's repr holds the whole header (megabytes), str says where it broke
        raise WeightsFileError(f"{path}: unreadable safetensors header ({type(exc).__name__}: {str(exc)[:200]})"
                               ) from exc
    segments.sort(key=_key)
    at = 8 + size
    for seg in segments:
        if min(seg.shape, default=0) < 0 or seg.offset != at or ends[seg.name] - seg.offset != seg.nbytes:
            raise WeightsFileError(f"{path}: tensor {seg.name!r} does not sit where the header's offsets "
                                   f"say, or leaves a hole or an overlap; not a valid safetensors file")
        at += seg.nbytes
    if at != nbytes:
        raise Unaccounted(f"{path}: the header's tensors cover {at} bytes of the file's {nbytes}; the header "
                          f"must account for the whole file (a sparse or padded file?), so the rest is not read")
    return segments


def _check_destination(path: Path, seg: Segment, dest) -> None:
    problem = None
    if not isinstance(dest, np.ndarray):
        problem = f"is a {type(dest).__name__}, not a numpy array"
    elif dest.shape != seg.shape or dest.dtype != numpy_dtype(seg.dtype):
        problem = f"is {dest.dtype}{list(dest.shape)}, the file holds {seg.dtype}{list(seg.shape)}"
    elif not (dest.flags.c_contiguous and dest.flags.writeable):
        problem = "is not a writable C-contiguous array"
    if problem:
        raise WeightsFileError(f"{path}: destination for {seg.name!r} {problem}")


def _read_hashed(fd: int, path: Path, dest: memoryview, hasher, stop: threading.Event | None) -> None:
    for pos in range(0, len(dest), CHUNK_BYTES):
        if _stop_reading is not None and _stop_reading():
            raise ReadInterrupted(f"{path}: read stopped at byte {pos} of {len(dest)}: evald was told to stop")
        if stop is not None and stop.is_set():
            raise Abandoned(f"{path}: read abandoned: another file of this checkpoint failed")
        chunk = dest[pos:pos + CHUNK_BYTES]
        done = 0
        while done < len(chunk):
            got = os.readv(fd, [chunk[done:]])
            if got == 0:
                raise WeightsFileError(f"{path}: file ended early (truncated while being read)")
            done += got
        hasher.update(chunk)
