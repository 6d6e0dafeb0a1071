"""Several weights files written or read at once, one thread per usable core.

hashlib, ``os.write`` and ``os.readv`` release the GIL, so threads give real
parallelism. The first failure stops the other files at their next chunk and
is the error raised (not the "abandoned" errors it caused).
"""

from __future__ import annotations

import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from evald.contracts.safetensors_io import Abandoned, WrittenFile, read_file, verify_file, write_file


def split_by_size(items: Sequence[tuple[str, np.ndarray]], size: int) -> list[list[tuple[str, np.ndarray]]]:
    """Consecutive groups of about ``size`` bytes, never empty (one empty group for no items)."""
    total = sum(int(a.nbytes) for _, a in items)
    count = max(1, math.ceil(total / max(1, size)))
    target, groups, at = total / count, [[] for _ in range(count)], 0
    for name, array in items:  # each array goes to the group its middle byte falls in
        groups[min(count - 1, int((at + array.nbytes / 2) // target) if target else 0)].append((name, array))
        at += int(array.nbytes)
    return [g for g in groups if g] or [[]]


def write_files(directory: Path, plan: Sequence[tuple[str, Sequence[tuple[str, np.ndarray]]]],
                algorithm: str, threads: int | None = None) -> list[WrittenFile]:
    """Write each ``(file name, tensors)`` of ``plan`` into ``directory``, files in parallel."""
    stop = threading.Event()

    def one(item):
        try:
            return write_file(Path(directory) / item[0], item[1], algorithm, stop)
        except BaseException:
            stop.set()
            raise
    return _parallel(one, plan, threads)


def read_files(jobs: Sequence[Mapping], threads: int | None = None) -> dict[str, np.ndarray]:
    """Run ``read_file(**job)`` for each job, files in parallel; all tensors in one dict."""
    stop = threading.Event()

    def one(job):
        try:
            return read_file(**job, stop=stop)
        except BaseException:
            stop.set()
            raise
    out: dict[str, np.ndarray] = {}
    for arrays in _parallel(one, jobs, threads):
        out.update(arrays)
    return out


def verify_files(jobs: Sequence[Mapping], threads: int | None = None) -> int:
    """Run ``verify_file(**job)`` for each job (read_file's jobs without ``into``), files in parallel, each
    streamed through one buffer; the bytes verified. The first bad file is the error raised."""
    stop = threading.Event()

    def one(job):
        try:
            return verify_file(**job, stop=stop)
        except BaseException:
            stop.set()
            raise
    return sum(_parallel(one, jobs, threads))


def default_threads(files: int) -> int:
    """One thread per usable core (a pinned evald gets its own core count), at most one per file."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    return max(1, min(files, cores))


def _parallel(fn, items: Sequence, threads: int | None) -> list:
    if not items:
        return []
    workers = threads or default_threads(len(items))
    if workers <= 1 or len(items) == 1:
        return [fn(item) for item in items]
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="evald-io") as pool:
        futures = [pool.submit(fn, item) for item in items]
        errors = [f.exception() for f in futures]
    first = next((e for e in errors if e is not None and not isinstance(e, Abandoned)), None) or \
        next((e for e in errors if e is not None), None)
    if first is not None:
        raise first
    return [f.result() for f in futures]

