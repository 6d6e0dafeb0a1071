"""evald's own files (ledger, TensorBoard events, best.json, summary.json, subset.json, locks)
are private to its user unless the operator shares them with a group (``--state-mode``).

They hold evaluation results, file names and reasons for failures (docs/security.md): a
world-readable ledger tells every user of the host what evald saw. ``private`` creates them
0600 in a 0700 directory, ``group`` 0640 in 0750 (for a team that reads one TensorBoard
directory, or a trainer of another user in the same group that must read best.json).
The mode is set with the process umask, so every file evald or a library it calls
creates follows it (a log directory evald creates too); files an earlier evald left in
the run directory are tightened. A log directory that exists is left as it is: it may
be a TensorBoard directory the team shares.
"""

from __future__ import annotations

import errno
import fnmatch
import logging
import os
import stat
from pathlib import Path

from evald.daemon.run_dir import RunDirError

log = logging.getLogger("evald")

STATE_MODES = ("private", "group")
_MODES = {"private": (0o700, 0o600, 0o077), "group": (0o750, 0o640, 0o027)}  # directory, file, umask
STATE_FILES = ("ledger.sqlite*", "events.out.tfevents.*", "best.json", "summary.json", "subset.json", "evald.lock",
               "evald-run.json", "counters.json")
SUB_RUNS = ("train", "eval")  # evald.sinks.tensorboard.SUB_RUNS


def apply_umask(state_mode: str) -> None:
    """Every file this process creates from now on gets at most the mode of ``state_mode``."""
    os.umask(_MODES[state_mode][2])


def prepare_state_dir(run_dir: Path, state_mode: str) -> None:
    """Tighten evald's run directory, its sub-runs and evald's files in them to ``state_mode``
    (they are created that way; this fixes those an earlier evald left more open)."""
    dir_mode, file_mode, _ = _MODES[state_mode]
    check_writable(run_dir)
    for directory in [run_dir, *(run_dir / sub for sub in SUB_RUNS)]:
        try:
            info = os.lstat(directory)
        except FileNotFoundError:
            continue
        _refuse_unless_ours(directory, info, stat.S_ISDIR, "a directory")
        if stat.S_IMODE(info.st_mode) & ~dir_mode:
            os.chmod(directory, stat.S_IMODE(info.st_mode) & dir_mode)
        for entry in os.scandir(directory):
            if any(fnmatch.fnmatch(entry.name, pattern) for pattern in STATE_FILES):
                _refuse_unless_ours(Path(entry.path), os.lstat(entry.path), stat.S_ISREG, "a regular file")
                _tighten(Path(entry.path), file_mode)


def check_writable(run_dir: Path) -> None:
    """RunDirError naming ``run_dir`` (or a state file in it) when evald cannot write there: an immutable
    directory (``chattr +i``, which stops root too), a read-only mount, missing permissions. Found now, by
    creating and removing a probe file, rather than as sqlite's "unable to open database file" later. A
    full disk is left to the disk-full wait (evald.ledger.disk_full)."""
    probe = run_dir / f".evald-write-probe-{os.getpid()}"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
        os.unlink(probe)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return
        raise RunDirError(_cannot_write(run_dir, exc.strerror or str(exc))) from None
    for entry in os.scandir(run_dir):
        if (any(fnmatch.fnmatch(entry.name, pattern) for pattern in STATE_FILES) and entry.is_file(follow_symlinks=False)
                and not os.access(entry.path, os.W_OK)):
            raise RunDirError(_cannot_write(Path(entry.path), "it is read-only, or immutable"))


def _cannot_write(path: Path, why: str) -> str:
    return (f"evald cannot write {path} ({why}): its ledger and TensorBoard events live there. Make it writable "
            f"(an immutable one: `lsattr -d {path}`, then `chattr -i`; a read-only mount: mount it read-write), "
            f"or choose another --logdir or --run-name")


def _refuse_unless_ours(path: Path, info: os.stat_result, kind, what: str) -> None:
    """RunDirError unless ``path`` is ``what`` (not a link) of evald's uid (or root's). Checked on every
    state file before evald opens one: in a directory nobody else can write (checked too) nothing can
    be swapped in afterwards, so sqlite and the TensorBoard writer never follow a planted link."""
    if stat.S_ISLNK(info.st_mode):
        raise RunDirError(f"{path} is a symbolic link; evald's state files are never links (another user's "
                          f"plant, or a copy made by hand?): remove it, or choose another --logdir or --run-name")
    if not kind(info.st_mode):
        raise RunDirError(f"{path} is not {what}; remove it, or choose another --logdir or --run-name")
    if info.st_uid not in (os.getuid(), 0):
        raise RunDirError(f"{path} is owned by uid {info.st_uid}, not by evald's uid {os.getuid()}: evald "
                          f"does not use state another user controls; remove it, or choose another --logdir "
                          f"or --run-name")


def _tighten(path: Path, file_mode: int) -> None:
    try:
        info = os.lstat(path)
        if stat.S_ISREG(info.st_mode) and info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) & ~file_mode:
            os.chmod(path, stat.S_IMODE(info.st_mode) & file_mode)
    except OSError as exc:  # gone meanwhile, or not ours to change: leave it
        log.debug("could not tighten %s: %s", path, exc)
