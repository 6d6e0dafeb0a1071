"""The bearer token clients must send, read from a file only its owner can read (like the CURVE keys).

May import: contracts (safe_open's names of file kinds).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from evald.contracts.safe_open import kind_of

LIMIT = 4096   # bytes: a token is one short line


class TokenFileError(ValueError):
    """The token file is missing, empty, too open or unreadable: evald refuses to start."""


def read_token(path: str | os.PathLike) -> str:
    """The token in ``path`` (the operator's own file, named in the configuration; a link to it is followed, as
    for a mounted secret). Opened without blocking (a FIFO in its place is refused at once, never waited on) and
    judged by ``fstat`` of what was opened: a regular file of at most LIMIT bytes that only its owner may read,
    holding one token of at least 16 visible ASCII characters (what a header can carry as written)."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise TokenFileError(f"serve.token_file {path}: cannot be read ({exc.strerror})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise TokenFileError(f"serve.token_file {path}: is {kind_of(info.st_mode)}, not a regular file")
        if info.st_size > LIMIT:
            raise TokenFileError(f"serve.token_file {path}: {info.st_size} bytes; a token file holds one line")
        data = os.read(fd, LIMIT + 1)
    finally:
        os.close(fd)
    mode = info.st_mode & 0o777
    if mode & 0o077:
        raise TokenFileError(f"serve.token_file {path}: mode {mode:o} lets other users read it; "
                             f"run  chmod 600 {path}")
    try:
        text = data.decode("ascii").strip()
    except UnicodeDecodeError:
        text = None
    if text is None or not all("\x21" <= c <= "\x7e" for c in text):
        raise TokenFileError(f"serve.token_file {path}: the token must be visible ASCII characters (a header "
                             f"carries bytes: other characters cannot be sent as written), e.g. from  "
                             f"python -c 'import secrets; print(secrets.token_urlsafe())'")
    if len(text) < 16:
        raise TokenFileError(f"serve.token_file {path}: the token must be one line of at least 16 characters "
                             f"without spaces (e.g. from  python -c 'import secrets; print(secrets.token_urlsafe())')")
    return text
