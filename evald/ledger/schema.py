"""The ledger's tables and row types (evald.ledger.ledger): one place for the sqlite schema and the states."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

QUEUED, EVALUATING, EVALUATED, SKIPPED, FAILED, DELETED = (
    "queued", "evaluating", "evaluated", "skipped", "failed", "deleted")
FINAL_STATES = (EVALUATED, SKIPPED, FAILED, DELETED)
USED, DUPLICATE, REJECTED = "used", "duplicate", "rejected"
ADMITTED, REPLACED = "admitted", "replaced"   # what Ledger.take_found did with a file (or DUPLICATE)
SCHEMA_VERSION = 3  # 3: steps.identity and the cells table (evaluation identities)

SCHEMA = """
CREATE TABLE IF NOT EXISTS steps (
    step INTEGER PRIMARY KEY, state TEXT NOT NULL, source TEXT NOT NULL, kind TEXT NOT NULL,
    run_id TEXT, commit_time REAL, found_via TEXT NOT NULL, reason TEXT,
    attempts INTEGER NOT NULL DEFAULT 0, admitted_at REAL NOT NULL, started_at REAL,
    finished_at REAL, metrics TEXT, identity TEXT);
CREATE INDEX IF NOT EXISTS steps_state ON steps(state, step);
CREATE TABLE IF NOT EXISTS files (
    name TEXT PRIMARY KEY, step INTEGER, status TEXT NOT NULL, reason TEXT, found_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS records (
    id INTEGER PRIMARY KEY AUTOINCREMENT, stream TEXT NOT NULL, step INTEGER NOT NULL,
    wall_time REAL NOT NULL, payload TEXT NOT NULL, written INTEGER NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS records_pending ON records(written, id);
CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS provenance (step INTEGER PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS cells (
    id INTEGER PRIMARY KEY AUTOINCREMENT, step INTEGER NOT NULL, evaluation TEXT NOT NULL,
    identity TEXT NOT NULL, state TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, reason TEXT,
    metrics TEXT, provenance TEXT, created_at REAL NOT NULL, finished_at REAL, superseded_by TEXT);
CREATE UNIQUE INDEX IF NOT EXISTS cells_current ON cells(step, evaluation) WHERE superseded_by IS NULL;
CREATE INDEX IF NOT EXISTS cells_state ON cells(state, step);
"""
VALIDATION = "validation"   # the evaluation name of the default validation's superseded results
BACKFILL_REQUESTS = "backfill_requests"   # kv: `evald backfill`'s requests not yet queued (Ledger.add/take_backfill_...)
KEPT, DROPPED, MALFORMED = "kept", "dropped", "malformed"   # what Ledger.take_backfill_requests did (or QUEUED)
SUITE_PREFIX = "suite:"     # + the suite's name: a suite's cells
SUPERSEDED_TAG = "evald/superseded"


@dataclass(frozen=True)
class Step:
    step: int
    state: str
    source: str
    kind: str
    run_id: str | None
    commit_time: float | None
    found_via: str
    reason: str | None
    attempts: int
    metrics: dict[str, float] | None


@dataclass(frozen=True)
class Taken:
    """What Ledger.take_found did with a file that carries a step."""
    outcome: str                       # ADMITTED, REPLACED or DUPLICATE
    skip_reason: str | None = None     # ADMITTED as skipped by the lag policy, and why
    existing: Step | None = None       # the step's row before (REPLACED, DUPLICATE)
    reason: str | None = None          # DUPLICATE: why the file is not read


@dataclass(frozen=True)
class BackfillTaken:
    """What Ledger.take_backfill_requests did with one recorded request."""
    suite: str
    steps: tuple[int, ...]             # the retained steps it asked for
    outcome: str                       # QUEUED, KEPT (its suite is not built yet), DROPPED (no such suite), MALFORMED
    queued: tuple[int, ...] = ()       # QUEUED: the steps whose cell was queued (the others had one)


@dataclass(frozen=True)
class Record:
    """One TensorBoard record: every value of one step in one stream (eval or train)."""

    stream: str
    step: int
    wall_time: float
    scalars: Mapping[str, float]
    texts: Mapping[str, str]
    id: int | None = None


@dataclass(frozen=True)
class Cell:
    """One evaluation of one step under one identity. A suite's current cells have ``superseded_by``
    None; a superseded result (a suite's or the validation's) names what replaced it: the newer
    identity, or ``retry``."""

    step: int
    evaluation: str
    identity: str
    state: str
    attempts: int
    reason: str | None
    metrics: dict[str, float] | None
    superseded_by: str | None

    @property
    def suite(self) -> str | None:
        return self.evaluation[len(SUITE_PREFIX):] if self.evaluation.startswith(SUITE_PREFIX) else None


CELL_COLUMNS = "step, evaluation, identity, state, attempts, reason, metrics, superseded_by"


def cell_from_row(row: Sequence[Any]) -> Cell:
    step, evaluation, identity, state, attempts, reason, metrics, superseded_by = row
    return Cell(step, evaluation, identity, state, attempts, reason, json.loads(metrics) if metrics else None,
                superseded_by)


STEP_COLUMNS = "step, state, source, kind, run_id, commit_time, found_via, reason, attempts, metrics"


def step_from_row(row: Sequence[Any]) -> Step:
    *head, metrics = row
    return Step(*head, json.loads(metrics) if metrics else None)
