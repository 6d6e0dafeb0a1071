"""The ledger: evald's durable memory of a checkpoint directory (sqlite, in the log directory).

Six tables (their columns: ``schema.py``):

* ``steps``: one row per training step, the unit of evaluation. A step is read from
  one file (``source``) however many files carry it. States::

      queued -> evaluating -> evaluated | failed | deleted
        \\-> skipped (reason)     \\-> queued again (interrupted, unexpected error)

* ``files``: every entry of the directory evald looked at, with what became of it
  (``used`` by a step, a ``duplicate`` of a step read from another file, or
  ``rejected`` with the reason), so each file is judged once.
* ``records``: the outbox of TensorBoard records. A record is inserted in the same
  transaction as the state change it reports and marked ``written`` once it is on
  disk, so a crash can neither lose a point nor write one twice.
* ``provenance``: per evaluated step, which weights, subset and config (evald.pipeline.swap.provenance).
* ``cells``: results keyed on (step, evaluation identity). Each benchmark suite's cell of a step
  (``suite:NAME``) is queued, evaluated and finished exactly once per identity; a new identity
  supersedes the old cells (kept, ``superseded_by`` the new identity) and queues new ones. The
  default validation's current result stays in ``steps`` with its ``identity``; when the
  validation's identity changes (another model factory, kwargs, data or subset) or ``evald retry``
  asks for it, the old result moves to ``cells`` (``validation``, superseded) and the step is
  queued again, so a step shows exactly one current result.

* ``kv``: small JSON state (decisions, control state, run end), changed inside the same
  transactions as what it follows from.

Every public method that changes anything is ONE transaction: after a crash the
ledger is at one side of each change, never in between.
"""

from __future__ import annotations

import functools
import json
import sqlite3
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Collection, Iterator, Mapping, Sequence, TypeVar

from evald.ledger.disk_full import DiskWait
from evald.ledger.schema import (  # noqa: F401 - the row types and states are the ledger's interface
    SCHEMA, STEP_COLUMNS, ADMITTED, DELETED, DUPLICATE, EVALUATED, EVALUATING, FAILED, FINAL_STATES, QUEUED, REJECTED, REPLACED,
    SCHEMA_VERSION, SKIPPED, USED, Record, Step, Taken, step_from_row, CELL_COLUMNS, SUITE_PREFIX, SUPERSEDED_TAG,
    VALIDATION, Cell, cell_from_row, BACKFILL_REQUESTS, BackfillTaken, DROPPED, KEPT, MALFORMED)
from evald.ledger.skips import TAG as SKIP_TAG, for_state as skip_text_for, lag_scalars

T = TypeVar("T")
BUSY_TIMEOUT_S = 5.0   # sqlite waits this long for another process's lock, then disk_full's wait takes over


def durable(method: Callable[..., T]) -> Callable[..., T]:
    """A public method of the ledger: one transaction (or one read), run again whole while the disk
    is full or another process holds the ledger locked (evald.ledger.disk_full); the failed attempt is
    rolled back first."""
    @functools.wraps(method)
    def call(self: "Ledger", *args: Any, **kwargs: Any) -> T:
        return self.disk.retry(f"the ledger {self.path}", lambda: method(self, *args, **kwargs),
                               cleanup=self._roll_back)
    return call


class LedgerVersionError(RuntimeError):
    """The state file was written with another ledger schema; nothing was changed in it."""


class Ledger:
    def __init__(self, path: Path, disk: DiskWait | None = None) -> None:
        self.path = Path(path)
        self.disk = disk or DiskWait()
        self._db: sqlite3.Connection | None = None
        self.disk.retry(f"the ledger {self.path}", self._open, cleanup=self.close)

    def _open(self) -> None:
        self._db = sqlite3.connect(self.path, isolation_level=None, timeout=BUSY_TIMEOUT_S)
        version = self._db.execute("PRAGMA user_version").fetchone()[0]   # before anything is written
        has_tables = self._db.execute("SELECT count(*) FROM sqlite_master WHERE type='table'").fetchone()[0]
        if version != SCHEMA_VERSION and (version != 0 or has_tables):
            self._db.close()
            raise LedgerVersionError(f"{self.path} has ledger schema {version}; this evald reads only schema "
                                     f"{SCHEMA_VERSION}. It was written by another evald version: run that "
                                     f"version, or give this evald a new --logdir (or --run-name)")
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")  # a kill -9 must not lose a state change
        with self._transaction() as db:
            for statement in SCHEMA.split(";"):
                if statement.strip():
                    db.execute(statement)
            db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    def close(self) -> None:
        if self._db is not None:
            self._db.close()

    def _roll_back(self) -> None:
        try:
            if self._db is not None and self._db.in_transaction:
                self._db.execute("ROLLBACK")
        except sqlite3.Error:
            pass  # sqlite may have rolled back by itself; the retry starts clean either way

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    # ------------------------------------------------------------ changes (one transaction each)

    @durable
    def admit(self, *, name: str, step: int, kind: str, found_via: str, run_id: str | None,
              commit_time: float | None, skip_reason: str | None = None, also: Sequence[str] = ()) -> None:
        """A new step read from file ``name`` (and the parts ``also``): queued, or skipped with ``skip_reason``."""
        with self._transaction() as db:
            self._insert_step(db, name=name, step=step, kind=kind, found_via=found_via, run_id=run_id,
                              commit_time=commit_time, skip_reason=skip_reason, also=also)

    @durable
    def take_found(self, *, name: str, step: int, kind: str, found_via: str, run_id: str | None,
                   commit_time: float | None, skip_reason_among: Callable[[list[int]], str | None],
                   replaces: Callable[[Step], bool], also: Sequence[str] = ()) -> Taken:
        """A file ``name`` (and the parts ``also``) that carries ``step``, judged and recorded in one
        transaction, so that nothing changes the step between the look and the write:
        a new step is admitted, queued or skipped with the reason ``skip_reason_among`` gives from every
        step number of the run (``step`` included); a queued step whose file this one ``replaces`` is read
        from this one instead; otherwise the file is a duplicate of the step's file."""
        with self._transaction() as db:
            row = db.execute(f"SELECT {STEP_COLUMNS} FROM steps WHERE step=?", (step,)).fetchone()
            if row is None:
                steps = sorted({s for (s,) in db.execute("SELECT step FROM steps")} | {step})
                reason = skip_reason_among(steps)
                self._insert_step(db, name=name, step=step, kind=kind, found_via=found_via, run_id=run_id,
                                  commit_time=commit_time, skip_reason=reason, also=also)
                return Taken(ADMITTED, skip_reason=reason)
            existing = step_from_row(row)
            if existing.state == QUEUED and replaces(existing):
                self._replace_source(db, step, name=name, kind=kind, run_id=run_id, commit_time=commit_time,
                                     old_reason=f"step {step} is read from {name} instead", also=also)
                return Taken(REPLACED, existing=existing)
            reason = f"step {step} is read from {existing.source} ({existing.state}); one step gets one evaluation"
            self._note_file(db, name, step, DUPLICATE, reason, also=also)
            return Taken(DUPLICATE, existing=existing, reason=reason)

    def _insert_step(self, db: sqlite3.Connection, *, name: str, step: int, kind: str, found_via: str,
                     run_id: str | None, commit_time: float | None, skip_reason: str | None,
                     also: Sequence[str]) -> None:
        now = time.time()
        for entry in (name, *also):
            db.execute("INSERT INTO files(name, step, status, found_at) VALUES (?,?,?,?)", (entry, step, USED, now))
        db.execute("INSERT INTO steps(step, state, source, kind, run_id, commit_time, found_via, reason,"
                   " admitted_at, finished_at) VALUES (?,?,?,?,?,?,?,?,?,?)",
                   (step, SKIPPED if skip_reason else QUEUED, name, kind, run_id, commit_time, found_via,
                    skip_reason, now, now if skip_reason else None))
        if skip_reason:
            self._outbox(db, _skip_record(db, step, skip_reason, now, commit_time or now))

    @staticmethod
    def _replace_source(db: sqlite3.Connection, step: int, *, name: str, kind: str, run_id: str | None,
                        commit_time: float | None, old_reason: str, also: Sequence[str]) -> None:
        (old,) = db.execute("SELECT source FROM steps WHERE step=? AND state=?", (step, QUEUED)).fetchone()
        db.execute("UPDATE files SET status=?, reason=? WHERE name=?", (DUPLICATE, old_reason, old))
        for entry in (name, *also):
            db.execute("INSERT INTO files(name, step, status, found_at) VALUES (?,?,?,?)",
                       (entry, step, USED, time.time()))
        db.execute("UPDATE steps SET source=?, kind=?, run_id=?, commit_time=? WHERE step=?",
                   (name, kind, run_id, commit_time, step))

    @durable
    def note_file(self, name: str, step: int | None, status: str, reason: str,
                  fail_step: bool = False, fail_state: str = FAILED, also: Sequence[str] = ()) -> None:
        """A file (and the parts ``also``) that is a duplicate or rejected; with ``fail_step``, its step
        (if new) ends ``fail_state``."""
        with self._transaction() as db:
            self._note_file(db, name, step, status, reason, fail_step=fail_step, fail_state=fail_state, also=also)

    def _note_file(self, db: sqlite3.Connection, name: str, step: int | None, status: str, reason: str,
                   fail_step: bool = False, fail_state: str = FAILED, also: Sequence[str] = ()) -> None:
        now = time.time()
        for entry in (name, *also):
            db.execute("INSERT OR REPLACE INTO files(name, step, status, reason, found_at) VALUES (?,?,?,?,?)",
                       (entry, step, status, reason, now))
        if fail_step and step is not None and not db.execute(
                "SELECT 1 FROM steps WHERE step=?", (step,)).fetchone():
            db.execute("INSERT INTO steps(step, state, source, kind, found_via, reason, admitted_at,"
                       " finished_at) VALUES (?,?,?,?,?,?,?,?)", (step, fail_state, name, "unknown", "scan",
                                                                   reason, now, now))
            self._outbox(db, _skip_record(db, step, skip_text_for(fail_state, name, reason), now))

    @durable
    def start(self, step: int, skips: Sequence[tuple[int, str]] = ()) -> None:
        """``step`` is being evaluated (one more attempt); ``skips`` are passed over by the lag policy."""
        now = time.time()
        with self._transaction() as db:
            self._skip(db, skips, now)
            db.execute("UPDATE steps SET state=?, started_at=?, attempts=attempts+1 WHERE step=?",
                       (EVALUATING, now, step))

    @durable
    def skip(self, skips: Sequence[tuple[int, str]]) -> None:
        with self._transaction() as db:
            self._skip(db, skips, time.time())

    @durable
    def finish(self, step: int, state: str, *, reason: str | None = None,
               metrics: Mapping[str, float] | None = None, record: Record | None = None,
               kv: Mapping[str, Any] | None = None, provenance: Mapping[str, Any] | None = None,
               identity: str | None = None) -> None:
        """The outcome of an evaluation, its record, the decisions it led to and its provenance, at once;
        ``identity``: the validation's identity that judged it (None: the checkpoint's own fault)."""
        assert state in (EVALUATED, FAILED, DELETED), state
        with self._transaction() as db:
            db.execute("UPDATE steps SET state=?, reason=?, finished_at=?, metrics=?, identity=? WHERE step=?",
                       (state, reason, time.time(), json.dumps(dict(metrics)) if metrics else None, identity,
                        step))
            if record is not None:
                self._outbox(db, record)
            if provenance is not None:  # evald.pipeline.swap.provenance: which weights, subset and config
                db.execute("INSERT OR REPLACE INTO provenance VALUES (?, ?)", (step, json.dumps(provenance)))
            _put(db, kv)

    @durable
    def requeue(self, step: int, reason: str) -> None:
        with self._transaction() as db:
            db.execute("UPDATE steps SET state=?, reason=? WHERE step=?", (QUEUED, reason, step))

    @durable
    def requeue_failures(self, steps: Sequence[int], forget_steps: Sequence[int], forget_files: Sequence[str],
                         reason: str, counter: str | None, kv: Mapping[str, Any] | None = None) -> None:
        """Failed, deleted or skipped ``steps`` back to the queue (found_via retry, attempts reset),
        ``forget_steps`` and ``forget_files`` forgotten (to be judged again), ``counter`` in kv
        incremented, at once. A skipped step comes back only when asked for by name (evald retry
        --step, evald backfill): the caller chooses ``steps``."""
        with self._transaction() as db:
            failed = (FAILED, DELETED)
            self._requeue(db, steps, reason)
            db.executemany("DELETE FROM steps WHERE step=? AND state IN (?,?)", [(s, *failed) for s in forget_steps])
            db.executemany("DELETE FROM files WHERE name=?", [(name,) for name in forget_files])
            if counter:
                kv = {**(kv or {}), counter: self.get_state(counter, 0) + 1}
            _put(db, kv)

    @staticmethod
    def _requeue(db: sqlite3.Connection, steps: Sequence[int], reason: str) -> None:
        db.executemany("UPDATE steps SET state=?, reason=?, found_via='retry', attempts=0, finished_at=NULL"
                       " WHERE step=? AND state IN (?,?,?)", [(QUEUED, reason, s, FAILED, DELETED, SKIPPED)
                                                               for s in steps])

    # -- `evald backfill`'s requests: recorded by the command, taken by the evald serving the run ----------

    @durable
    def add_backfill_request(self, suite: str, steps: Sequence[int], *, revalidate: Sequence[int] = (),
                             reason: str = "re-queued by evald backfill") -> None:
        """`evald backfill --suite`'s request, at once: the ``revalidate`` steps (skipped by the lag policy)
        queued again and ``{suite, steps}`` appended to kv ``backfill_requests``. The list is read and written
        inside this one transaction, so a request taken or recorded meanwhile by another process (the evald
        serving the run) is never overwritten."""
        with self._transaction() as db:
            self._requeue(db, revalidate, reason)
            requests = _kv(db, BACKFILL_REQUESTS) or []
            _put(db, {BACKFILL_REQUESTS: [*requests, {"suite": suite, "steps": [int(s) for s in steps]}]})

    @durable
    def take_backfill_requests(self, identities: Mapping[str, str], keep: Collection[str]) -> list[BackfillTaken]:
        """Every recorded backfill request taken, at once (like take_found): a request for a suite of
        ``identities`` (suite -> its cell identity) has its missing cells queued; one for a suite in ``keep``
        (configured, not built yet) stays recorded; any other is dropped. What became of each, in order."""
        identities, keep = dict(identities), set(keep)   # the caller's views read before the transaction
        taken: list[BackfillTaken] = []
        if not self._db.execute("SELECT 1 FROM kv WHERE key=? AND value NOT IN ('[]', 'null')",
                                (BACKFILL_REQUESTS,)).fetchone():
            return taken    # the common turn: nothing asked, nothing written (a request recorded now waits a turn)
        with self._transaction() as db:
            left = []
            for request in _kv(db, BACKFILL_REQUESTS) or []:
                suite, steps = _request_fields(request)
                if suite is None:
                    taken.append(BackfillTaken(str(request)[:200], (), MALFORMED))
                elif suite in identities:
                    queued = self._queue_cells(db, suite, identities[suite], steps)
                    taken.append(BackfillTaken(suite, steps, QUEUED, tuple(queued)))
                elif suite in keep:
                    left.append(request)
                    taken.append(BackfillTaken(suite, steps, KEPT))
                else:
                    taken.append(BackfillTaken(suite, steps, DROPPED))
            _put(db, {BACKFILL_REQUESTS: left})
        return taken

    @durable
    def recover_interrupted(self, max_attempts: int) -> list[Step]:
        """At start: steps (and suite cells) left ``evaluating`` by a crash go back to ``queued``, or fail
        past max_attempts."""
        interrupted = self.steps(EVALUATING)
        now = time.time()
        with self._transaction() as db:
            for cell in self.cells(EVALUATING):
                state, reason = ((FAILED, f"evaluation interrupted {cell.attempts} times; giving up: "
                                  f"`evald retry --step {cell.step}` or raise tuning.max_attempts")
                                 if cell.attempts >= max_attempts else
                                 (QUEUED, "re-queued: evald was interrupted while evaluating it"))
                db.execute("UPDATE cells SET state=?, reason=? WHERE step=? AND evaluation=? AND superseded_by IS "
                           "NULL", (state, reason, cell.step, cell.evaluation))
            for row in interrupted:
                if row.attempts >= max_attempts:
                    reason = (f"evaluation interrupted {row.attempts} times (evald killed or crashed while "
                              f"evaluating it); giving up: raise tuning.max_attempts or `evald retry {row.step}`")
                    db.execute("UPDATE steps SET state=?, reason=?, finished_at=? WHERE step=?",
                               (FAILED, reason, now, row.step))
                    self._outbox(db, _skip_record(db, row.step, skip_text_for(FAILED, row.source, reason), now))
                else:
                    db.execute("UPDATE steps SET state=?, reason=? WHERE step=?",
                               (QUEUED, "re-queued: evald was interrupted while evaluating it", row.step))
        return interrupted

    # -- evaluation identities: the validation's, and suite cells ---------------------------------

    @durable
    def supersede_validation(self, identity: str, run_id: str | None = None) -> list[int]:
        """Steps judged (evaluated or failed) under another validation identity: their results become
        superseded cells and the steps are queued again, at once. With ``run_id``, only that run's steps
        (an earlier run in the same directory may have had another model). The steps, in order."""
        rows = self._db.execute(f"SELECT {STEP_COLUMNS}, identity FROM steps WHERE state IN (?,?) AND identity "
                                "IS NOT NULL AND identity != ? AND (? IS NULL OR run_id IS NULL OR run_id = ?) "
                                "ORDER BY step", (EVALUATED, FAILED, identity, run_id, run_id)).fetchall()
        with self._transaction() as db:
            for row in rows:
                old = step_from_row(row[:-1])
                self._supersede_step(db, old, row[-1], identity, f"re-queued: the evaluation changed (identity "
                                     f"{row[-1][:12]} -> {identity[:12]}: model, data, subset or settings)")
        return [row[0] for row in rows]

    @durable
    def supersede_steps(self, steps: Sequence[int], by: str, reason: str) -> list[int]:
        """Evaluated ``steps`` re-queued on request (``by``: why, e.g. retry), their results kept superseded."""
        done = []
        with self._transaction() as db:
            for step in steps:
                row = db.execute(f"SELECT {STEP_COLUMNS}, identity FROM steps WHERE step=? AND state=?",
                                 (step, EVALUATED)).fetchone()
                if row is not None:
                    self._supersede_step(db, step_from_row(row[:-1]), row[-1] or "", by, reason)
                    done.append(step)
        return done

    def _supersede_step(self, db: sqlite3.Connection, old: Step, old_identity: str, by: str, reason: str) -> None:
        now = time.time()
        provenance = db.execute("SELECT value FROM provenance WHERE step=?", (old.step,)).fetchone()
        db.execute("INSERT INTO cells(step, evaluation, identity, state, attempts, reason, metrics, provenance,"
                   " created_at, finished_at, superseded_by) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                   (old.step, VALIDATION, old_identity, old.state, old.attempts, old.reason,
                    json.dumps(old.metrics) if old.metrics else None, provenance[0] if provenance else None, now,
                    now, by))
        db.execute("UPDATE steps SET state=?, reason=?, found_via='retry', attempts=0, finished_at=NULL, "
                   "metrics=NULL, identity=NULL WHERE step=?", (QUEUED, reason, old.step))
        was = f"{old.state}" + (f" ({old.reason})" if old.state != EVALUATED and old.reason else "")
        self._outbox(db, Record("eval", old.step, now, {}, {SUPERSEDED_TAG: (
            f"the earlier result at this step ({was}, identity {old_identity[:12] or 'unknown'}) is superseded "
            f"by {by[:12]}; the step is evaluated again and its new result is the current one")}))

    @durable
    def queue_cells(self, suite: str, identity: str, steps: Sequence[int]) -> list[int]:
        """Queue the suite's cell of each step that has no current one; the steps queued."""
        with self._transaction() as db:
            return self._queue_cells(db, suite, identity, steps)

    @staticmethod
    def _queue_cells(db: sqlite3.Connection, suite: str, identity: str, steps: Sequence[int]) -> list[int]:
        evaluation, now, queued = SUITE_PREFIX + suite, time.time(), []
        for step in steps:
            if db.execute("SELECT 1 FROM cells WHERE step=? AND evaluation=? AND superseded_by IS NULL",
                          (step, evaluation)).fetchone() is None:
                db.execute("INSERT INTO cells(step, evaluation, identity, state, created_at) VALUES (?,?,?,?,?)",
                           (step, evaluation, identity, QUEUED, now))
                queued.append(step)
        return queued

    @durable
    def supersede_suite(self, suite: str, identity: str) -> list[int]:
        """The suite's current cells of another identity are superseded by ``identity``, whose cells are
        queued for the same steps, at once. The steps, in order."""
        evaluation, now = SUITE_PREFIX + suite, time.time()
        with self._transaction() as db:
            steps = [s for (s,) in db.execute("SELECT step FROM cells WHERE evaluation=? AND superseded_by IS NULL"
                                             " AND identity != ? ORDER BY step", (evaluation, identity))]
            db.execute("UPDATE cells SET superseded_by=? WHERE evaluation=? AND superseded_by IS NULL AND identity "
                       "!= ?", (identity, evaluation, identity))
            db.executemany("INSERT INTO cells(step, evaluation, identity, state, created_at) VALUES (?,?,?,?,?)",
                           [(s, evaluation, identity, QUEUED, now) for s in steps])
        return steps

    @durable
    def start_cell(self, step: int, suite: str, identity: str) -> None:
        with self._transaction() as db:
            db.execute("UPDATE cells SET state=?, attempts=attempts+1 WHERE step=? AND evaluation=? AND identity=? "
                       "AND superseded_by IS NULL", (EVALUATING, step, SUITE_PREFIX + suite, identity))

    @durable
    def finish_cell(self, step: int, suite: str, identity: str, state: str, *, reason: str | None = None,
                    metrics: Mapping[str, float] | None = None, record: Record | None = None,
                    provenance: Mapping[str, Any] | None = None, kv: Mapping[str, Any] | None = None) -> None:
        """A suite cell's outcome, its TensorBoard record and the decisions it led to, at once."""
        assert state in (EVALUATED, FAILED, DELETED, QUEUED), state
        with self._transaction() as db:
            db.execute("UPDATE cells SET state=?, reason=?, metrics=?, provenance=?, finished_at=? WHERE step=? AND "
                       "evaluation=? AND identity=? AND superseded_by IS NULL",
                       (state, reason, json.dumps(dict(metrics)) if metrics else None,
                        json.dumps(provenance) if provenance else None, time.time(), step, SUITE_PREFIX + suite,
                        identity))
            if record is not None:
                self._outbox(db, record)
            _put(db, kv)

    @durable
    def take_cell(self, step: int, suite: str, identity: str, state: str, *, reason: str | None = None,
                  metrics: Mapping[str, float] | None = None, record: Record | None = None,
                  provenance: Mapping[str, Any] | None = None) -> str:
        """A cell finished elsewhere (a backfill fleet's file, evald.daemon.fleet_merge), taken in with its
        TensorBoard record, at once and at most once: ``taken``; ``already`` when the suite's current cell of
        ``step`` is evaluated under ``identity`` (or a failure meets any finished cell); ``conflict`` when
        the current cell has another identity (the suite changed since the fleet ran): nothing is written."""
        assert state in (EVALUATED, FAILED, DELETED), state
        evaluation, now = SUITE_PREFIX + suite, time.time()
        with self._transaction() as db:
            row = db.execute("SELECT identity, state FROM cells WHERE step=? AND evaluation=? AND superseded_by IS "
                             "NULL", (step, evaluation)).fetchone()
            if row is not None and row[0] != identity:
                return "conflict"
            if row is not None and (row[1] == EVALUATED or (state != EVALUATED and row[1] in (FAILED, DELETED))):
                return "already"
            values = (state, reason, json.dumps(dict(metrics)) if metrics else None,
                      json.dumps(provenance) if provenance else None, now)
            if row is None:
                db.execute("INSERT INTO cells(state, reason, metrics, provenance, finished_at, step, evaluation, "
                           "identity, attempts, created_at) VALUES (?,?,?,?,?,?,?,?,1,?)",
                           (*values, step, evaluation, identity, now))
            else:
                db.execute("UPDATE cells SET state=?, reason=?, metrics=?, provenance=?, finished_at=? WHERE step=? "
                           "AND evaluation=? AND superseded_by IS NULL", (*values, step, evaluation))
            if record is not None:
                self._outbox(db, record)
        return "taken"

    @durable
    def add_records(self, records: Sequence[Record], kv: Mapping[str, Any] | None = None) -> None:
        with self._transaction() as db:
            for record in records:
                self._outbox(db, record)
            _put(db, kv)

    @durable
    def mark_written(self, ids: Sequence[int]) -> None:
        with self._transaction() as db:
            db.executemany("UPDATE records SET written=1 WHERE id=?", [(i,) for i in ids])

    @durable
    def put_state(self, key: str, value: Any) -> None:
        with self._transaction() as db:
            _put(db, {key: value})

    # ------------------------------------------------------------ reads

    @durable
    def step(self, step: int) -> Step | None:
        row = self._db.execute(f"SELECT {STEP_COLUMNS} FROM steps WHERE step=?", (step,)).fetchone()
        return step_from_row(row) if row else None

    @durable
    def steps(self, *states: str) -> list[Step]:
        where = f" WHERE state IN ({','.join('?' * len(states))})" if states else ""
        rows = self._db.execute(f"SELECT {STEP_COLUMNS} FROM steps{where} ORDER BY step", states).fetchall()
        return [step_from_row(r) for r in rows]

    @durable
    def step_numbers(self) -> list[int]:
        return [s for (s,) in self._db.execute("SELECT step FROM steps ORDER BY step")]

    @durable
    def step_sources(self) -> list[tuple[int, str]]:
        """Every step with the entry it is read from, by step (no metrics parsed: the leases read it each second)."""
        return [(s, src) for s, src in self._db.execute("SELECT step, source FROM steps ORDER BY step")]

    @durable
    def counts(self) -> dict[str, int]:
        return dict(self._db.execute("SELECT state, COUNT(*) FROM steps GROUP BY state").fetchall())

    @durable
    def file_status(self, name: str) -> str | None:
        row = self._db.execute("SELECT status FROM files WHERE name=?", (name,)).fetchone()
        return row[0] if row else None

    @durable
    def files(self) -> list[tuple[str, int | None, str, str | None]]:
        return self._db.execute("SELECT name, step, status, reason FROM files ORDER BY name").fetchall()

    @durable
    def pending_records(self) -> list[Record]:
        rows = self._db.execute("SELECT id, stream, step, wall_time, payload FROM records WHERE written=0 "
                                "ORDER BY id").fetchall()
        return [Record(stream, step, wall_time, (data := json.loads(payload)).get("scalars", {}), data.get("texts", {}),
                       rid) for rid, stream, step, wall_time, payload in rows]

    @durable
    def record_streams(self) -> list[str]:
        """The streams that have records (the TensorBoard sink's sub-runs)."""
        return [s for (s,) in self._db.execute("SELECT DISTINCT stream FROM records ORDER BY stream")]

    @durable
    def records(self, streams: Sequence[str]) -> list[Record]:
        """Every record of these streams, written or pending, in the order they were committed (the
        TensorBoard sink rewrites a sub-run's events from them: evald.sinks.tensorboard_view)."""
        marks = ",".join("?" * len(streams))
        rows = self._db.execute(f"SELECT id, stream, step, wall_time, payload FROM records WHERE stream IN ({marks}) "
                                "ORDER BY id", tuple(streams)).fetchall()
        return [Record(stream, step, wall_time, (data := json.loads(payload)).get("scalars", {}), data.get("texts", {}),
                       rid) for rid, stream, step, wall_time, payload in rows]

    @durable
    def written_records(self, steps: Sequence[int]) -> list[Record]:
        """Records already written to TensorBoard at these steps (the sink's start-up reconciliation)."""
        out = []
        for step in sorted(set(steps)):
            for rid, stream, wall_time, payload in self._db.execute(
                    "SELECT id, stream, wall_time, payload FROM records WHERE written=1 AND step=? ORDER BY id",
                    (step,)):
                data = json.loads(payload)
                out.append(Record(stream, step, wall_time, data.get("scalars", {}), data.get("texts", {}), rid))
        return out

    @durable
    def provenance(self, step: int) -> dict[str, Any] | None:
        rows = self._db.execute("SELECT value FROM provenance WHERE step=?", (step,))
        return next((json.loads(value) for (value,) in rows), None)

    @durable
    def cell(self, step: int, suite: str) -> Cell | None:
        """The suite's current cell of ``step``."""
        row = self._db.execute(f"SELECT {CELL_COLUMNS} FROM cells WHERE step=? AND evaluation=? AND superseded_by "
                               "IS NULL", (step, SUITE_PREFIX + suite)).fetchone()
        return cell_from_row(row) if row else None

    @durable
    def cells(self, *states: str, suite: str | None = None) -> list[Cell]:
        """Current suite cells (in these states, of this suite), by step."""
        where, args = ["superseded_by IS NULL", "evaluation LIKE ?"], [SUITE_PREFIX + (suite or "%")]
        if suite is not None:
            where[-1], args = "evaluation=?", [SUITE_PREFIX + suite]
        if states:
            where.append(f"state IN ({','.join('?' * len(states))})")
            args += states
        rows = self._db.execute(f"SELECT {CELL_COLUMNS} FROM cells WHERE {' AND '.join(where)} ORDER BY step, "
                                "evaluation", args).fetchall()
        return [cell_from_row(r) for r in rows]

    @durable
    def cell_details(self, step: int, suite: str) -> tuple[dict[str, Any] | None, float | None]:
        """The suite's current cell of ``step``: its provenance (identities, the snapshot digest) and when
        it finished (evald export)."""
        row = self._db.execute("SELECT provenance, finished_at FROM cells WHERE step=? AND evaluation=? AND "
                               "superseded_by IS NULL", (step, SUITE_PREFIX + suite)).fetchone()
        return (json.loads(row[0]) if row and row[0] else None), (row[1] if row else None)

    @durable
    def superseded(self, step: int) -> list[Cell]:
        """Results of ``step`` that were superseded (validation and suites), oldest first."""
        rows = self._db.execute(f"SELECT {CELL_COLUMNS} FROM cells WHERE step=? AND superseded_by IS NOT NULL "
                                "ORDER BY id", (step,)).fetchall()
        return [cell_from_row(r) for r in rows]

    @durable
    def cell_counts(self) -> dict[str, dict[str, int]]:
        """Each suite's current cells by state."""
        counts: dict[str, dict[str, int]] = {}
        for evaluation, state, n in self._db.execute(
                "SELECT evaluation, state, COUNT(*) FROM cells WHERE superseded_by IS NULL AND evaluation LIKE ? "
                "GROUP BY evaluation, state", (SUITE_PREFIX + "%",)):
            counts.setdefault(evaluation[len(SUITE_PREFIX):], {})[state] = n
        return counts

    @durable
    def get_state(self, key: str, default: Any = None) -> Any:
        row = self._db.execute("SELECT value FROM kv WHERE key=?", (key,)).fetchone()
        return json.loads(row[0]) if row else default

    # ------------------------------------------------------------ internals

    @staticmethod
    def _outbox(db: sqlite3.Connection, record: Record) -> None:
        payload = json.dumps({"scalars": dict(record.scalars), "texts": dict(record.texts)})
        db.execute("INSERT INTO records(stream, step, wall_time, payload) VALUES (?,?,?,?)",
                   (record.stream, record.step, record.wall_time, payload))

    def _skip(self, db: sqlite3.Connection, skips: Sequence[tuple[int, str]], now: float) -> None:
        for step, reason in skips:
            db.execute("UPDATE steps SET state=?, reason=?, finished_at=? WHERE step=?", (SKIPPED, reason, now, step))
            self._outbox(db, _skip_record(db, step, reason, now))


def _skip_record(db: sqlite3.Connection, step: int, text: str, now: float, wall_time: float | None = None) -> Record:
    newest = db.execute("SELECT MAX(step) FROM steps").fetchone()[0]
    (commit,) = db.execute("SELECT commit_time FROM steps WHERE step=?", (step,)).fetchone() or (None,)
    return Record("eval", step, wall_time or now, lag_scalars(step, newest, commit, now), {SKIP_TAG: text})




def _kv(db: sqlite3.Connection, key: str) -> Any:
    row = db.execute("SELECT value FROM kv WHERE key=?", (key,)).fetchone()
    return json.loads(row[0]) if row else None


def _request_fields(request: Any) -> tuple[str | None, tuple[int, ...]]:
    """A recorded backfill request's suite and steps; (None, ()) when it is not ``{suite: str, steps: [int]}``."""
    if not isinstance(request, dict) or not isinstance(request.get("suite"), str):
        return None, ()
    steps = request.get("steps") or []
    if not isinstance(steps, list) or not all(type(s) is int for s in steps):
        return None, ()
    return request["suite"], tuple(steps)


def _put(db: sqlite3.Connection, kv: Mapping[str, Any] | None) -> None:
    for key, value in (kv or {}).items():
        db.execute("INSERT OR REPLACE INTO kv(key, value) VALUES (?, ?)", (key, json.dumps(value)))
