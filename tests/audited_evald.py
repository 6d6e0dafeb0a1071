"""The real evald, with an audit hook that records every file it touches (PEP 578).

    python -m tests.audited_evald AUDIT_LOG [evald options...]

``sys.addaudithook`` sees, in every thread, each ``open`` and ``os.open``, ``os.remove``/
``unlink``, ``os.rename``/``replace``, ``os.rmdir``, ``os.mkdir``, ``shutil.rmtree``,
``os.listdir``/``scandir``, ``os.chmod``, ``os.truncate``, ``os.link``/``symlink``,
``sqlite3.connect``, and every process start (``os.system``, ``subprocess.Popen``,
``os.exec*``, ``os.posix_spawn``). Each becomes one line ``event<TAB>path<TAB>detail``
written with ``os.write`` to a descriptor opened before the hook was installed, so
writing the log is not itself audited and nothing is buffered (a crash loses nothing).
Every second a ``threads`` line lists the live thread names, and at exit a ``sys.path``
line records the import path.

``os.open(name, dir_fd=fd)`` (evald opens files below a directory that way) is recorded with the
directory the descriptor leads to. Not seen: files opened by C/C++ code without Python (MindSpore's own kernels and logs,
sqlite's ``-wal``/``-shm`` beside the ledger) and ``os.stat``/``lstat`` (no audit event).
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time

_FILE_EVENTS = {"open", "os.remove", "os.rename", "os.rmdir", "os.mkdir", "shutil.rmtree", "os.listdir",
                "os.scandir", "os.chmod", "os.truncate", "os.link", "os.symlink", "sqlite3.connect",
                "os.chown", "os.utime", "os.system", "subprocess.Popen", "os.exec", "os.posix_spawn",
                "os.spawn", "os.fork", "os.startfile"}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_OPENAT = threading.local()   # .base: the directory an os.open(..., dir_fd=) in this thread is relative to


def _text(value: object) -> str:
    if isinstance(value, bytes):
        value = os.fsdecode(value)
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if isinstance(value, str):
        if not value.startswith("/"):
            value = os.path.join(getattr(_OPENAT, "base", None) or os.getcwd(), value)
        return value.replace("\t", "\\t").replace("\n", "\\n").encode("utf-8", "backslashreplace").decode()
    return repr(value)


def _detail(event: str, args: tuple) -> str:
    if event == "open" and len(args) >= 3:
        mode, flags = args[1], args[2]
        writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            isinstance(flags, int) and flags & _WRITE_FLAGS)
        return "write" if writes else "read"
    if event == "os.rename" and len(args) >= 2:
        return "to " + _text(args[1])
    return ""


def install(log_path: str) -> None:
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    lock = threading.Lock()

    def emit(line: str) -> None:
        with lock:
            os.write(fd, (line + "\n").encode("utf-8", "backslashreplace"))

    def hook(event: str, args: tuple) -> None:
        if event not in _FILE_EVENTS:
            return
        try:
            path = args[0] if args else None
            if event == "subprocess.Popen":  # (executable, args, cwd, env): the command line as given
                argv = args[1] if isinstance(args[1], (list, tuple)) else [args[1]]
                emit(f"{event}\t{' '.join(map(str, argv))}\t")
                return
            if isinstance(path, int) and event not in ("os.system",):
                return  # an already-open descriptor: its open was recorded
            emit(f"{event}\t{_text(path)}\t{_detail(event, args)}")
        except Exception as exc:  # the hook must never break the process it watches
            emit(f"hook-error\t{event}\t{exc!r}")

    def threads() -> None:
        while True:
            emit("threads\t" + ",".join(sorted(t.name for t in threading.enumerate())) + f"\t{time.time():.1f}")
            time.sleep(1.0)

    real_os_open = os.open

    def os_open(path, flags, mode=0o777, *, dir_fd=None):
        """os.open; relative to ``dir_fd`` (openat, evald.contracts.safe_open), the audit event's path is
        given the directory that descriptor leads to, which the event itself does not carry."""
        if dir_fd is None:
            return real_os_open(path, flags, mode)
        _OPENAT.base = os.readlink(f"/proc/self/fd/{dir_fd}")
        try:
            return real_os_open(path, flags, mode, dir_fd=dir_fd)
        finally:
            _OPENAT.base = None

    os.open = os_open
    sys.addaudithook(hook)
    threading.Thread(target=threads, name="audit-threads", daemon=True).start()
    atexit.register(lambda: emit("sys.path\t" + os.pathsep.join(sys.path) + "\t"))


def main() -> int:
    install(sys.argv[1])
    from evald.cli.main import main as evald_main

    return evald_main(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
