"""The one way evald reads a secret kept in a file: the HTTP endpoint's bearer token
(``serve.token_file``), a backfill fleet's key (``--fleet-key``, ``RUN_DIR/fleet.key``) and an eval
group's key (``group.key_file``).

Whoever can read such a file can impersonate its holder, and whoever can write it can choose the
secret, so the file is judged by what was opened: opened without blocking (a FIFO in its place is
refused at once, never waited on) and checked by ``fstat`` of that descriptor: a regular file of at
most ``LIMIT`` bytes, not readable or writable by the users ``others`` names, owned by evald's user
where that matters, holding one line of visible ASCII characters (what a header or a key file carries
as written) of at least ``min_chars``. A file the operator names may be a link (a mounted Kubernetes
Secret is one); a file evald keeps itself is read under safe_open's rule (no link).

Imports only evald.contracts.safe_open.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from evald.contracts.safe_open import UnsafeFile, kind_of, open_beneath

LIMIT = 4096                       # bytes: a secret is one short line
GROUP_AND_OTHERS = 0o077
OTHERS = 0o006                    # others may neither read nor write (a group, e.g. a mounted Secret's, may read)
_MAKE_ONE = "python -c 'import secrets; print(secrets.token_hex(32))'"


class SecretFileError(ValueError):
    """The secret's file cannot be used (absent, not a regular file, readable by others, malformed); the
    message names the file and says what to do."""


def read_secret(path: str | os.PathLike, what: str, *, min_chars: int, others: int = GROUP_AND_OTHERS,
                owner_only: bool = False, follow_links: bool = True, single_link: bool = True) -> str:
    """The secret in ``path``, as its text. ``what`` names it in errors ("serve.token_file"); ``others``: the
    mode bits nobody but the owner may have; ``owner_only``: the file must be evald's user's;
    ``follow_links``: False for a file evald keeps itself (no link anywhere, safe_open's rule, with
    ``single_link`` as there)."""
    path = Path(path)
    shown = f"{what} {path}"
    try:
        if follow_links:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        else:
            fd = os.dup((opened := open_beneath(path.parent, path.name, LIMIT, single_link=single_link)).fd)
            opened.close()
    except UnsafeFile as exc:
        raise SecretFileError(f"{shown}: {exc}; a secret is not read from it") from None
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise SecretFileError(f"{shown} cannot be read by this user (uid {os.geteuid()}): "
                              f"{exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise SecretFileError(f"{shown} is {kind_of(info.st_mode)}, not a regular file")
        if info.st_size > LIMIT:
            raise SecretFileError(f"{shown} is {info.st_size} bytes; a secret's file holds one short line")
        data = os.read(fd, LIMIT + 1)
    finally:
        os.close(fd)
    if owner_only and info.st_uid != os.geteuid():
        raise SecretFileError(f"{shown} belongs to uid {info.st_uid}, not to evald's user ({os.geteuid()}): whoever "
                              f"owns it can read or replace the secret")
    if info.st_mode & others:
        raise SecretFileError(f"{shown} has mode {stat.S_IMODE(info.st_mode):o}: others may read or write it, and "
                              f"whoever can read it holds the secret; run  chmod {_allowed(others)} {path}  (and "
                              f"make a new secret if others may have read it)")
    try:
        text = data.decode("ascii").strip()
    except UnicodeDecodeError:
        text = ""
    if len(text) < min_chars or not all("\x21" <= c <= "\x7e" for c in text):
        raise SecretFileError(f"{shown} does not hold a secret: one line of at least {min_chars} visible ASCII "
                              f"characters, no spaces (what a header or a key carries as written), e.g. from  "
                              f"{_MAKE_ONE}")
    return text


def _allowed(others: int) -> str:
    """The chmod that takes the forbidden bits away: 600 when group and others are, o-rw when only others."""
    return "600" if others & 0o070 else "o-rw"
