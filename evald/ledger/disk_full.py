"""A full disk (or quota) under evald's state, or a ledger another process holds locked, makes evald
wait and retry; it never crashes or loses a change.

Every change to the ledger is one transaction (evald.ledger.ledger), so a transaction that fails
because the disk is full is rolled back whole and can simply be run again: ``guard_ledger``
wraps every public method of the ledger that way. The TensorBoard outbox keeps records
until they are on disk, so the sink just stops writing until there is room, and the small
files (best.json, summary.json, subset.json) are written with ``retry``. evald logs when
it starts waiting, every minute while it waits, and when it carries on.

A ledger locked by another process (an operator's ``sqlite3`` shell in ``BEGIN EXCLUSIVE``, a
backup tool, a stuck ``evald backfill``) is waited out the same way: sqlite waits
``BUSY_TIMEOUT_S`` (evald.ledger.ledger) per attempt, then ``retry`` logs and tries again, so
checkpoints that arrive meanwhile wait in the queue and are evaluated once the lock goes.

A signal while waiting (SIGTERM) ends the wait with ``DiskFullShutdown``: the change that
could not be written is not committed, so the next start redoes it, as after a crash. The
server owns the ``DiskWait`` and passes it to what writes (``should_stop`` is its signal flag);
nothing here is a module-level setting.
"""

from __future__ import annotations

import errno
import logging
import sqlite3
import time
from typing import Callable, TypeVar

log = logging.getLogger("evald")

RETRY_S = 1.0
REMIND_S = 60.0
_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_SQLITE_FULL, _SQLITE_IOERR = 13, 10   # primary result codes (the low byte of extended ones)
_SQLITE_BUSY, _SQLITE_LOCKED = 5, 6
T = TypeVar("T")


class DiskFullShutdown(Exception):
    """A signal arrived while evald waited for disk space; what was not written is redone at the next start."""


def is_full(exc: BaseException | None) -> bool:
    """A full disk or quota: ENOSPC/EDQUOT, or sqlite's FULL or IOERR, anywhere in the exception's chain."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, OSError) and exc.errno in _FULL_ERRNOS:
            return True
        if isinstance(exc, sqlite3.OperationalError):
            code = getattr(exc, "sqlite_errorcode", None)
            if code is not None and code & 0xFF in (_SQLITE_FULL, _SQLITE_IOERR):
                return True
            if "disk is full" in str(exc) or "disk I/O error" in str(exc):
                return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def _out_of_space(exc: BaseException | None) -> bool:
    """ENOSPC/EDQUOT or sqlite's FULL, as opposed to an I/O error (a read-only mount, an immutable file)."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, OSError) and exc.errno in _FULL_ERRNOS:
            return True
        if isinstance(exc, sqlite3.OperationalError) and (
                (getattr(exc, "sqlite_errorcode", 0) or 0) & 0xFF == _SQLITE_FULL or "disk is full" in str(exc)):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def advice(exc: BaseException) -> str:
    """What the operator can do about a write that ``is_full`` says to wait out."""
    if _out_of_space(exc):
        return "Free some space"
    return ("Free some space, or make the file and its directory writable again (a read-only mount, "
            "chattr +i, their permissions: sqlite says only that the write failed)")


def is_locked(exc: BaseException | None) -> bool:
    """Another connection holds the database locked (sqlite's BUSY or LOCKED), anywhere in the chain."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, sqlite3.OperationalError):
            code = getattr(exc, "sqlite_errorcode", None)
            if code is not None and code & 0xFF in (_SQLITE_BUSY, _SQLITE_LOCKED):
                return True
            if "database is locked" in str(exc) or "database table is locked" in str(exc):
                return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


class DiskWait:
    """Runs a write again while the disk is full, until it succeeds or ``should_stop()`` says a signal came."""

    def __init__(self, should_stop: Callable[[], bool] = lambda: False) -> None:
        self.should_stop = should_stop

    def retry(self, what: str, action: Callable[[], T], cleanup: Callable[[], None] | None = None) -> T:
        """``action()``, run again every RETRY_S while it fails because the disk is full."""
        waiting_since = None
        reminded = 0.0
        while True:
            try:
                result = action()
            except (OSError, sqlite3.Error) as exc:
                locked = is_locked(exc)
                if not locked and not is_full(exc):
                    raise
                if cleanup is not None:
                    cleanup()
                now = time.monotonic()
                waited = f" (waiting for {now - waiting_since:.0f}s)" if waiting_since is not None else ""
                if waiting_since is None or now - reminded >= REMIND_S:
                    if locked:
                        log.warning("%s is locked by another process (%s): an sqlite3 shell in a transaction, a "
                                    "backup tool, a stuck `evald backfill`? evald waits and retries%s; nothing is "
                                    "lost and checkpoints that arrive meanwhile are evaluated once it can write. "
                                    "End the other program's transaction", what, exc, waited)
                    else:
                        log.warning("%s cannot be written: %s. evald waits and retries every %.0fs%s; nothing is "
                                    "lost (the change is retried whole). %s", what, exc, RETRY_S, waited, advice(exc))
                    reminded = now
                    waiting_since = now if waiting_since is None else waiting_since
                if self.should_stop():
                    log.warning("a signal came while waiting for %s: exiting without writing %s; the next start "
                                "redoes what it would have recorded", "the lock" if locked else "space", what)
                    raise DiskFullShutdown(f"stopped while waiting to write {what}") from exc
                time.sleep(RETRY_S)
                continue
            if waiting_since is not None:
                log.warning("%s written again after %.0fs of waiting; carrying on", what,
                            time.monotonic() - waiting_since)
            return result
