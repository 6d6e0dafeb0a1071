"""Reading the small files of the checkpoint layout (MANIFEST.json, RUN.json, RUN_END.json)
so that no file can make the reader hang, exhaust memory or read outside where it points.

Anyone who can write the checkpoint directory controls these files: one could be a FIFO
(``open`` blocks forever), a link to ``/dev/zero`` (``read`` never ends), a link to a file
outside the directory, or 100 GB. So the file is opened once, without following a link in
its last component and without blocking, examined with ``fstat`` on that same descriptor
(no check-then-open race), and read up to a bound. The ``stat`` of what was read is
returned, so a caller that decides whether to trust a file (evald.intake.trust) judges exactly
the bytes it got. Part of the layout contract; imports neither mindspore nor zmq.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

MAX_MANIFEST_BYTES = 64 << 20   # ~400k parameters; a manifest is ~150 bytes per parameter
MAX_RUN_FILE_BYTES = 1 << 20    # RUN.json / RUN_END.json: one wire message (MAX_MESSAGE_BYTES)

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


class UnsafeFile(ValueError):
    """The file is not a regular file of a sane size (a link, FIFO, device, directory, too big)."""


def kind_of(mode: int) -> str:
    """What a non-regular file is, in words, for error messages."""
    return next((what for test, what in _KINDS if test(mode)), "not a regular file")


def hard_link_text(info: os.stat_result) -> str:
    """Why a regular file with several links is refused (no producer hard-links a checkpoint's files)."""
    return (f"is a hard link ({info.st_nlink} names for one file, maybe one outside the checkpoint directory); "
            f"neither MindSpore nor evald's writer hard-links, so it is not read: copy it instead")


def read_regular(path: Path, limit: int) -> tuple[bytes, os.stat_result]:
    """The bytes of ``path`` and the ``stat`` of the file they came from.

    FileNotFoundError when absent (callers decide what absence means); UnsafeFile for a
    link (symbolic or hard), anything but a regular file, or more than ``limit`` bytes; other OSErrors pass.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeFile(f"{path} is a symbolic link; links are not followed here") from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UnsafeFile(f"{path} is {kind_of(info.st_mode)}, not a regular file")
        if info.st_nlink > 1:
            raise UnsafeFile(f"{path} {hard_link_text(info)}")
        if info.st_size > limit:
            raise UnsafeFile(f"{path} is {info.st_size} bytes, more than the {limit} this file may have")
        chunks, total = [], 0
        while True:  # bounded even if the file grows while it is read
            chunk = os.read(fd, min(1 << 20, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise UnsafeFile(f"{path} grew past {limit} bytes while it was read")
        return b"".join(chunks), info
    finally:
        os.close(fd)


def read_regular_text(path: Path, limit: int) -> str:
    """``read_regular`` decoded as UTF-8 (UnicodeDecodeError is a ValueError)."""
    data, _ = read_regular(path, limit)
    return data.decode("utf-8")
