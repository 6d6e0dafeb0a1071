"""The ledger of evald 0.1 (one row per file in ``checkpoints``), migrated to steps and files."""

from __future__ import annotations

import sqlite3

from evald.ledger import DELETED, DUPLICATE, EVALUATED, EVALUATING, FAILED, QUEUED, REJECTED, SKIPPED, USED


def migrate_v1(db: sqlite3.Connection) -> None:
    """A ledger of evald 0.1 (one row per file in ``checkpoints``) becomes steps and files."""
    if not db.execute("SELECT 1 FROM sqlite_master WHERE name='checkpoints'").fetchone():
        return
    rank = {EVALUATED: 0, FAILED: 1, DELETED: 1, SKIPPED: 2}
    rows = db.execute("SELECT key, step, kind, state, reason, source, run_id, commit_time, seen_at, attempts,"
                      " metrics FROM checkpoints").fetchall()
    for key, step, kind, state, reason, source, run_id, commit_time, seen_at, attempts, metrics in sorted(
            rows, key=lambda r: (rank.get(r[3], 3), r[2] != "evald", r[0])):
        if step < 0:
            db.execute("INSERT OR IGNORE INTO files VALUES (?,?,?,?,?)", (key, None, REJECTED, reason, seen_at))
        elif db.execute("SELECT 1 FROM steps WHERE step=?", (step,)).fetchone():
            db.execute("INSERT OR IGNORE INTO files VALUES (?,?,?,?,?)",
                       (key, step, DUPLICATE, f"step {step} is read from another file", seen_at))
        else:
            state = QUEUED if state in ("seen", EVALUATING) else state
            db.execute("INSERT INTO steps(step, state, source, kind, run_id, commit_time, found_via, reason,"
                       " attempts, admitted_at, metrics) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                       (step, state, key, kind, run_id, commit_time, source, reason, attempts, seen_at, metrics))
            db.execute("INSERT OR IGNORE INTO files VALUES (?,?,?,?,?)", (key, step, USED, None, seen_at))
    db.execute("ALTER TABLE checkpoints RENAME TO checkpoints_v1")
