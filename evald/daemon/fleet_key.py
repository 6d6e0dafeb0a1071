"""A backfill fleet's key: the secret that seals the fleet's files (HMAC-SHA256, evald.daemon.fleet_cells),
so that whoever can write the fleet directory but does not hold the key cannot forge a cell or a plan.

A plain sha256 of a file's body, as the fleet first sealed its files, anyone can recompute: it caught a
torn file, not an altered one. The key is the run's: ``RUN_DIR/fleet.key``, 64 random hex digits in a
file of the run's user, 0600, in the run directory (which evald keeps private). The first worker or
``evald backfill --plan`` that needs it creates it (exclusively: two workers starting at once agree on
one key), and the merge, run as the run's user, finds it there: a backfill by the run's own user needs
no step more. Workers that cannot read the run directory's key (another user) are given the same key
as a file, ``--fleet-key FILE`` (env ``EVALD_FLEET_KEY_FILE``): a Kubernetes Secret, a file of the Slurm
job's user (deploy/README.md, "Fleets").

Who holds the key can seal anything (a worker is trusted to evaluate honestly); who does not can only
delete, replay or break files, which the merge reports (docs/security.md, "Who may write which directory").

May import: contracts.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
import socket
from dataclasses import dataclass, field
from pathlib import Path

from evald.contracts.layout import fsync_dir
from evald.contracts.secret_file import OTHERS, SecretFileError, read_secret

KEY_FILE = "fleet.key"
KEY_ENV = "EVALD_FLEET_KEY_FILE"
MIN_KEY_CHARACTERS = 32            # visible ASCII (evald writes 64 hex digits; so does `openssl rand -hex 32`)


class FleetKeyError(ValueError):
    """The fleet's key cannot be had (absent, unreadable, readable by others, malformed); says what to do."""


@dataclass(frozen=True)
class FleetKey:
    secret: bytes = field(repr=False)
    where: str                        # the file it came from, for messages

    def seal(self, payload: bytes) -> str:
        return hmac.new(self.secret, payload, hashlib.sha256).hexdigest()

    def verifies(self, payload: bytes, seal: str) -> bool:
        # compare_digest refuses a str with non-ASCII characters (TypeError): a file's seal may hold any
        return seal.isascii() and hmac.compare_digest(self.seal(payload), seal)


def fleet_key(run_dir: Path, given: str | None, *, create: bool) -> FleetKey:
    """The fleet's key: the file ``given`` (``--fleet-key``), else the run's own ``RUN_DIR/fleet.key``,
    created first when ``create`` (a worker, ``--plan``) and it does not exist yet (the merge never creates
    one: a key it made could not have sealed anything)."""
    if given:
        return _given_key(Path(given))
    try:
        return _run_key(run_dir)
    except FileNotFoundError:
        if not create:
            raise FleetKeyError(f"{Path(run_dir) / KEY_FILE} does not exist, so no file of this fleet can have been "
                                f"sealed with the run's key: the workers create it when they run as the run's user "
                                f"(or give --fleet-key FILE, the key the workers were given)") from None
    _create(Path(run_dir))
    try:
        return _run_key(run_dir)
    except FileNotFoundError:
        raise FleetKeyError(f"{Path(run_dir) / KEY_FILE} vanished right after it was created") from None


def _run_key(run_dir: Path) -> FleetKey:
    """RUN_DIR/fleet.key: a regular file of this user that nobody else may read or write, no link (two names
    only for a moment, while _create links its temporary into place). FileNotFoundError when absent."""
    path = Path(run_dir) / KEY_FILE
    try:
        text = read_secret(path, "the run's fleet key", min_chars=MIN_KEY_CHARACTERS, owner_only=True,
                           follow_links=False, single_link=False)
    except SecretFileError as exc:
        raise FleetKeyError(f"{exc}. Run the workers and the merge as the run's user (a key another user could "
                            f"read is removed and the next worker creates a new one), or give them the key with "
                            f"--fleet-key FILE") from None
    return FleetKey(text.encode("ascii"), str(path))


def _given_key(path: Path) -> FleetKey:
    """A key file the operator names (a Kubernetes Secret's volume presents it through links: followed, as
    for --config): a regular file that others may neither read nor write, its content the secret."""
    try:
        text = read_secret(path, "--fleet-key", min_chars=MIN_KEY_CHARACTERS, others=OTHERS)
    except FileNotFoundError:
        raise FleetKeyError(f"--fleet-key {path} does not exist") from None
    except SecretFileError as exc:
        raise FleetKeyError(str(exc)) from None
    return FleetKey(text.encode("ascii"), str(path))


def _create(run_dir: Path) -> None:
    """RUN_DIR/fleet.key, 0600, unless one exists: written under a temporary name, then hard-linked into place
    (fails if the name exists), so of two workers starting at once exactly one key wins."""
    tmp = run_dir / f".{KEY_FILE}.tmp-{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o600)
    except OSError as exc:
        raise FleetKeyError(f"the fleet's key cannot be created in {run_dir} ({exc.strerror or exc}): run `evald "
                            f"backfill --plan` as the run's user first, and give workers of another user the key "
                            f"with --fleet-key FILE") from None
    try:
        try:
            os.write(fd, (secrets.token_hex(32) + "\n").encode("ascii"))
            os.fsync(fd)
        finally:
            os.close(fd)
        with contextlib.suppress(FileExistsError):
            os.link(tmp, run_dir / KEY_FILE)
            fsync_dir(run_dir)
    except OSError as exc:
        raise FleetKeyError(f"the fleet's key cannot be created in {run_dir} ({exc.strerror or exc})") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
