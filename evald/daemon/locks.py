"""Exclusive locks that make a second evald refuse to start instead of taking over.

A ZeroMQ ipc bind silently replaces another process's socket file, and two evalds on
one ledger would both evaluate. So evald takes an advisory ``flock`` before it binds
an endpoint or serves a checkpoint directory; the kernel drops it when the process
dies (even by SIGKILL), so a crash never leaves a stale lock. The lock file holds
the owner's pid, host and command line, so the refusal can name the other process.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import socket
import sys
import time
from pathlib import Path

from evald.contracts.wire import SocketDirError, ensure_private_dir


class InUse(RuntimeError):
    """Another evald holds the lock; the message names it."""


class Lock:
    def __init__(self, path: Path, what: str, how_to_choose: str) -> None:
        self.path = Path(path)
        # Not through another user's link, not in a directory others may write (the socket or run directory).
        ensure_private_dir(self.path.parent, "the directory of the lock file")
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o600)
        except OSError as exc:
            raise SocketDirError(f"lock file {self.path} cannot be opened ({exc.strerror}): a link or not a "
                                 f"regular file? remove it") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise InUse(f"{what} is in use by {holder}; stop that evald first, or {how_to_choose}") from None
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": time.time(),
                                 "argv": sys.argv[:8]}).encode())
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock; the file stays (harmless, reused)
            self._fd = None


def _read_holder(fd: int) -> str:
    try:
        data = json.loads(os.pread(fd, 4096, 0) or b"{}")
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(data["since"]))
        return f"evald pid {data['pid']} on {data['host']} (since {since}: {' '.join(data['argv'])})"
    except (ValueError, KeyError, TypeError, OSError):
        return "another process (its lock file names no owner)"


def endpoint_lock_path(endpoint: str, socket_dir: Path) -> Path:
    """Beside an ipc socket file; in the socket directory for a tcp port."""
    if endpoint.startswith("ipc://"):
        return Path(endpoint[len("ipc://"):] + ".lock")
    return socket_dir / ("tcp-" + endpoint[len("tcp://"):].replace(":", "-").replace("*", "all") + ".lock")


def directory_lock_path(ckpt_dir: Path, socket_dir: Path) -> Path:
    """One lock per checkpoint directory (resolved: the server's attach resolves it once) per host and user,
    whatever log directory evald uses."""
    digest = hashlib.sha256(str(ckpt_dir).encode()).hexdigest()[:20]
    return socket_dir / f"serving-{digest}.lock"
