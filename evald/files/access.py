"""Whether evald may read a checkpoint file, and if not, a message that says it is a permission problem.

MindSpore's ``save_checkpoint`` makes every file it writes read-only for its owner
(mode 0400), so an evald running as another user cannot read MindFormers' or
``ModelCheckpoint``'s files. That says nothing about the file: such a file is kept
pending and judged again when it can be read (evald.intake.intake), never rejected for good.
Imports evald.contracts (the one rule for opening a file, evald.contracts.safe_open).
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
import sys
from pathlib import Path

from evald.contracts.safe_open import UnsafeFile, open_beneath


class Unreadable(OSError):
    """evald's user may not read the file (the message says who owns it and what to do)."""


def check_readable(path: Path, shown: str | None = None) -> None:
    """Raise Unreadable if this process may not open ``path`` for reading (FileNotFoundError passes through).

    Opened under the one rule (evald.contracts.safe_open) below its own directory: a FIFO does not block,
    a link is not followed. What the entry is (a link, a FIFO, a device) is not a permission problem: the
    caller judges that (evald.files.confine.examine), so such an entry passes here.
    """
    path = Path(path)
    try:
        with open_beneath(path.parent, path.name, sys.maxsize, single_link=False):
            pass
    except PermissionError as exc:
        raise Unreadable(permission_message(path, shown)) from exc
    except UnsafeFile:
        try:
            is_dir = stat.S_ISDIR(os.lstat(path).st_mode)
        except OSError:
            return
        if is_dir and not os.access(path, os.R_OK | os.X_OK):
            raise Unreadable(permission_message(path, shown)) from None


def permission_message(path: Path, shown: str | None = None) -> str:
    """``<name>: permission denied: evald runs as ..., the file is ...; <what to do>``.

    Says what is true wherever it is raised; the caller adds what happens next (pending or failed).
    """
    me = f"{_user(os.geteuid())} (uid {os.geteuid()}, groups {', '.join(_group(g) for g in _groups())})"
    try:
        st = path.stat()
        owner = (f"owned by {_user(st.st_uid)}:{_group(st.st_gid)} with mode "
                 f"{stat.S_IMODE(st.st_mode):04o}")
    except OSError as exc:  # the directory itself may not be searchable
        owner = f"not even visible ({exc.strerror})"
    return (f"{shown or path.name}: permission denied: evald runs as {me} and the file is {owner}; "
            f"a permission problem, not a bad checkpoint. MindSpore saves checkpoints readable by their "
            f"owner only (0400): run evald as the trainer's user, or make the files readable to evald's "
            f"user (e.g. chmod g+r, with evald's user in the file's group)")


def _groups() -> list[int]:
    return sorted({os.getegid(), *os.getgroups()})


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _group(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)
