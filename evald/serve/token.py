"""The bearer token clients must send, read from a file only its owner can read (like the CURVE keys), by the
one rule for secrets in files (evald.contracts.secret_file).

May import: contracts.
"""

from __future__ import annotations

import os

from evald.contracts.secret_file import SecretFileError, read_secret

MIN_CHARACTERS = 16


class TokenFileError(ValueError):
    """The token file is missing, empty, too open or unreadable: evald refuses to start."""


def read_token(path: str | os.PathLike) -> str:
    """The token in ``path`` (the operator's own file, named in the configuration; a link to it is followed, as
    for a mounted secret): a regular file that only its owner may read, holding one token of at least 16
    visible ASCII characters (what a header can carry as written)."""
    try:
        return read_secret(path, "serve.token_file", min_chars=MIN_CHARACTERS)
    except FileNotFoundError:
        raise TokenFileError(f"serve.token_file {path}: cannot be read (no such file)") from None
    except SecretFileError as exc:
        raise TokenFileError(str(exc)) from None
