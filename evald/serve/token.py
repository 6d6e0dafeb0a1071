"""The bearer token clients must send, read from a file only its owner can read (like the CURVE keys).

May import: nothing of evald.
"""

from __future__ import annotations

import os
from pathlib import Path


class TokenFileError(ValueError):
    """The token file is missing, empty, too open or unreadable: evald refuses to start."""


def read_token(path: str | os.PathLike) -> str:
    path = Path(path)
    try:
        mode = path.stat().st_mode & 0o777
        text = path.read_text("utf-8").strip()
    except OSError as exc:
        raise TokenFileError(f"serve.token_file {path}: cannot be read ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise TokenFileError(f"serve.token_file {path}: not UTF-8 text") from None
    if mode & 0o077:
        raise TokenFileError(f"serve.token_file {path}: mode {mode:o} lets other users read it; "
                             f"run  chmod 600 {path}")
    if len(text) < 16 or any(c.isspace() for c in text):
        raise TokenFileError(f"serve.token_file {path}: the token must be one line of at least 16 characters "
                             f"without spaces (e.g. from  python -c 'import secrets; print(secrets.token_urlsafe())')")
    return text
