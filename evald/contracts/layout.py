"""The checkpoint layout: the on-disk contract between the trainer hook and evald.

Documented for humans in docs/checkpoint-layout.md. This module is the only
code that knows how a checkpoint directory is named, committed and verified.

A run directory (``ckpt_dir``) looks like this::

    ckpt_dir/
      RUN.json                      run announcement (atomic file write)
      step_000000100/               one committed, weights-only checkpoint
        weights.safetensors
        MANIFEST.json               written last; its presence means committed
      .step_000000200.tmp-<hex>/    a checkpoint being written (ignored)
      evald/                        evald's own output (ledger, events, best)

The commit protocol (after Orbax's atomic-rename temporary path):
  1. write every file into a hidden temp directory in ``ckpt_dir``; fsync each;
  2. write ``MANIFEST.json`` (sizes and sha256 of the weights) last; fsync it;
  3. fsync the temp directory, ``rename`` it to ``step_<N>``, fsync ``ckpt_dir``.
A reader therefore never sees a final name without a complete manifest, and a
crash leaves only a temp directory, which ``remove_orphaned_temps`` cleans.

This module imports neither mindspore nor zmq: the trainer's background
writer thread and evald both use it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

LAYOUT_VERSION = 1
RUN_FILE = "RUN.json"
RUN_END_FILE = "RUN_END.json"
MANIFEST_FILE = "MANIFEST.json"
WEIGHTS_FILE = "weights.safetensors"
EVALD_SUBDIR = "evald"
STEP_DIR_PATTERN = re.compile(r"^step_(\d{9,})$")
TEMP_DIR_PATTERN = re.compile(r"^\.step_(\d+)\.tmp-[0-9a-f]+$")
_HASH_CHUNK = 4 << 20


class LayoutError(ValueError):
    """A checkpoint directory does not follow the layout (or fails verification)."""


class AlreadyCommitted(FileExistsError):
    """That step is already committed: a resumed run repeating a step keeps the first checkpoint."""


def step_dir_name(step: int) -> str:
    """``step_000000100`` for step 100: zero-padded so names sort by step."""
    if step < 0:
        raise ValueError(f"checkpoint step must be >= 0, got {step}")
    return f"step_{step:09d}"


def parse_step_dir_name(name: str) -> int | None:
    """The step of a committed checkpoint directory name, or None for any other name."""
    match = STEP_DIR_PATTERN.match(name)
    return int(match.group(1)) if match else None


def is_temp_name(name: str) -> bool:
    """True for names that are, by any producer's convention, still being written."""
    return (
        name.startswith(".")
        or name.endswith(".tmp")
        or ".tmp" in name.rsplit("/", 1)[-1]
        or name.endswith(".part")
    )


@dataclass(frozen=True)
class ParamSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class ResumeInfo:
    """What a resume needs beyond the weights (the seed article, section 4.4)."""

    learning_rate: float | None = None
    loss_scale: float | None = None
    seed: int | None = None
    data_offset: int | None = None


@dataclass(frozen=True)
class Manifest:
    run_id: str
    step: int
    epoch: int | None
    commit_time: float
    weights_file: str
    weights_bytes: int
    weights_sha256: str
    params: tuple[ParamSpec, ...]
    resume: ResumeInfo = field(default_factory=ResumeInfo)
    producer: Mapping[str, Any] = field(default_factory=dict)
    layout_version: int = LAYOUT_VERSION

    def to_json(self) -> str:
        data = asdict(self)
        data["params"] = [
            {"name": p.name, "shape": list(p.shape), "dtype": p.dtype} for p in self.params
        ]
        return json.dumps(data, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str, source: str = "<manifest>") -> "Manifest":
        try:
            data = json.loads(text)
            if data.get("layout_version") != LAYOUT_VERSION:
                raise LayoutError(
                    f"{source}: layout_version {data.get('layout_version')!r} is not "
                    f"{LAYOUT_VERSION}; upgrade evald or the trainer hook so both agree"
                )
            params = tuple(
                ParamSpec(p["name"], tuple(int(d) for d in p["shape"]), str(p["dtype"]))
                for p in data["params"]
            )
            return cls(
                run_id=str(data["run_id"]),
                step=int(data["step"]),
                epoch=None if data.get("epoch") is None else int(data["epoch"]),
                commit_time=float(data["commit_time"]),
                weights_file=str(data["weights_file"]),
                weights_bytes=int(data["weights_bytes"]),
                weights_sha256=str(data["weights_sha256"]),
                params=params,
                resume=ResumeInfo(**data.get("resume") or {}),
                producer=dict(data.get("producer") or {}),
            )
        except LayoutError:
            raise
        except (ValueError, KeyError, TypeError) as exc:
            raise LayoutError(f"{source}: not a valid manifest ({exc!r})") from exc


# ---------------------------------------------------------------- low-level IO


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_text(path: Path, text: str) -> None:
    """Write a small file so readers see the old or the new content, never a mix."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{secrets.token_hex(4)}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def sha256_of_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


# ---------------------------------------------------------------- writing


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
) -> Path:
    """Commit ``weights`` (host numpy arrays) as checkpoint ``step``; return its directory.

    Raises AlreadyCommitted if that step is already committed (a resumed run that
    repeats a step keeps the first checkpoint), OSError on IO failure (the temp
    directory is removed). ``before_commit`` is a test seam: it runs with the
    complete temp directory just before the rename.
    """
    from safetensors.numpy import save_file  # a mindspore dependency; lazy for fast import

    ckpt_dir = Path(ckpt_dir)
    final = ckpt_dir / step_dir_name(step)
    if final.exists():
        raise AlreadyCommitted(f"checkpoint {final} is already committed; not overwriting it")
    tmp = ckpt_dir / f".{step_dir_name(step)}.tmp-{secrets.token_hex(6)}"
    tmp.mkdir(parents=True)
    try:
        weights_path = tmp / WEIGHTS_FILE
        arrays = {name: np.ascontiguousarray(arr) for name, arr in weights.items()}
        save_file(arrays, str(weights_path))
        os.chmod(weights_path, 0o644)  # like the manifest: evald may run as another user
        with open(weights_path, "rb+") as f:
            os.fsync(f.fileno())
        manifest = Manifest(
            run_id=run_id,
            step=int(step),
            epoch=epoch,
            commit_time=time.time(),
            weights_file=WEIGHTS_FILE,
            weights_bytes=weights_path.stat().st_size,
            weights_sha256=sha256_of_file(weights_path),
            params=tuple(
                ParamSpec(name, tuple(int(d) for d in arr.shape), str(arr.dtype))
                for name, arr in arrays.items()
            ),
            resume=resume or ResumeInfo(),
            producer=dict(producer or {}),
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
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise LayoutError(
            f"{step_dir}: no {MANIFEST_FILE}; the directory was not committed by the "
            f"evald layout (half-written or foreign), so it is not evaluated"
        ) from exc
    return Manifest.from_json(text, source=str(path))


def verify_weights(step_dir: Path, manifest: Manifest) -> Path:
    """Check the weights file's size and sha256 against the manifest; return its path."""
    path = Path(step_dir) / manifest.weights_file
    try:
        size = path.stat().st_size
    except FileNotFoundError as exc:
        raise LayoutError(f"{path}: weights file missing (deleted after commit?)") from exc
    if size != manifest.weights_bytes:
        raise LayoutError(
            f"{path}: {size} bytes on disk but the manifest says {manifest.weights_bytes} "
            f"(truncated or overwritten after commit)"
        )
    digest = sha256_of_file(path)
    if digest != manifest.weights_sha256:
        raise LayoutError(
            f"{path}: sha256 {digest[:16]}… does not match the manifest's "
            f"{manifest.weights_sha256[:16]}… (corrupted on disk: bit flip or partial copy)"
        )
    return path


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
    last change is at least that old are removed.
    """
    removed = []
    now = time.time()
    try:
        entries = list(os.scandir(ckpt_dir))
    except FileNotFoundError:
        return []
    for entry in entries:
        if not TEMP_DIR_PATTERN.match(entry.name):
            continue
        try:
            if now - entry.stat().st_mtime < older_than_s:
                continue
        except FileNotFoundError:
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        removed.append(Path(entry.path))
    return removed


def write_run_file(ckpt_dir: Path, announcement_json: str) -> Path:
    path = Path(ckpt_dir) / RUN_FILE
    atomic_write_text(path, announcement_json)
    return path


def read_run_file(ckpt_dir: Path, name: str = RUN_FILE) -> str | None:
    try:
        return (Path(ckpt_dir) / name).read_text(encoding="utf-8")
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


# ---------------------------------------------------------------- best pointer
# evald writes ckpt_dir/evald/best.json; the trainer hook reads it so that its
# cleanup of old checkpoints never deletes the best one.

BEST_FILE = "best.json"


def best_pointer_path(ckpt_dir: Path) -> Path:
    return Path(ckpt_dir) / EVALD_SUBDIR / BEST_FILE


def write_best_pointer(ckpt_dir: Path, step: int, monitor: str, value: float) -> None:
    path = best_pointer_path(ckpt_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps({
        "step": int(step), "dir": step_dir_name(step), "monitor": monitor, "value": float(value),
        "updated_at": time.time(),
    }))


def read_best_step(ckpt_dir: Path) -> int | None:
    try:
        return int(json.loads(best_pointer_path(ckpt_dir).read_text())["step"])
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return None
