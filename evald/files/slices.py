"""An eval rank's slice of a parameter, read from the stored pieces of any layout: only the byte ranges
it needs.

A parameter is stored as pieces (boxes of its global shape, each a C-ordered tensor at some byte
offset of some safetensors file): the chunks of a MindFormers Checkpoint 2.0 iteration
(evald.files.checkpoint2), the slices or row ranges of evald's partitioned snapshots, or one whole
tensor. An eval rank of a tensor-parallel group wants one box of it (``tp_region``: its 1/N along
the cut dimension, or all of it). ``plan_reads`` intersects the two and turns each intersection into
runs of contiguous bytes: where the wanted box covers the inner dimensions of a piece entirely, a run
spans them, so a cut along the first dimension is one run per piece, and a cut along the last is one
run per row. ``read_region`` reads exactly those runs with ``os.pread`` into the rank's array, each file opened
under the one rule (evald.contracts.safe_open: a FIFO, link or device is refused at once, never waited on):
no rank touches a byte it does not hold, whatever layout the pieces were written in
(bench/reshard_read.py measures the bytes). The pieces must tile the wanted box (the caller has
checked that the pieces tile the parameter: evald.files.checkpoint2, evald.files.parts).
"""

from __future__ import annotations

import errno
import itertools
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from evald.contracts import safetensors_io as sio
from evald.contracts.safe_open import OpenedFile, UnsafeFile, open_beneath
from evald.files.errors import CheckpointError, CheckpointFileBad

Region = tuple[tuple[int, int], ...]
_NO_LIMIT = 1 << 62   # reads stay inside the file: each run's length is checked


@dataclass(frozen=True)
class Piece:
    """A stored box of a parameter: ``region`` of the global shape, C-ordered at ``offset`` of ``file``.
    ``file`` is opened under the one rule (evald.contracts.safe_open): no link below ``root`` (default: the
    file's own directory), never a FIFO or device; ``file_bytes``, when the manifest declares the file's
    size (evald's layout), is checked as one device checks it (evald.contracts.safetensors_io.open_weights)."""

    file: Path
    offset: int                       # absolute byte offset of its first element in the file
    region: Region
    root: Path | None = None
    file_bytes: int | None = None


@dataclass(frozen=True)
class Run:
    """``nbytes`` contiguous bytes at ``offset`` of ``file``, for ``dest`` (a box of the wanted region,
    relative to it)."""

    file: Path
    offset: int
    nbytes: int
    dest: tuple[slice, ...]
    shape: tuple[int, ...]            # of the elements the run holds, as they go into ``dest``
    root: Path | None = None          # the piece's (Piece)
    file_bytes: int | None = None


def tp_region(global_shape: Sequence[int], dim: int | None, degree: int, rank: int) -> Region:
    """The box rank ``rank`` of ``degree`` holds: 1/degree along ``dim`` (None: the whole tensor)."""
    region = [(0, int(d)) for d in global_shape]
    if dim is None or degree == 1:
        return tuple(region)
    size = int(global_shape[dim])
    if size % degree:
        raise CheckpointError(f"dimension {dim} of {list(global_shape)} cannot be cut into {degree} equal slices")
    width = size // degree
    region[dim] = (rank * width, (rank + 1) * width)
    return tuple(region)


def plan_reads(pieces: Sequence[Piece], want: Region, itemsize: int) -> list[Run]:
    """The byte runs that fill ``want`` from ``pieces``; CheckpointError if they leave part of it out."""
    runs: list[Run] = []
    covered = 0
    for piece in pieces:
        if not piece.region:  # a 0-d parameter: one element, whole
            runs.append(Run(piece.file, piece.offset, itemsize, (), (), piece.root, piece.file_bytes))
            covered += 1
            continue
        box = tuple((max(a, c), min(b, d)) for (a, b), (c, d) in zip(piece.region, want))
        if any(lo >= hi for lo, hi in box):
            continue
        shape = tuple(b - a for a, b in piece.region)
        local = tuple((lo - a, hi - a) for (lo, hi), (a, _) in zip(box, piece.region))
        covered += math.prod(hi - lo for lo, hi in box)
        # The innermost dimension k such that every dimension after it is taken whole from the piece:
        # one run spans dimensions k.. for each index of the dimensions before k.
        k = len(shape) - 1
        while k > 0 and local[k] == (0, shape[k]):
            k -= 1
        strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
        run_elems = (local[k][1] - local[k][0]) * strides[k]
        for outer in itertools.product(*(range(lo, hi) for lo, hi in local[:k])):
            first = sum(i * strides[d] for d, i in enumerate(outer)) + local[k][0] * strides[k]
            dest = tuple(slice(i + a - w, i + a - w + 1) for i, (a, _), (w, _) in
                         zip(outer, piece.region[:k], want[:k]))
            dest += tuple(slice(lo + a - w, hi + a - w) for (lo, hi), (a, _), (w, _) in
                          zip(local[k:], piece.region[k:], want[k:]))
            run_shape = (1,) * k + tuple(hi - lo for lo, hi in local[k:])
            runs.append(Run(piece.file, piece.offset + first * itemsize, run_elems * itemsize, dest, run_shape,
                            piece.root, piece.file_bytes))
    if covered != math.prod(b - a for a, b in want):
        raise CheckpointError(f"the stored pieces cover {covered} of the {math.prod(b - a for a, b in want)} "
                              f"elements of region {[list(r) for r in want]}")
    return runs


def read_region(runs: Sequence[Run], want: Region, dtype: np.dtype,
                into: np.ndarray | None = None) -> tuple[np.ndarray, int]:
    """The wanted box as an array, read run by run; and the bytes read. ``into``: an array of the box's
    shape and ``dtype`` to fill (a parameter's live memory), used when it fits, so that the host holds the
    weights once, not twice; a run whose destination is contiguous there is read straight into it."""
    shape = tuple(b - a for a, b in want)
    fits = (into is not None and into.shape == shape and into.dtype == dtype and into.flags.writeable)
    out = into if fits else np.empty(shape, dtype)
    nbytes = 0
    opened: dict[Path, OpenedFile] = {}
    try:
        for run in runs:
            if run.file not in opened:
                opened[run.file] = open_piece_file(run.file, run.root, run.file_bytes)
            fd = opened[run.file].fd
            target = out[run.dest] if run.dest else None
            if target is not None and target.flags.c_contiguous and target.nbytes == run.nbytes:
                got = os.preadv(fd, [target.reshape(-1).view(np.uint8)], run.offset)
            else:
                data = os.pread(fd, run.nbytes, run.offset)
                got = len(data)
                if got == run.nbytes:
                    out[run.dest] = np.frombuffer(data, dtype).reshape(run.shape)
            if got != run.nbytes:
                raise CheckpointFileBad(f"{run.file.name}: ended early (read {got} of {run.nbytes} bytes at "
                                        f"{run.offset}): truncated")
            nbytes += got
    finally:
        for file in opened.values():
            file.close()
    return out, nbytes


def open_piece_file(file: Path, root: Path | None, file_bytes: int | None) -> OpenedFile:
    """``file`` opened under the one rule (no link below ``root``, default its directory; a regular file, never
    waited on), of ``file_bytes`` when known. CheckpointFileBad says what it is instead; FileNotFoundError and
    PermissionError pass, for the caller to say deleted or unreadable."""
    root = file.parent if root is None else root
    try:
        if file_bytes is not None:
            return sio.open_weights(file, file_bytes, root)
        return open_beneath(root, file.relative_to(root), _NO_LIMIT)
    except sio.WeightsFileMissing as exc:
        raise FileNotFoundError(errno.ENOENT, "deleted", str(file)) from exc
    except (sio.WeightsFileError, UnsafeFile) as exc:
        raise CheckpointFileBad(str(exc)) from exc
