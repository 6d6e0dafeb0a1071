"""The checkpoint layout: the on-disk contract between the trainer hook and evald.

Documented for humans in docs/checkpoint-layout.md (directory names, commit
protocol, manifest). This module decides names and commits; the manifest is in
evald.contracts.manifest, the bytes move in evald.contracts.safetensors_io
(hashed on the same pass) and evald.contracts.parallel_io (files in parallel).

Commit (after Orbax's atomic-rename temporary path): every weights file into a
hidden temp directory in ``ckpt_dir``, each hashed as written and fsynced;
``MANIFEST.json`` last, fsynced; fsync the temp directory, rename it to
``step_<N>``, fsync ``ckpt_dir``. A reader never sees a final name without a
complete manifest; a crash leaves only a temp directory, which the trainer's
writer removes at its next start (``remove_orphaned_temps``).

This module imports neither mindspore nor zmq: the trainer's background
writer thread and evald both use it.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import socket
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from evald.contracts import integrity, parallel_io, partition
from evald.contracts import safetensors_io as sio
from evald.contracts import small_files
from evald.contracts.manifest import (  # noqa: F401  (public names of the layout contract)
    HASH_ALGORITHM, HASH_VERSION, LAYOUT_VERSION, MANIFEST_FILE, READABLE_VERSIONS, WEIGHTS_FILE,
    AlreadyCommitted, FileSpec, LayoutError, Manifest, ParamSpec, ResumeInfo,
)

RUN_FILE = "RUN.json"
RUN_END_FILE = "RUN_END.json"
EVALD_SUBDIR = "evald"
STEP_DIR_PATTERN = re.compile(r"step_([0-9]{9,})")  # fullmatch: ASCII digits, no "\n"
TEMP_DIR_PATTERN = re.compile(r"\.step_([0-9]+)(?:-part-[0-9]+-of-[0-9]+)?\.tmp-[0-9a-f]+")  # a whole snapshot or a part
# A snapshot larger than this is split into files of about this size (whole parameters each),
# written, hashed and later read in parallel threads. See docs/performance.md for the choice.
SHARD_BYTES = 128 << 20


def step_dir_name(step: int) -> str:
    """``step_000000100`` for step 100: zero-padded so names sort by step."""
    if step < 0:
        raise ValueError(f"checkpoint step must be >= 0, got {step}")
    return f"step_{step:09d}"


def parse_step_dir_name(name: str) -> int | None:
    """The step of a committed checkpoint directory name, or None for any other name."""
    match = STEP_DIR_PATTERN.fullmatch(name)
    return int(match.group(1)) if match else None


def is_temp_name(name: str) -> bool:
    """True for names that are, by any producer's convention, still being written."""
    return (
        name.startswith(".")
        or name.endswith(".tmp")
        or ".tmp" in name.rsplit("/", 1)[-1]
        or name.endswith(".part")
    )


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, payload: bytes) -> None:
    """Write a file so readers see the old or the new content, never a mix: a temporary beside it (named by
    host and pid too, so writers on several hosts of a shared filesystem never share one), fsynced, renamed
    into place, the directory fsynced; the temporary is removed if anything fails."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        with open(tmp, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    """atomic_write_bytes of UTF-8 text (small files: RUN.json, summary.json, best.json...)."""
    atomic_write_bytes(path, text.encode("utf-8"))


# ---------------------------------------------------------------- writing


def plan_files(weights: Mapping[str, np.ndarray], shard_bytes: int = SHARD_BYTES
               ) -> list[tuple[str, list[tuple[str, np.ndarray]]]]:
    """Split ``weights`` into named files of about ``shard_bytes`` (whole parameters, in order)."""
    groups = parallel_io.split_by_size(list(weights.items()), shard_bytes)
    if len(groups) == 1:
        return [(WEIGHTS_FILE, groups[0])]
    return [(f"weights-{i:05d}-of-{len(groups):05d}.safetensors", g) for i, g in enumerate(groups, 1)]


def write_checkpoint(
    ckpt_dir: Path,
    step: int,
    weights: Mapping[str, np.ndarray],
    *,
    run_id: str,
    epoch: int | None = None,
    resume: ResumeInfo | None = None,
    producer: Mapping[str, Any] | None = None,
    before_commit: Callable[[Path], None] | None = None,
    shard_bytes: int = SHARD_BYTES,
    threads: int | None = None,
    part: partition.PartInfo | None = None,
    slices: Mapping[str, partition.SliceSpec] | None = None,
    hash_algorithm: str = HASH_ALGORITHM,
) -> Path:
    """Commit ``weights`` (host numpy arrays) as checkpoint ``step``, or as ``part`` of it; return its directory.

    AlreadyCommitted if that step is committed (a resumed run repeating a step keeps
    the first); OSError on IO failure (the temp directory is removed). ``before_commit``
    is a test seam run on the complete temp directory just before the rename. A part (layout version 3)
    lists in ``slices`` the parameters it holds only a region of (evald.contracts.partition).
    ``hash_algorithm``: each file's integrity check (evald.contracts.integrity: ``xxh3-128`` or ``sha256``).
    """
    check = integrity.for_writing(hash_algorithm)  # an unknown name is refused before anything is written
    ckpt_dir = Path(ckpt_dir)
    final = ckpt_dir / (partition.part_dir_name(step, part.index, part.count) if part else step_dir_name(step))
    if final.exists():
        raise AlreadyCommitted(f"checkpoint {final} is already committed; not overwriting it")
    plan = plan_files(weights, shard_bytes)
    tmp = ckpt_dir / f".{final.name}.tmp-{secrets.token_hex(6)}"
    tmp.mkdir(parents=True)
    try:
        written = parallel_io.write_files(tmp, plan, check.algorithm, threads)
        order = {name: i for i, name in enumerate(weights)}
        manifest = Manifest(
            run_id=run_id,
            step=int(step),
            epoch=epoch,
            commit_time=time.time(),
            files=tuple(FileSpec(w.name, w.nbytes, w.digest, part and part.rank) for w in written),
            params=tuple(sorted((ParamSpec(s.name, s.shape, s.dtype, w.name, s.offset, (slices or {}).get(s.name))
                                 for w in written for s in w.segments), key=lambda p: order[p.name])),
            resume=resume or ResumeInfo(),
            producer=dict(producer or {}),
            layout_version=partition.PARTS_LAYOUT_VERSION if part else LAYOUT_VERSION,
            parts=part,
            hash_algorithm=check.algorithm,
            hash_version=check.version,
        )
        manifest_path = tmp / MANIFEST_FILE
        with open(manifest_path, "w", encoding="utf-8") as f:
            f.write(manifest.to_json())
            f.flush()
            os.fsync(f.fileno())
        fsync_dir(tmp)
        if before_commit is not None:
            before_commit(tmp)
        os.rename(tmp, final)  # atomic; fails if `final` appeared meanwhile
        fsync_dir(ckpt_dir)
        return final
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# ---------------------------------------------------------------- reading


def read_manifest(step_dir: Path) -> Manifest:
    """The manifest of a committed checkpoint; LayoutError if absent or invalid."""
    path = Path(step_dir) / MANIFEST_FILE
    try:
        text = small_files.read_regular_text(path, small_files.MAX_MANIFEST_BYTES)  # no FIFO, link, 10 GB
    except FileNotFoundError as exc:
        raise LayoutError(
            f"{step_dir}: no {MANIFEST_FILE}; the directory was not committed by the "
            f"evald layout (half-written or foreign), so it is not evaluated"
        ) from exc
    except (OSError, ValueError) as exc:
        raise LayoutError(f"{path}: not read ({exc})") from exc
    return Manifest.from_json(text, source=str(path))


def read_checkpoint(step_dir: Path, manifest: Manifest, *, into: Mapping[str, np.ndarray] | None = None,
                    threads: int | None = None) -> dict[str, np.ndarray]:
    """``{parameter name: array}``: every file read once, in parallel, hashed as it is read.

    Sizes are checked before reading; no read goes past what the manifest declares.
    A parameter named in ``into`` (a writable C-contiguous array of its shape and
    dtype) is read straight into that array; other names of ``into`` are not touched.
    LayoutError names the file and the problem; the arrays of ``into`` then hold
    unspecified bytes until a later read succeeds.
    """
    step_dir, into = Path(step_dir), into or {}
    jobs = file_jobs(step_dir, manifest)
    for job in jobs:
        job["into"] = {s.name: into[s.name] for s in job["expected"] if s.name in into}
    try:
        arrays = parallel_io.read_files(jobs, threads)
    except sio.WeightsFileError as exc:
        raise LayoutError(str(exc)) from exc
    found = {(n, a.dtype.name, tuple(a.shape)) for n, a in arrays.items()}
    if found != {(p.name, p.dtype, p.shape) for p in manifest.params}:
        raise LayoutError(f"{step_dir}: the weights files hold other tensors (names, dtypes or shapes) "
                          f"than {MANIFEST_FILE} lists")
    return {p.name: arrays[p.name] for p in manifest.params}


def file_jobs(step_dir: Path, manifest: Manifest) -> list[dict[str, Any]]:
    """For each weights file of the checkpoint at ``step_dir``, the keyword arguments with which
    safetensors_io reads or verifies it (path, size, digest, check, the tensors the manifest says it holds,
    and the directory no link is followed below: ``step_dir``'s parent); each file's size checked against
    its tensors first (``check_accounted``), before a byte of any file is read. Every reader of evald's
    layout, one device or a tensor-parallel rank, checks the same."""
    step_dir = Path(step_dir)
    jobs = []
    for spec in manifest.files:
        params = [p for p in manifest.params if p.file == spec.name]
        check_accounted(step_dir / spec.name, spec.bytes, params)
        expected = [sio.Segment(p.name, p.dtype, p.shape, p.offset) for p in params]
        jobs.append({"path": step_dir / spec.name, "nbytes": spec.bytes, "digest": spec.digest,
                     "algorithm": manifest.hash_algorithm, "expected": expected, "root": step_dir.parent})
    return jobs


def header_bound(names: Sequence[str]) -> int:
    """The most bytes a safetensors file of tensors ``names`` needs beyond their data: the length
    prefix, JSON of at most 6 bytes a character (``\\uXXXX``) per name plus each entry's dtype, shape and
    offsets, a metadata entry and 8-byte padding."""
    return 8 + 4096 + sum(6 * len(name) + 256 for name in names) + 7


def check_accounted(path: Path, nbytes: int, params: Sequence[ParamSpec]) -> None:
    """Refuse, before a byte is read, a file the manifest's tensors do not account for: its size is
    their data plus at most a header (header_bound). The tensors must fit the network (checked from
    the manifest before this), so a checkpoint never costs more reading than the network holds; a
    sparse 1 TiB file with a tiny header is refused here at once."""
    data = sum(sio.Segment(p.name, p.dtype, p.shape, p.offset or 0).nbytes for p in params)
    bound = header_bound([p.name for p in params])
    if not 0 <= nbytes - data <= bound:
        raise LayoutError(f"{path}: the manifest says {nbytes} bytes but its tensors account for {data} bytes "
                          f"and a header for at most {bound}; a sparse or padded file (or a lying manifest) "
                          f"is not read")


def list_committed(ckpt_dir: Path) -> list[tuple[int, Path]]:
    """(step, directory) of every committed evald-layout checkpoint, by step."""
    found = []
    try:
        entries = list(os.scandir(ckpt_dir))
    except FileNotFoundError:
        return []
    for entry in entries:
        step = parse_step_dir_name(entry.name)
        if step is not None and entry.is_dir() and (Path(entry.path) / MANIFEST_FILE).exists():
            found.append((step, Path(entry.path)))
    return sorted(found)


def remove_orphaned_temps(ckpt_dir: Path, older_than_s: float = 0.0) -> list[Path]:
    """Delete temp checkpoint directories left by a crashed writer; return what went.

    ``older_than_s`` protects a writer that is still running: only temps whose
    last change (of the directory or any file in it) is at least that old go.
    """
    removed = []
    now = time.time()
    try:
        entries = list(os.scandir(ckpt_dir))
    except FileNotFoundError:
        return []
    for entry in entries:
        if not TEMP_DIR_PATTERN.fullmatch(entry.name):
            continue
        try:
            changed = max([entry.stat().st_mtime] + [e.stat().st_mtime for e in os.scandir(entry.path)])
        except (FileNotFoundError, NotADirectoryError):
            continue
        if now - changed < older_than_s:
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        removed.append(Path(entry.path))
    return removed


def write_run_file(ckpt_dir: Path, announcement_json: str) -> Path:
    path = Path(ckpt_dir) / RUN_FILE
    atomic_write_text(path, announcement_json)
    return path


def read_run_file(ckpt_dir: Path, name: str = RUN_FILE) -> str | None:
    """None when absent; small_files.UnsafeFile (a link, FIFO, device, too big) or OSError otherwise."""
    try:
        return small_files.read_regular_text(Path(ckpt_dir) / name, small_files.MAX_RUN_FILE_BYTES)
    except FileNotFoundError:
        return None


# The end of a run, recorded by the trainer next to its checkpoints (the run_finished message
# JSON), so an evald that missed the message still learns that the run is over.

def write_run_end(ckpt_dir: Path, run_finished_json: str) -> Path:
    path = Path(ckpt_dir) / RUN_END_FILE
    atomic_write_text(path, run_finished_json)
    return path


def remove_run_end(ckpt_dir: Path) -> None:
    """A run starting in a directory clears the end of the previous run there."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(Path(ckpt_dir) / RUN_END_FILE)

