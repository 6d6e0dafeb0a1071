"""The ledger: evald's persistent memory of every checkpoint (sqlite3, in the log directory).

One row per checkpoint, keyed by its name in the checkpoint directory
(``step_000000100`` or a foreign file name), whichever source found it first:
ZeroMQ, watchdog or a rescan. States::

    seen -> queued -> evaluating -> evaluated
                 \\-> skipped (reason)   \\-> failed (error)   \\-> deleted (before evaluation)

Every change is committed before evald acts on it, so after a crash or
``kill -9`` a restarted evald knows exactly what is done. A row left in
``evaluating`` by a crash goes back to ``queued`` (its attempts are counted;
after ``max_attempts`` it is marked failed rather than crash-looping). The
``kv`` table persists small JSON state (early stop, health monitor).
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

SEEN, QUEUED, EVALUATING, EVALUATED, SKIPPED, FAILED, DELETED = (
    "seen", "queued", "evaluating", "evaluated", "skipped", "failed", "deleted")
FINAL_STATES = (EVALUATED, SKIPPED, FAILED, DELETED)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS checkpoints (
    key TEXT PRIMARY KEY,
    step INTEGER NOT NULL,
    kind TEXT NOT NULL,
    path TEXT NOT NULL,
    state TEXT NOT NULL,
    reason TEXT,
    source TEXT NOT NULL,
    run_id TEXT,
    commit_time REAL,
    seen_at REAL NOT NULL,
    queued_at REAL,
    started_at REAL,
    finished_at REAL,
    attempts INTEGER NOT NULL DEFAULT 0,
    metrics TEXT
);
CREATE INDEX IF NOT EXISTS checkpoints_state ON checkpoints(state, step);
CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


@dataclass(frozen=True)
class Entry:
    key: str
    step: int
    kind: str
    path: str
    state: str
    reason: str | None
    source: str
    run_id: str | None
    commit_time: float | None
    seen_at: float
    attempts: int
    metrics: dict[str, float] | None


class Ledger:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, isolation_level=None, timeout=30)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")  # a kill -9 must not lose a state change
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        self._db.close()

    # ------------------------------------------------------------ checkpoints

    def record_seen(self, key: str, step: int, kind: str, path: str, source: str,
                    run_id: str | None = None, commit_time: float | None = None) -> bool:
        """Insert a newly found checkpoint as ``seen``; False if the ledger already knows it."""
        cur = self._db.execute(
            "INSERT OR IGNORE INTO checkpoints(key, step, kind, path, state, source, run_id, commit_time,"
            " seen_at) VALUES (?,?,?,?,?,?,?,?,?)",
            (key, step, kind, path, SEEN, source, run_id, commit_time, time.time()))
        return cur.rowcount == 1

    def get(self, key: str) -> Entry | None:
        row = self._db.execute("SELECT * FROM checkpoints WHERE key=?", (key,)).fetchone()
        return self._entry(row) if row else None

    def set_state(self, key: str, state: str, reason: str | None = None,
                  metrics: dict[str, float] | None = None) -> None:
        now = time.time()
        column = {QUEUED: "queued_at", EVALUATING: "started_at"}.get(state, "finished_at")
        attempts = ", attempts = attempts + 1" if state == EVALUATING else ""
        self._db.execute(
            f"UPDATE checkpoints SET state=?, reason=?, {column}=?{attempts}"
            + (", metrics=?" if metrics is not None else "") + " WHERE key=?",
            (state, reason, now, *([json.dumps(metrics)] if metrics is not None else []), key))

    def with_state(self, *states: str) -> list[Entry]:
        marks = ",".join("?" * len(states))
        rows = self._db.execute(
            f"SELECT * FROM checkpoints WHERE state IN ({marks}) ORDER BY step, key", states).fetchall()
        return [self._entry(r) for r in rows]

    def all(self) -> list[Entry]:
        return [self._entry(r) for r in self._db.execute("SELECT * FROM checkpoints ORDER BY step, key")]

    def counts(self) -> dict[str, int]:
        return dict(self._db.execute("SELECT state, COUNT(*) FROM checkpoints GROUP BY state").fetchall())

    def recover_interrupted(self, max_attempts: int) -> list[Entry]:
        """After a crash: ``evaluating`` rows go back to ``queued`` (or ``failed`` past max_attempts)."""
        interrupted = self.with_state(EVALUATING)
        for entry in interrupted:
            if entry.attempts >= max_attempts:
                self.set_state(entry.key, FAILED,
                               f"evald stopped {entry.attempts} times while evaluating this checkpoint; "
                               f"giving up (raise --max-attempts to retry)")
            else:
                self.set_state(entry.key, QUEUED, "re-queued after evald was interrupted")
        return interrupted

    @staticmethod
    def _entry(row: Iterable[Any]) -> Entry:
        (key, step, kind, path, state, reason, source, run_id, commit_time, seen_at, _queued,
         _started, _finished, attempts, metrics) = row
        return Entry(key, step, kind, path, state, reason, source, run_id, commit_time, seen_at, attempts,
                     json.loads(metrics) if metrics else None)

    # ------------------------------------------------------------ small state

    def get_state(self, key: str, default: Any = None) -> Any:
        row = self._db.execute("SELECT value FROM kv WHERE key=?", (key,)).fetchone()
        return json.loads(row[0]) if row else default

    def put_state(self, key: str, value: Any) -> None:
        self._db.execute("INSERT OR REPLACE INTO kv(key, value) VALUES (?, ?)", (key, json.dumps(value)))
