"""Where ``evald export`` writes (``--out``): every file of an export is staged in one private
directory inside ``--out`` and moved into place by rename at the end, never written through a link.

``--out`` is the operator's, so someone else may share it (a team's export directory) or have left
things in it. Nothing there is trusted:

* the whole export is written first into a fresh staging directory ``OUT/.evald-export-partial-
  HOST-PID-RANDOM`` (mode 0700), each file created ``O_EXCL | O_NOFOLLOW``, written whole and
  fsync'd; a file that cannot be written (a string that is no UTF-8, a full disk) ends the export
  with the staging directory removed and ``--out`` as it was;
* only then is each file renamed into place, every directory on its way opened with ``O_NOFOLLOW``
  relative to its parent's descriptor (``openat``), so no link planted in ``--out`` is followed;
  before the first rename, every place is checked: a directory on the way that is a link, a file,
  a FIFO, or a file's name held by anything but a regular file refuses the whole export (nothing is
  moved). A rename over an existing regular file replaces it (the same cells exported again keep
  their names); one over a link swapped in after the check replaces the link itself, never what it
  points to;
* an export killed midway (SIGKILL, a power cut) leaves complete earlier files and its staging
  directory, which the next export into the same ``--out`` removes (when its process, on this
  host, is gone). Files are whole either way: a file in place is an old one or a new one.

May import: contracts.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import socket
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from evald.contracts.outside_paths import OutsidePathError, resolve, shown
from evald.contracts.safe_open import DIRECTORY_FLAGS, UnsafeFile, descend, kind_of

STAGING_PREFIX = ".evald-export-partial-"
_STAGING = re.compile(re.escape(STAGING_PREFIX) + r"(?P<host>[A-Za-z0-9._-]+)-(?P<pid>[0-9]{1,10})-[0-9a-f]{8}")
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC
_MAX_NAME_BYTES = 255  # NAME_MAX


class ExportTargetError(ValueError):
    """``--out`` cannot take the export as asked; the message names the place and what to do."""


def check_out(text: str | os.PathLike) -> Path:
    """``--out`` resolved, before anything is read: a directory, or a path a directory can be created at.
    ExportTargetError for a regular file, a FIFO or anything else that is no directory (there or on the
    way), or a place evald's user may not write. ``--out`` is the operator's own path: a link in it is
    followed here, once (only what is below it never is)."""
    try:
        out = resolve(text, "--out")
    except OutsidePathError as exc:
        blocking = _first_non_directory(Path(os.path.abspath(os.fspath(text))))
        if blocking is None:
            raise ExportTargetError(str(exc)) from None
        raise ExportTargetError(f"{blocking[0]}, on the way to --out {shown(os.fspath(text))}, is "
                                f"{_kind(blocking[1].st_mode)}, not a directory: give a directory (it is created if "
                                f"absent)") from None
    existing = out
    while True:
        try:
            info = os.stat(existing)
            break
        except FileNotFoundError:
            existing = existing.parent
        except OSError as exc:
            raise ExportTargetError(f"--out {shown(str(out))}: {existing} cannot be examined ({exc.strerror})") from None
    if not stat.S_ISDIR(info.st_mode):
        what = f"--out {shown(str(out))}" if existing == out else f"{existing}, on the way to --out {shown(str(out))},"
        raise ExportTargetError(f"{what} is {_kind(info.st_mode)}, not a directory: give a directory (it is "
                                f"created if absent)")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ExportTargetError(f"--out {shown(str(out))}: evald's user may not write {existing}: give a directory "
                                f"it may write")
    return out


def _first_non_directory(path: Path) -> tuple[Path, os.stat_result] | None:
    """The first of ``path``'s parents (links followed: the operator's path) that exists and is no directory."""
    for parent in reversed(path.parents):
        try:
            info = os.stat(parent)
        except OSError:
            return None
        if not stat.S_ISDIR(info.st_mode):
            return parent, info
    return None


def _kind(mode: int) -> str:
    return "a regular file" if stat.S_ISREG(mode) else kind_of(mode)


def _plain(part: object, where: str) -> str:
    """A path component an export may create: no separator, NUL, ``.``/``..``, at most NAME_MAX bytes."""
    if not isinstance(part, str) or part in ("", ".", "..") or "/" in part or "\x00" in part:
        raise ExportTargetError(f"{shown(part)} in {where} is not a plain file name (no '/', NUL, '.' or '..'): "
                                f"a name given to the export (--model-name, --developer) or read from the run is "
                                f"not fit for a path")
    try:
        size = len(part.encode("utf-8"))
    except UnicodeEncodeError:
        raise ExportTargetError(f"{shown(part)} in {where} is not a name UTF-8 can store") from None
    if size > _MAX_NAME_BYTES:
        raise ExportTargetError(f"{shown(part)} in {where} is {size} bytes long, more than a file name may be "
                                f"({_MAX_NAME_BYTES})")
    return part


@dataclass
class ExportTarget:
    """One export into ``out``: stage files with :meth:`write_bytes`/:meth:`write_text`, then :meth:`commit`.
    Use it as a context manager (:func:`open_target`): leaving it without a commit removes what was staged."""

    out: Path
    out_fd: int
    staging: str
    staging_fd: int
    created_out: list[Path]
    staged: list[tuple[str, ...]] = field(default_factory=list)
    removed_leftovers: list[str] = field(default_factory=list)
    committed: bool = False

    # -- staging ------------------------------------------------------------------------------------

    def write_text(self, parts: Sequence[str], text: str) -> Path:
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ExportTargetError(f"{self._shown(parts)} cannot be written as UTF-8 ({exc.reason} at character "
                                    f"{exc.start}): the text holds {shown(exc.object[exc.start:exc.end])}, no "
                                    f"Unicode character") from None
        return self.write_bytes(parts, data)

    def write_bytes(self, parts: Sequence[str], data: bytes) -> Path:
        """Stage ``OUT/<parts>`` (written whole and fsync'd in the staging directory); its final path."""
        parts = tuple(_plain(p, self._shown(parts)) for p in parts)
        if not parts:
            raise ExportTargetError("an export file needs a name")
        if parts in self.staged:
            raise ExportTargetError(f"{self._shown(parts)} would be written twice by one export")
        try:
            folder = _open_dirs(self.staging_fd, parts[:-1], create=True, mode=0o700)
            try:
                fd = os.open(parts[-1], _NEW_FILE, 0o666, dir_fd=folder)
            finally:
                os.close(folder)
            try:
                _write_all(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            raise ExportTargetError(f"{self._shown(parts)} cannot be staged in {self.out / self.staging} "
                                    f"({exc.strerror or exc})") from None
        self.staged.append(parts)
        return self.out.joinpath(*parts)

    # -- committing ---------------------------------------------------------------------------------

    def commit(self) -> list[Path]:
        """Move every staged file into place (module docstring); the final paths, in the order written."""
        for parts in self.staged:      # every place first: a refusal moves nothing
            self._check_place(parts)
        moved: list[Path] = []
        opened: dict[tuple[str, ...], tuple[int, int]] = {}     # directory -> (its staged fd, its final fd)
        try:
            for parts in self.staged:
                where = parts[:-1]
                if where not in opened:
                    staged = _open_dirs(self.staging_fd, where, create=False)
                    try:
                        opened[where] = (staged, _open_dirs(self.out_fd, where, create=True, shown=self.out))
                    except BaseException:
                        os.close(staged)
                        raise
                source, target = opened[where]
                os.replace(parts[-1], parts[-1], src_dir_fd=source, dst_dir_fd=target)
                moved.append(self.out.joinpath(*parts))
            for _, target in opened.values():
                os.fsync(target)
        except (OSError, ExportTargetError) as exc:
            why = str(exc) if isinstance(exc, ExportTargetError) else exc.strerror or str(exc)
            raise ExportTargetError(f"{self._shown(parts)} cannot be put in place ({why}); {len(moved)} of "
                                    f"{len(self.staged)} files were (each whole, the others not at all)") from None
        finally:
            for fds in opened.values():
                for fd in fds:
                    os.close(fd)
        self.committed = True
        return moved

    def _check_place(self, parts: tuple[str, ...]) -> None:
        """``OUT/<parts>``: every directory on the way absent or a directory, the file absent or a regular file."""
        fd = os.dup(self.out_fd)
        try:
            for depth, name in enumerate(parts):
                here = self.out.joinpath(*parts[:depth + 1])
                last = depth == len(parts) - 1
                try:
                    info = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    if not (stat.S_ISREG(info.st_mode) if last else stat.S_ISDIR(info.st_mode)):
                        raise ExportTargetError(
                            f"{here} is {_kind(info.st_mode)}, where the export puts "
                            f"{'a file' if last else 'a directory of its files'}: an export never writes through "
                            f"a link, and replaces only regular files; remove it or choose another --out (nothing "
                            f"was written)")
                    if not last:
                        parent, fd = fd, -1
                        try:
                            fd = os.open(name, DIRECTORY_FLAGS, dir_fd=parent)
                        finally:
                            os.close(parent)
                except FileNotFoundError:
                    return                                  # created at the commit, from here down
                except OSError as exc:
                    raise ExportTargetError(f"{here} cannot be examined ({exc.strerror or exc}); nothing was "
                                            f"written") from None
        finally:
            if fd >= 0:
                os.close(fd)

    # -- ending ---------------------------------------------------------------------------------------

    def close(self) -> None:
        """Remove the staging directory (whatever a failed export left in it) and close the descriptors;
        a ``--out`` this export created and left empty is removed too."""
        if self.staging_fd < 0:
            return
        os.close(self.staging_fd)
        self.staging_fd = -1
        with contextlib.suppress(OSError):
            shutil.rmtree(self.staging, dir_fd=self.out_fd)
        os.close(self.out_fd)
        self.out_fd = -1
        if not self.committed:
            for created in reversed(self.created_out):
                with contextlib.suppress(OSError):
                    created.rmdir()                          # only while empty

    def __enter__(self) -> "ExportTarget":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _shown(self, parts: Sequence[object]) -> str:
        return str(self.out.joinpath(*(str(p) for p in parts)))


def open_target(out: Path) -> ExportTarget:
    """Create ``out`` (checked by :func:`check_out`) if absent, remove what killed exports left there, and
    start a fresh staging directory in it."""
    created = _make_out(out)
    try:
        out_fd = os.open(out, DIRECTORY_FLAGS)
    except OSError as exc:
        raise ExportTargetError(f"--out {out} cannot be opened as a directory ({exc.strerror}); a link is not "
                                f"followed there") from None
    try:
        removed = _remove_leftovers(out_fd)
        staging = f"{STAGING_PREFIX}{_host()}-{os.getpid()}-{secrets.token_hex(4)}"
        os.mkdir(staging, 0o700, dir_fd=out_fd)
        staging_fd = os.open(staging, DIRECTORY_FLAGS, dir_fd=out_fd)
    except OSError as exc:
        os.close(out_fd)
        raise ExportTargetError(f"--out {out}: no staging directory can be made there ({exc.strerror}); give a "
                                f"directory evald's user may write") from None
    return ExportTarget(out, out_fd, staging, staging_fd, created, removed_leftovers=removed)


def _make_out(out: Path) -> list[Path]:
    """Create ``out`` and the missing directories above it; those created, outermost first."""
    missing = []
    at = out
    while not os.path.lexists(at):
        missing.append(at)
        at = at.parent
    for path in reversed(missing):
        try:
            os.mkdir(path, 0o777)
        except FileExistsError:
            continue
        except OSError as exc:
            raise ExportTargetError(f"--out {out}: {path} cannot be created ({exc.strerror}): give a directory "
                                    f"evald's user may write") from None
    return list(reversed(missing))


def _remove_leftovers(out_fd: int) -> list[str]:
    """Staging directories of exports into this ``--out`` killed on this host (their process is gone)."""
    removed = []
    for name in os.listdir(out_fd):
        match = _STAGING.fullmatch(name)
        if not match or match.group("host") != _host() or _alive(int(match.group("pid"))):
            continue
        info = os.stat(name, dir_fd=out_fd, follow_symlinks=False)
        if stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid():
            with contextlib.suppress(OSError):
                shutil.rmtree(name, dir_fd=out_fd)
                removed.append(name)
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9._]", "_", socket.gethostname())[:64] or "host"


def _open_dirs(base_fd: int, names: Sequence[str], *, create: bool, mode: int = 0o777,
               shown: Path | None = None) -> int:
    """A descriptor of directory ``base/names...``, each opened ``O_NOFOLLOW`` below its parent (created
    with ``mode`` when ``create``); ExportTargetError for a link or anything else that is no directory there."""
    try:
        return descend(base_fd, list(names), create=create, mode=mode, shown=shown)
    except UnsafeFile as exc:
        raise ExportTargetError(f"{exc.path} is no longer a directory (a link or a file was put there during the "
                                f"export); an export never writes through a link") from None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
