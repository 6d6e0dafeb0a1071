"""Resolving a path that came from outside evald: the wire, RUN.json, the configuration, the environment.

One function, ``resolve``, for every such path, so that none can raise anything but a bounded
``OutsidePathError``: ``Path.resolve()`` raises RuntimeError on a symbolic-link loop (Python 3.11),
the kernel ELOOP, ENAMETOOLONG, EACCES or ENOTDIR on the way, and a NUL byte or an unpaired
surrogate a ValueError or UnicodeError from whichever call meets it first. A path that does not
exist (yet) is resolved as far as it exists, as ``os.path.realpath`` does.

Part of the contracts (the wire carries ``ckpt_dir`` and ``search_path``); may import nothing of evald.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

MAX_PATH_BYTES = 4096  # PATH_MAX (wire_fields.MAX_PATH_BYTES)
_SHOWN = 200           # characters of an offending path quoted in an error
_WHY = {errno.ELOOP: "leads through a loop of symbolic links",
        errno.ENAMETOOLONG: "is longer than the system allows",
        errno.EACCES: "has a parent directory evald's user may not search",
        errno.EPERM: "has a parent directory evald's user may not search",
        errno.ENOTDIR: "has a component that is not a directory"}


class OutsidePathError(ValueError):
    """A path from outside cannot be used; the message names it (shortened) and why."""


def shown(text: object) -> str:
    """``text`` quoted and cut to a bounded length, for an error or log line."""
    quoted = repr(text)
    return quoted if len(quoted) <= _SHOWN else quoted[:_SHOWN] + f"…({len(quoted)} characters)"


def resolve(text: str | os.PathLike, what: str) -> Path:
    """The absolute, link-free path of ``text`` (``what`` names it in errors: "the ckpt_dir of a
    checkpoint_committed message"); OutsidePathError for anything that is not a usable path."""
    if isinstance(text, os.PathLike):
        text = os.fspath(text)
    if not isinstance(text, str) or not text:
        raise OutsidePathError(f"{what} {shown(text)} is not a path")
    if "\x00" in text:
        raise OutsidePathError(f"{what} {shown(text)} contains a NUL byte")
    try:
        size = len(os.fsencode(text))
    except UnicodeError:
        raise OutsidePathError(f"{what} {shown(text)} is not a file name this system can store") from None
    if size > MAX_PATH_BYTES:
        raise OutsidePathError(f"{what} {shown(text)} is {size} bytes long, more than PATH_MAX ({MAX_PATH_BYTES})")
    try:
        absolute = os.path.abspath(text)
        try:
            return Path(os.path.realpath(absolute, strict=True))
        except FileNotFoundError:  # not there (yet): as far as it exists; never raises on a loop
            return Path(os.path.realpath(absolute, strict=False))
    except OSError as exc:
        why = _WHY.get(exc.errno or 0, f"cannot be resolved ({exc.strerror or exc})")
        raise OutsidePathError(f"{what} {shown(text)} {why}") from None
    except (ValueError, RuntimeError) as exc:  # whatever else a path can make os.path raise
        raise OutsidePathError(f"{what} {shown(text)} cannot be resolved ({str(exc)[:_SHOWN]})") from None
