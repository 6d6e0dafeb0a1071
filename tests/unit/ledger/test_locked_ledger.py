"""A ledger another process holds locked (an operator's ``sqlite3`` shell in ``BEGIN EXCLUSIVE``, a backup
tool, a stuck ``evald backfill``) is a condition to wait out, like a full disk (issue 27, High 2): evald logs
when it starts waiting and when it carries on, and the change it was making is written once the lock goes,
never lost, never a crash. A real second sqlite connection holds the lock; it lets go once evald has said it
waits (on main evald raised ``database is locked`` after sqlite's 30 s busy timeout instead)."""

from __future__ import annotations

import logging
import sqlite3
import threading
import time

import pytest

from evald.ledger import disk_full, ledger as ledger_module
from evald.ledger.disk_full import DiskFullShutdown, DiskWait
from evald.ledger.ledger import QUEUED, Ledger


@pytest.fixture
def quick(monkeypatch):
    monkeypatch.setattr(disk_full, "RETRY_S", 0.05)
    monkeypatch.setattr(ledger_module, "BUSY_TIMEOUT_S", 0.2, raising=False)


class _WaitSaid(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.said = threading.Event()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())
        if "locked" in record.getMessage():
            self.said.set()


@pytest.fixture
def said():
    handler = _WaitSaid()
    logging.getLogger("evald").addHandler(handler)
    yield handler
    logging.getLogger("evald").removeHandler(handler)


def _hold_exclusive(path, release: threading.Event, held: threading.Event) -> None:
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")
    other.execute("INSERT INTO kv(key, value) VALUES ('held_by_the_other', '1')")
    held.set()
    release.wait(timeout=120)
    other.execute("COMMIT")
    other.close()


def test_a_ledger_locked_by_another_connection_is_waited_out_and_the_change_is_written(tmp_path, quick, said):
    path = tmp_path / "ledger.sqlite"
    ledger = Ledger(path)
    held = threading.Event()
    holder = threading.Thread(target=_hold_exclusive, args=(path, said.said, held), daemon=True)
    holder.start()
    assert held.wait(timeout=30)
    ledger.admit(name="step_000000010", step=10, kind="evald", found_via="rescan", run_id="r", commit_time=1.0)
    holder.join(timeout=30)
    assert [(s.step, s.state) for s in ledger.steps()] == [(10, QUEUED)]
    assert ledger.get_state("held_by_the_other") == 1      # the other's change is kept too
    waiting = [line for line in said.lines if "locked" in line]
    assert waiting and str(path) in waiting[0] and "waits" in waiting[0]
    assert any("carrying on" in line for line in said.lines)
    ledger.close()


def test_the_wait_is_logged_again_every_minute_while_the_lock_lasts(tmp_path, quick, said, monkeypatch):
    """"every minute" is REMIND_S (60 s), shortened here: the lock outlasts two reminders, each saying how
    long evald has waited, and the change is written once the lock goes."""
    monkeypatch.setattr(disk_full, "REMIND_S", 0.3)
    path = tmp_path / "ledger.sqlite"
    ledger = Ledger(path)
    release, held = threading.Event(), threading.Event()
    holder = threading.Thread(target=_hold_exclusive, args=(path, release, held), daemon=True)
    holder.start()
    assert held.wait(timeout=30)
    waiting = lambda: [line for line in list(said.lines) if "is locked by another process" in line]  # noqa: E731

    def release_after_two_reminders() -> None:
        deadline = time.monotonic() + 60
        while len(waiting()) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        release.set()

    threading.Thread(target=release_after_two_reminders, daemon=True).start()
    ledger.put_state("x", 1)
    holder.join(timeout=30)
    assert len(waiting()) >= 3, said.lines
    assert "(waiting for" not in waiting()[0] and all("(waiting for" in line for line in waiting()[1:])
    assert ledger.get_state("x") == 1
    assert any("carrying on" in line for line in said.lines)
    ledger.close()


def test_a_signal_while_the_ledger_is_locked_ends_the_wait_without_writing(tmp_path, quick, said):
    path = tmp_path / "ledger.sqlite"
    stop = threading.Event()
    ledger = Ledger(path, disk=DiskWait(should_stop=stop.is_set))
    release, held = threading.Event(), threading.Event()
    holder = threading.Thread(target=_hold_exclusive, args=(path, release, held), daemon=True)
    holder.start()
    assert held.wait(timeout=30)
    stop.set()
    with pytest.raises(DiskFullShutdown):
        ledger.put_state("x", 1)
    release.set()
    holder.join(timeout=30)
    assert ledger.get_state("x") is None
    ledger.close()


def test_is_locked_tells_a_busy_database_from_a_full_disk():
    busy = sqlite3.OperationalError("database is locked")
    assert disk_full.is_locked(busy) and not disk_full.is_full(busy)
    assert not disk_full.is_locked(sqlite3.OperationalError("disk is full"))


def test_the_advice_for_a_write_that_failed_names_what_the_error_says():
    """A full disk says free some space; sqlite's I/O error (its -wal file made unwritable mid-run, a read-only
    remount) may be either, and says so, instead of sending the operator to look for space."""
    import errno
    import sqlite3

    from evald.ledger.disk_full import advice, is_full

    full = OSError(errno.ENOSPC, "No space left on device")
    io_error = sqlite3.OperationalError("disk I/O error")
    assert is_full(full) and is_full(io_error)
    assert advice(full) == "Free some space"
    assert "make the file and its directory writable again" in advice(io_error)
