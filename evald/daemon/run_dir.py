"""Where a run's TensorBoard events and evald's state live: ``LOGDIR/RUN_NAME/``.

One log directory holds many runs side by side (one evald per training run), the
way TensorBoard expects them::

    LOGDIR/                       default: the sibling "tensorboard" of CKPT_DIR
      exp1/                       one run directory per checkpoint directory
        train/  events...         TensorBoard run "exp1/train": training scalars
        eval/   events...         TensorBoard run "exp1/eval": evaluations, same tag names
        evald-run.json            which checkpoint directory this run serves
        ledger.sqlite evald.lock summary.json subset.json best.json
      exp2/ ...

Nothing is written in the checkpoint directory. The run name is chosen once
(``--run-name``, else from the checkpoint directory's path) and kept: a restart
finds its run again through ``evald-run.json``, whatever name it would derive now.
A name is claimed by hard-linking a complete ``evald-run.json`` into place, which
fails if the file exists, so two evalds sharing a log directory never share a run.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from evald.contracts.outside_paths import OutsidePathError, resolve
from evald.files import mindformers as mindformers_layout

IDENTITY_FILE = "evald-run.json"
LEDGER_FILE = "ledger.sqlite"
LOCK_FILE = "evald.lock"
DEFAULT_LOGDIR_NAME = "tensorboard"
# Checkpoint-directory names that say nothing about the run: the parent's name is used instead.
GENERIC_NAMES = frozenset({"ckpt", "ckpts", "checkpoint", "checkpoints", "output", "outputs", "out", "save",
                           "saved", "saves", "models", "model", "weights", "snapshots", "runs"})

log = logging.getLogger("evald")


class RunDirError(RuntimeError):
    """The run directory cannot be used as asked; the message says why and what to do."""


@dataclass(frozen=True)
class RunDir:
    """One run's directory: its TensorBoard sub-runs and evald's state files."""

    path: Path
    ckpt_dir: Path

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def logdir(self) -> Path:
        return self.path.parent

    @property
    def ledger(self) -> Path:
        return self.path / LEDGER_FILE

    @property
    def lock(self) -> Path:
        return self.path / LOCK_FILE

    def __truediv__(self, name: str) -> Path:
        return self.path / name


def default_logdir(ckpt_dir: Path) -> Path:
    """``ckpt_dir`` resolved (resolved_ckpt_dir). Beside the checkpoint directory, never inside it: ``CKPT_DIR/../tensorboard`` (beside a
    MindFormers output directory for ``OUTPUT/checkpoint_network/rank_0``: not in its tree)."""
    return mindformers_layout.output_dir_of(ckpt_dir).parent / DEFAULT_LOGDIR_NAME


def default_run_name(ckpt_dir: Path) -> str:
    """The checkpoint directory's name, or its parent's when the name is generic (runs/exp1/ckpt: exp1);
    ``ckpt_dir`` resolved (resolved_ckpt_dir)."""
    path = mindformers_layout.output_dir_of(ckpt_dir)
    name = path.name
    if name.lower() in GENERIC_NAMES and path.parent.name:
        name = path.parent.name
    name = re.sub(r"[^A-Za-z0-9._+=@,-]", "_", name).lstrip("._-+=@,")[:128]
    return name or "run"


def resolved_ckpt_dir(path: Path | str) -> Path:
    """The checkpoint directory as every function here takes it: resolved once, where it enters (the
    server's attach, a command's options), so the functions below compare and name one path."""
    return _resolved(path, "the checkpoint directory")


def _resolved(path: Path | str, what: str) -> Path:
    """``path`` resolved safely (evald.contracts.outside_paths); RunDirError, exit 2, when it cannot be."""
    try:
        return resolve(path, what)
    except OutsidePathError as exc:
        raise RunDirError(f"{exc}; give another one") from None


def check_owned(path: Path, what: str = "run directory") -> None:
    """RunDirError unless ``path`` is a real directory (no link) of evald's uid (or root's): another user
    who created ``LOGDIR/RUN_NAME`` first (a shared --logdir, a world-writable parent of the checkpoint
    directory) would otherwise choose where evald's ledger goes, or what it is (docs/security.md)."""
    try:
        info = os.lstat(path)
    except OSError as exc:
        raise RunDirError(f"{what} {path} cannot be examined ({exc.strerror})") from None
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise RunDirError(f"{what} {path} is {'a symbolic link' if stat.S_ISLNK(info.st_mode) else 'not a directory'}"
                          f", not a directory evald made; remove it, or choose another --logdir or --run-name")
    if info.st_uid not in (os.getuid(), 0):
        raise RunDirError(f"{what} {path} is owned by uid {info.st_uid}, not by evald's uid {os.getuid()}: another "
                          f"user created it first, and evald keeps its ledger only where nobody else decides "
                          f"what is there; remove it, or choose another --logdir or --run-name")


def _warn_if_shared(logdir: Path) -> None:
    try:
        info = os.stat(logdir)
    except OSError:
        return
    if info.st_mode & 0o002 and not info.st_mode & stat.S_ISVTX:
        log.warning("the log directory %s may be written by anyone and has no sticky bit: another user could "
                    "rename evald's run directory away; use a directory others cannot write (or chmod +t)", logdir)


def read_identity(run_path: Path) -> dict | None:
    try:
        data = json.loads((Path(run_path) / IDENTITY_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def runs_in(logdir: Path) -> list[RunDir]:
    """Every run directory of ``logdir`` (those with an identity file), by name."""
    found = []
    try:
        entries = sorted(os.scandir(logdir), key=lambda e: e.name)
    except OSError:
        return []
    for entry in entries:
        identity = read_identity(Path(entry.path)) if entry.is_dir(follow_symlinks=False) else None
        if identity and isinstance(identity.get("ckpt_dir"), str):
            found.append(RunDir(Path(entry.path), Path(identity["ckpt_dir"])))
    return found


def find_run(ckpt_dir: Path, logdir: Path) -> RunDir | None:
    """The run of ``logdir`` that serves ``ckpt_dir`` (resolved), if any (read-only)."""
    return next((run for run in runs_in(logdir) if run.ckpt_dir == ckpt_dir), None)


def open_run(ckpt_dir: Path, logdir: Path | None, run_name: str | None) -> RunDir:
    """Find this checkpoint directory's run in the log directory, or claim a new one.

    ``ckpt_dir`` is resolved (resolved_ckpt_dir). Raises RunDirError when ``run_name`` belongs to another
    checkpoint directory, or when this checkpoint directory is already served under another name.
    """
    logdir = _resolved(logdir, "the log directory (--logdir)") if logdir else default_logdir(ckpt_dir)
    if logdir == ckpt_dir or ckpt_dir in logdir.parents:
        log.warning("the log directory %s is inside the checkpoint directory %s: evald writes there because it "
                    "was told to, but the trainer's directory is best left to the trainer (the default log "
                    "directory is %s)", logdir, ckpt_dir, default_logdir(ckpt_dir))
    existing = find_run(ckpt_dir, logdir)
    if existing is not None:
        if run_name and existing.name != run_name:
            raise RunDirError(f"{ckpt_dir} is already served as run {existing.name!r} in {logdir}; start "
                              f"without --run-name, with --run-name {existing.name}, or rename the directory "
                              f"{existing.path} to {logdir / run_name} to rename the run")
        check_owned(existing.path)
        _warn_if_shared(logdir)
        return existing
    try:
        logdir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RunDirError(f"cannot create the log directory {logdir} ({exc.strerror}); choose one with "
                          f"--logdir") from None
    _warn_if_shared(logdir)
    try:
        return _claim_a_name(ckpt_dir, logdir, run_name)
    except OSError as exc:
        raise RunDirError(f"cannot create a run directory in {logdir}: {exc}; choose another --logdir") from None


def _claim_a_name(ckpt_dir: Path, logdir: Path, run_name: str | None) -> RunDir:
    if run_name:
        if not _claim(logdir / run_name, ckpt_dir):
            other = read_identity(logdir / run_name) or {}
            raise RunDirError(f"run {run_name!r} in {logdir} serves {other.get('ckpt_dir', 'another directory')}, "
                              f"not {ckpt_dir}; give this one another --run-name")
        return RunDir(logdir / run_name, ckpt_dir)
    base = default_run_name(ckpt_dir)
    for n in range(1, 10_000):
        name = base if n == 1 else f"{base}-{n}"
        if _claim(logdir / name, ckpt_dir):
            return RunDir(logdir / name, ckpt_dir)
    raise RunDirError(f"no free run name {base}-N in {logdir}; give one with --run-name")


def _claim(path: Path, ckpt_dir: Path) -> bool:
    """True when ``path`` is (now) the run directory of ``ckpt_dir``; False if another run has it."""
    if os.path.lexists(path) and os.path.isdir(path):
        check_owned(path)  # before reading or writing anything in it
    identity = read_identity(path)
    if identity is not None:
        return identity.get("ckpt_dir") == str(ckpt_dir)
    if path.exists() and not path.is_dir():
        return False
    path.mkdir(exist_ok=True)
    text = json.dumps({"ckpt_dir": str(ckpt_dir), "created_at": time.time(), "host": socket.gethostname(),
                       "pid": os.getpid()}, indent=1)
    tmp = path / f".{IDENTITY_FILE}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    try:
        os.link(tmp, path / IDENTITY_FILE)  # fails if another evald claimed the name first
    except FileExistsError:
        return (read_identity(path) or {}).get("ckpt_dir") == str(ckpt_dir)
    finally:
        os.unlink(tmp)
    return True


def locate(run_dir: Path | None, ckpt_dir: Path | None, logdir: Path | None, run_name: str | None) -> Path:
    """The run directory an ``evald status``/``retry`` command means (read-only); RunDirError if unclear."""
    if run_dir:
        return Path(run_dir)
    if ckpt_dir is None and logdir is None:
        raise RunDirError("say which run: --ckpt-dir DIR (and --logdir if evald was given one), "
                          "or --run-dir LOGDIR/RUN_NAME")
    ckpt = resolved_ckpt_dir(ckpt_dir) if ckpt_dir is not None else None
    logdir = Path(logdir) if logdir else default_logdir(ckpt)  # type: ignore[arg-type]
    if run_name:
        return logdir / run_name
    if ckpt is not None:
        run = find_run(ckpt, logdir)
        if run is not None:
            return run.path
        raise RunDirError(f"no run in {logdir} serves {ckpt}; has evald started on it? "
                          f"(give --logdir if evald was given one)")
    runs = runs_in(logdir)
    if len(runs) == 1:
        return runs[0].path
    names = ", ".join(r.name for r in runs) or "none"
    raise RunDirError(f"{logdir} holds {len(runs)} runs ({names}): give --run-name or --ckpt-dir")
