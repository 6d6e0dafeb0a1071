"""The one trust rule for a file evald runs as code: who owns it, and who else may write it.

evald runs code named by files: a RUN.json names factories (evald.intake.trust), a suite's task
YAML is code too (lm-eval's ``!function module.fn`` imports ``module.py`` beside it and runs it;
evald.pipeline.suites.task_files). Such a file, and the directory holding it, is trusted only when
evald's own uid (or root) owns it and neither group nor others may write it: whoever else could
write it could run anything as evald's user. A directory further up may be written by others only
with the sticky bit (``/tmp``): then nobody but its owner can rename evald's directory away and put
their own in its place. docs/security.md lists what is judged this way.

May import: the standard library only.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


def why_untrusted(info: os.stat_result, what: str) -> str | None:
    """None when ``info`` (the ``stat`` of ``what``) is of evald's uid or root and nobody else may write it."""
    if info.st_uid not in (os.getuid(), 0):
        return f"{what} is owned by uid {info.st_uid}, not by evald's uid {os.getuid()} (or root)"
    if info.st_mode & 0o022:
        return f"group or others can write {what} (mode {oct(stat.S_IMODE(info.st_mode))})"
    return None


def why_untrusted_path(path: Path) -> str | None:
    """The rule for the file or directory at ``path`` (following links: what is read is judged)."""
    try:
        info = os.stat(path)
    except OSError as exc:
        return f"{path} cannot be examined ({exc.strerror})"
    return why_untrusted(info, str(path))


def why_untrusted_above(directory: Path) -> str | None:
    """None when no directory above ``directory`` (itself excluded) lets someone else swap it: each is
    evald's uid's or root's, and writable by others only with the sticky bit."""
    for parent in Path(os.path.realpath(directory)).parents:
        try:
            info = os.stat(parent)
        except OSError as exc:
            return f"{parent} cannot be examined ({exc.strerror})"
        if info.st_uid not in (os.getuid(), 0):
            return (f"{parent}, a directory above {directory}, is owned by uid {info.st_uid}, not by evald's uid "
                    f"{os.getuid()} (or root): its owner can replace what is below it")
        if info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX:
            return (f"group or others can write {parent}, a directory above {directory}, and it has no sticky bit "
                    f"(mode {oct(stat.S_IMODE(info.st_mode))}): they can rename what is below it and put their own")
    return None
