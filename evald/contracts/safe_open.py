"""The one rule for opening a file that someone else may control (docs/security.md, "Reading files
that others may control"): wherever it is (the checkpoint directory, a Checkpoint 2.0 iteration, a
partitioned snapshot's parts, a backfill fleet's directory, per-sample files), evald opens it here.

Whoever can write such a directory can put a symbolic link there (to ``/dev/zero``, to a file of
another user, to a directory outside), a FIFO (``open`` blocks until a writer comes: forever), a
device, a hard link to a file elsewhere, a 1 TB sparse file, or swap a checked name for a link
between a check and an open. So:

* a path is given as a trusted ``root`` and a ``relative`` path below it; every component below
  the root is opened with ``O_NOFOLLOW`` relative to its parent's descriptor (``openat``), so no
  link anywhere below the root is followed, and no name is looked up twice (no check-then-open race);
* the file is opened ``O_NONBLOCK`` (a FIFO opens at once instead of waiting for a writer) and
  judged by ``fstat`` of that same descriptor: a regular file only, one link only (unless the
  caller knows its writer makes a second name for a moment), at most ``limit`` bytes;
* reads stop at the limit even if the file grows meanwhile.

The root itself is the caller's: a directory evald was told to use, resolved once where it entered
(evald.contracts.outside_paths). Part of the contracts because the layout's own small files are
read through it; imports nothing of evald.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Iterator

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC   # a directory, never through a link
_FILE_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | _CLOEXEC
_CHUNK = 1 << 20

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link"))


class UnsafeFile(ValueError):
    """Not a regular file of a sane size reached without a link (a link, FIFO, device, directory,
    hard link, too big, a name that climbs out); the message names the file and what it is, ``path``
    (when known) is the entry that is not what it should be."""

    def __init__(self, message: str, path: Path | None = None) -> None:
        super().__init__(message)
        self.path = path


def kind_of(mode: int) -> str:
    """What a non-regular file is, in words, for error messages."""
    return next((what for test, what in _KINDS if test(mode)), "not a regular file")


def hard_link_text(info: os.stat_result) -> str:
    """Why a regular file with several links is refused (no producer hard-links a checkpoint's files)."""
    return (f"is a hard link ({info.st_nlink} names for one file, maybe one outside the checkpoint directory); "
            f"neither MindSpore nor evald's writer hard-links, so it is not read: copy it instead")


def components(relative: str | os.PathLike[str]) -> tuple[str, ...]:
    """The plain names of ``relative``; UnsafeFile for an absolute path, ``..``, ``.``, or an empty name."""
    text = os.fspath(relative)
    parts = PurePosixPath(text).parts
    if not text or text.startswith("/") or not parts or any(p in ("", ".", "..") for p in parts) \
            or "\x00" in text or text != "/".join(parts):
        raise UnsafeFile(f"{text!r} is not a plain relative path (no '..', '.', leading '/' or empty name); not "
                         f"opened")
    return parts


@dataclass
class OpenedFile:
    """A regular file opened under the rule: its descriptor, its ``fstat``, and the name errors show.
    A context manager: leaving it closes the descriptor."""

    fd: int
    info: os.stat_result
    shown: str
    limit: int

    def read(self) -> bytes:
        """The whole file, at most ``limit`` bytes (UnsafeFile if it grew past that while read)."""
        return self.pread(self.limit + 1, 0, whole=True)

    def pread(self, nbytes: int, offset: int, *, whole: bool = False) -> bytes:
        """Up to ``nbytes`` bytes at ``offset`` (fewer only at the end of the file)."""
        chunks, total = [], 0
        while total < nbytes:
            chunk = os.pread(self.fd, min(_CHUNK, nbytes - total), offset + total)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if whole and total > self.limit:
            raise UnsafeFile(f"{self.shown} grew past {self.limit} bytes while it was read")
        return b"".join(chunks)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> "OpenedFile":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_dir_beneath(root: str | os.PathLike[str], relative: str | os.PathLike[str] = "") -> int:
    """A descriptor of directory ``root/relative``, no component below ``root`` a link (the caller closes
    it). FileNotFoundError when a component is absent; UnsafeFile for a link or a non-directory."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC)
    try:
        return descend(fd, components(relative) if os.fspath(relative) else (), shown=Path(root))
    finally:
        os.close(fd)


def descend(dir_fd: int, names: tuple[str, ...] | list[str], *, create: bool = False, mode: int = 0o777,
            shown: Path | None = None) -> int:
    """A new descriptor of directory ``names`` below ``dir_fd`` (which stays open), each opened with
    ``O_NOFOLLOW`` relative to its parent; with ``create``, a missing one is made with ``mode``.
    FileNotFoundError when one is absent (and not created); UnsafeFile for a link or a non-directory,
    naming it below ``shown``."""
    fd = os.dup(dir_fd)
    try:
        for depth, name in enumerate(names):
            if create:
                try:
                    os.mkdir(name, mode, dir_fd=fd)
                except FileExistsError:
                    pass
            parent, fd = fd, -1
            try:
                fd = _step(parent, name, (shown or Path(".")).joinpath(*names[:depth + 1]))
            finally:
                os.close(parent)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        raise
    return fd


def _step(dir_fd: int, name: str, where: Path) -> int:
    """Open directory ``name`` under ``dir_fd`` without following a link."""
    try:
        return os.open(name, DIRECTORY_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UnsafeFile(f"{where} is {_what_is(dir_fd, name)}, not a directory; links are not followed "
                             f"here", where) from None
        raise


def _what_is(dir_fd: int, name: str) -> str:
    try:
        return kind_of(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return "not a directory"


def open_beneath(root: str | os.PathLike[str], relative: str | os.PathLike[str], limit: int, *,
                 single_link: bool = True) -> OpenedFile:
    """Open regular file ``root/relative`` under the rule (module docstring); use it as a context manager.

    FileNotFoundError when it (or a directory on the way) is absent: callers decide what absence means.
    UnsafeFile for a link anywhere below ``root``, a FIFO, device, socket or directory, a hard link
    (unless ``single_link`` is False), or more than ``limit`` bytes. Other OSErrors (EACCES) pass.
    """
    parts = components(relative)
    shown = str(Path(root) / relative)
    dir_fd = open_dir_beneath(root, "/".join(parts[:-1]))
    try:
        fd = os.open(parts[-1], _FILE_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeFile(f"{shown} is a symbolic link; links are not followed here") from None
        raise
    finally:
        os.close(dir_fd)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UnsafeFile(f"{shown} is {kind_of(info.st_mode)}, not a regular file")
        if single_link and info.st_nlink > 1:
            raise UnsafeFile(f"{shown} {hard_link_text(info)}")
        if info.st_size > limit:
            raise UnsafeFile(f"{shown} is {info.st_size} bytes, more than the {limit} this file may have")
    except BaseException:
        os.close(fd)
        raise
    return OpenedFile(fd, info, shown, limit)


def read_beneath(root: str | os.PathLike[str], relative: str | os.PathLike[str], limit: int, *,
                 single_link: bool = True) -> tuple[bytes, os.stat_result]:
    """The bytes of regular file ``root/relative`` (at most ``limit``) and the ``fstat`` they came from."""
    with open_beneath(root, relative, limit, single_link=single_link) as opened:
        return opened.read(), opened.info


@dataclass(frozen=True)
class Listed:
    """One entry of a directory listed under the rule: its name and what ``lstat`` says it is."""

    name: str
    mode: int

    @property
    def is_file(self) -> bool:
        return stat.S_ISREG(self.mode)

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.mode)


def list_beneath(root: str | os.PathLike[str], relative: str | os.PathLike[str] = "",
                 limit: int = 1_000_000) -> list[Listed]:
    """The entries of directory ``root/relative`` (no link on the way), each with its own ``lstat`` mode,
    sorted by name; at most ``limit`` of them (UnsafeFile beyond: a directory nobody's tool made)."""
    fd = open_dir_beneath(root, relative)
    try:
        out = []
        with os.scandir(fd) as entries:
            for entry in entries:
                if len(out) >= limit:
                    raise UnsafeFile(f"{Path(root) / relative} holds more than {limit} entries; not listed")
                try:
                    out.append(Listed(entry.name, entry.stat(follow_symlinks=False).st_mode))
                except FileNotFoundError:
                    continue  # removed while listed
        return sorted(out, key=lambda e: e.name)
    finally:
        os.close(fd)


def walk_files(root: str | os.PathLike[str], relative: str | os.PathLike[str] = "", *, depth: int = 1,
               limit: int = 1_000_000) -> Iterator[str]:
    """The relative paths of the regular files ``depth`` directory levels below ``root/relative`` (0: the
    directory's own files), never through a link; anything that is neither a regular file nor a
    directory is skipped (a caller that must report such entries lists the directory itself)."""
    base = os.fspath(relative)
    for entry in list_beneath(root, base, limit):
        path = f"{base}/{entry.name}" if base else entry.name
        if depth == 0 and entry.is_file:
            yield path
        elif depth > 0 and entry.is_dir:
            yield from walk_files(root, path, depth=depth - 1, limit=limit)
