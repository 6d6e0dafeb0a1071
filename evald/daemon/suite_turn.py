"""Benchmark suites in the work loop: which cells to queue, which to evaluate next, and their commit.

A suite covers the steps evaluated since it was first configured for the run (kv
``suites_since``: a suite added to a run that has evaluated steps starts after them; the older
ones are ``evald backfill``'s): each such step whose validation is evaluated and that the suite's
``every_k`` selects (the first, then every k-th) gets a cell. Which cells are due is derived from
the ledger at every turn, so a crash between a step's validation and its cells loses none.
The cells of the step just validated run at once, on the weights the network already holds; other
queued cells (backfill, or cells left by a restart) run newest first, and only when no checkpoint
waits for its validation, so while training runs the newest checkpoint goes first.

One cell is one ledger transaction each way (start, finish with its TensorBoard record), and its
per-sample files (evald.ledger.samples) are written, deterministically and atomically, before the
finishing transaction, so a crash anywhere evaluates the cell again and writes the same files and
exactly one TensorBoard point per metric (the crash-replay test covers it). What an evaluated cell
commits is evald.daemon.cell_commit's, as for a backfill fleet's cells.

May import: sinks, intake, decisions, pipeline, files, ledger, config, contracts, and the daemon's cell_commit.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from evald.contracts.partition import source_exists
from evald.daemon.cell_commit import (EvaluatedCell, cell_commit, layout_update, samples_text, write_cell_samples,
                                     write_layout)
from evald.decisions.decisions import Decisions, Outcome
from evald.decisions.monitor_targets import parse_suite_monitor
from evald.ledger.ledger import DELETED, EVALUATED, FAILED, QUEUED, SKIPPED, Ledger, Record
from evald.ledger.schema import BACKFILL_REQUESTS, DROPPED, MALFORMED, Cell
from evald.ledger.samples import SampleFileError, samples_of
from evald.pipeline.seam import EvaluationPipeline, Failed, Retry, SuiteEvaluated
from evald.pipeline.tasks.base import EvaluationInterrupted
from evald.pipeline.suites.tokenizer import TokenizerChanged, check_unchanged
from evald.sinks import tensorboard_layout
from evald.sinks.sample_files import StepSamples, paired_se_of_monitor

if TYPE_CHECKING:   # the runner imports lm-eval; suite_turn runs without a suite configured too
    from evald.pipeline.suites.runner import SuiteResult

log = logging.getLogger("evald")

BACKFILL_KEY = BACKFILL_REQUESTS      # kv: requests from `evald backfill` not yet queued
SINCE_KEY = "suites_since"           # kv: {suite: the first step it covers without a backfill}
TOKENIZER_KEY = "tokenizer_sha256"   # kv: the tokenizer this run's benchmarks use (one per run)


def on_built(ledger: Ledger, pipeline: EvaluationPipeline, run_id: str | None = None) -> None:
    """After a (re)build: results of another validation identity are superseded and their steps queued
    again (issue 18.2/18.3); each suite's cells of another identity are superseded and queued again."""
    identity = pipeline.validation_identity
    if identity is not None:
        again = ledger.supersede_validation(identity, run_id)
        if again:
            log.warning("the evaluation changed (model, data, subset or settings: identity %s): %d step(s) "
                        "evaluated with the old one are evaluated again; their old results are kept, marked "
                        "superseded: %s", identity[:12], len(again), ", ".join(map(str, again)))
    recorded = ledger.get_state(TOKENIZER_KEY)
    for name, runner in list(pipeline.suites.items()):
        try:
            check_unchanged(recorded, str(runner.identity["tokenizer"]),
                            max(ledger.step_numbers(), default=0))
        except TokenizerChanged as exc:
            pipeline.refuse_suite(name, str(exc))
            log.error("suite %s not run: %s", name, exc)
            continue
        if recorded is None:
            recorded = runner.identity["tokenizer"]
            ledger.put_state(TOKENIZER_KEY, recorded)
    since = dict(ledger.get_state(SINCE_KEY) or {})
    # configured, built or not: a suite built after the first validations still covers them
    new = [name for name in (*pipeline.suites, *pipeline.suites_pending) if name not in since]
    if new:
        first = max((row.step for row in ledger.steps(EVALUATED)), default=-1) + 1
        ledger.put_state(SINCE_KEY, {**since, **{name: first for name in new}})
    for name, runner in pipeline.suites.items():
        again = ledger.supersede_suite(name, runner.cell_identity)
        if again:
            log.warning("suite %s or the model it runs on changed (identity %s, cell %s): %d cell(s) of the old "
                        "cell identity superseded and queued again: steps %s", name, runner.cell_identity[:12],
                        runner.cell_identity, len(again),
                        ", ".join(map(str, again)))
    take_backfill_requests(ledger, pipeline)
    note_unbuildable(ledger, pipeline)


def note_unbuildable(ledger: Ledger, pipeline: EvaluationPipeline) -> int:
    """The queued cells of a suite that cannot be built say why (``evald status``, the ledger): they wait,
    never silently, and run once the suite is fixed and evald started again (a fix that changes the suite's
    identity supersedes them with new ones). The cells given the reason now; it is logged once per suite."""
    noted = 0
    for name, why in sorted(pipeline.suite_errors.items()):
        reason = f"waiting: {why[:1000]}"
        waiting = [c for c in ledger.cells(QUEUED, suite=name) if c.reason != reason]
        for cell in waiting:
            ledger.finish_cell(cell.step, name, cell.identity, QUEUED, reason=reason)
        if waiting:
            log.error("suite %s cannot be built: %d queued cell(s) (steps %s) wait until it is fixed and evald is "
                      "started again; evald status shows why", name, len(waiting),
                      ", ".join(str(c.step) for c in waiting[:20]) + (" ..." if len(waiting) > 20 else ""))
        noted += len(waiting)
    return noted


def selected(evaluated_steps: Sequence[int], step: int, every_k: int) -> bool:
    """The first evaluated step, then every ``every_k``-th one."""
    ordered = sorted(evaluated_steps)
    return step in ordered and ordered.index(step) % every_k == 0


def queue_due(ledger: Ledger, pipeline: EvaluationPipeline) -> list[tuple[str, int]]:
    """Queue every due cell that is missing (see the module's docstring); the (suite, step) queued."""
    if not pipeline.suites:
        return []
    evaluated = [row.step for row in ledger.steps(EVALUATED)]
    since = ledger.get_state(SINCE_KEY) or {}
    have = {(c.suite, c.step) for c in ledger.cells()}
    queued = []
    for name, runner in sorted(pipeline.suites.items()):
        due = [s for s in evaluated if s >= since.get(name, 0) and (name, s) not in have
               and selected(evaluated, s, runner.options.every_k)]
        if due:
            queued += [(name, s) for s in ledger.queue_cells(name, runner.cell_identity, due)]
    return queued


@dataclass(frozen=True)
class BackfillPlan:
    """What `evald backfill` covers: retained checkpoints in range (every ``every``-th of them), and why
    the others in range are left out."""

    steps: tuple[int, ...]                  # retained steps covered, validation evaluated, queued or skipped
    revalidate: tuple[int, ...]             # of them, the steps the lag policy skipped: validation queued too
    left_out: tuple[tuple[int, str], ...]   # (step, why)


def plan_backfill(ledger: Ledger, ckpt_dir: Path, steps: tuple[int, int] | None, every: int | None) -> BackfillPlan:
    """Retained checkpoints a backfill covers: steps whose file is still there and whose validation is
    evaluated, queued (e.g. by `evald retry --step`), being evaluated, or was skipped by the lag policy
    (then it is queued again first); a failed step and a step whose file is gone are left out, each with
    its reason."""
    rows = [row for row in ledger.steps() if steps is None or steps[0] <= row.step <= steps[1]]
    covered, left_out = [], []
    for row in rows:
        if row.state in (FAILED, DELETED):
            left_out.append((row.step, f"{row.state} ({row.reason or 'no reason recorded'}): `evald retry "
                                       f"{row.step}` first"))
        elif not source_exists(ckpt_dir, row.source):
            left_out.append((row.step, f"its checkpoint {row.source} is no longer in {ckpt_dir}"))
        else:
            covered.append(row)
    if every:
        covered = covered[::every]
    return BackfillPlan(tuple(row.step for row in covered),
                        tuple(row.step for row in covered if row.state == SKIPPED), tuple(left_out))


def backfill_steps(ledger: Ledger, ckpt_dir: Path, steps: tuple[int, int] | None, every: int | None) -> list[int]:
    """The retained steps a backfill covers (plan_backfill)."""
    return list(plan_backfill(ledger, ckpt_dir, steps, every).steps)


def take_backfill_requests(ledger: Ledger, pipeline: EvaluationPipeline, ckpt_dir: Path | None = None) -> int:
    """Queue the cells `evald backfill` asked for (kv ``backfill_requests``), in one ledger transaction
    (Ledger.take_backfill_requests: a request recorded meanwhile is taken or kept, never overwritten); cells
    queued. A request for a suite configured but not built (yet, or until it is fixed) is kept."""
    identities = {name: runner.cell_identity for name, runner in pipeline.suites.items()}
    keep = {*pipeline.suite_errors, *pipeline.suites_pending}
    queued = 0
    for taken in ledger.take_backfill_requests(identities, keep):
        if taken.outcome == DROPPED:     # no such suite here: said once and dropped, never kept forever
            log.error("backfill of suite %r dropped: this evald has no such suite (its suites: %s); configure it "
                      "([suites.NAME]) and run evald backfill again", taken.suite, ", ".join(sorted(identities))
                      or "none")
        elif taken.outcome == MALFORMED:
            log.error("a backfill request in the ledger is not {suite, steps} (%s): dropped", taken.suite)
        elif taken.outcome == QUEUED:
            queued += len(taken.queued)
            log.info("backfill of suite %s: %d cell(s) queued of %d retained step(s) (the others have one)",
                     taken.suite, len(taken.queued), len(taken.steps))
    return queued


@dataclass
class SuiteMonitor:
    """Early stopping and the best pointer on a suite metric (``--monitor SUITE/TASK/METRIC``): the
    decisions see each cell of that suite, with the paired SE of its difference from the best step
    (evald.sinks.sample_files), and their state is committed with the cell."""

    decisions: Decisions
    newest_step: Callable[[], int]
    every_n_steps: Callable[[], int | None]
    outcome: Outcome | None = None      # of the last cell it decided on (the run publishes it)

    def wants(self, suite: str) -> bool:
        parsed = parse_suite_monitor(self.decisions.monitor)
        return parsed is not None and parsed.suite == suite

    def monitored_samples(self, result: SuiteResult, written: Mapping[str, Path]) -> StepSamples | None:
        """The monitored task's per-sample values in ``result`` (a cell of the monitored suite), as the
        file ``written[task]`` holds them; None when the result has no such task."""
        parsed = parse_suite_monitor(self.decisions.monitor)
        task = result.tasks.get(parsed.task) if parsed is not None else None
        where = written.get(parsed.task) if parsed is not None else None
        if task is None or where is None:
            return None
        try:
            return StepSamples(result.identity_sha256[:12], samples_of(task.samples, where))
        except SampleFileError:
            return None   # as a malformed file would: the unpaired rule (paired_se_of_monitor reads it and says why)

    def observe(self, run_dir: Path, step: int, scalars: Mapping[str, float],
                this_step: StepSamples | None = None) -> tuple[dict[str, str], dict]:
        """The decision texts and the ledger state to commit with the cell (``this_step``: the monitored
        task's samples of ``step``, from the cell's results in memory; else read back from its file)."""
        paired = paired_se_of_monitor(run_dir, self.decisions.monitor, step, self.decisions.best_step, this_step)
        self.outcome = self.decisions.observe_eval(step, scalars, newest_step=max(self.newest_step(), step),
                                                   every_n_steps=self.every_n_steps(), paired_se=paired.value)
        return self.outcome.texts(), {"decisions": self.decisions.state_dict()}


def evaluate_cells(ledger: Ledger, pipeline: EvaluationPipeline, ckpt_dir: Path, run_dir: Path, *, max_attempts: int,
                   step: int | None = None, monitor: SuiteMonitor | None = None) -> bool:
    """Evaluate the queued cells of ``step``, or else the newest queued cell; True if one was run."""
    runnable = _runnable(ledger, pipeline)
    if step is not None:
        chosen = [c for c in runnable if c.step == step]
    else:
        chosen = sorted(runnable, key=lambda c: (-c.step, c.evaluation))[:1]
    for cell in chosen:
        _evaluate_cell(ledger, pipeline, ckpt_dir, run_dir, cell, max_attempts, monitor)
    return bool(chosen)


def waiting_cells(ledger: Ledger, pipeline: EvaluationPipeline) -> int:
    """Queued cells this evald can run (a suite that is not built cannot hold the run open)."""
    return len(_runnable(ledger, pipeline))


def _runnable(ledger: Ledger, pipeline: EvaluationPipeline) -> list[Cell]:
    """The queued cells of built suites, of each one's current cell identity."""
    identities = {name: runner.cell_identity for name, runner in pipeline.suites.items()}
    return [c for c in ledger.cells(QUEUED) if c.suite is not None and identities.get(c.suite) == c.identity]


def _evaluate_cell(ledger: Ledger, pipeline: EvaluationPipeline, ckpt_dir: Path, run_dir: Path, cell: Cell,
                   max_attempts: int, monitor: SuiteMonitor | None = None) -> None:
    name = cell.suite
    assert name is not None, f"{cell} is the validation's, not a suite's"   # the callers pass suite cells
    row = ledger.step(cell.step)
    if row is None:
        ledger.finish_cell(cell.step, name, cell.identity, FAILED, reason="the step is not in the ledger")
        return
    ledger.start_cell(cell.step, name, cell.identity)
    try:
        outcome = pipeline.evaluate_suite(name, ckpt_dir, row)
    except EvaluationInterrupted:
        ledger.finish_cell(cell.step, name, cell.identity, QUEUED, reason="interrupted by a forced shutdown")
        raise
    now = time.time()
    if isinstance(outcome, SuiteEvaluated):
        result = outcome.result
        evaluated = EvaluatedCell(name, result.identity, result.identity_sha256, result.scalars(), result.tasks,
                                  {"evaluate_s": result.evaluate_s, "load_s": outcome.load_s,
                                   "compiled_graphs": float(result.compiled_graphs), "tokens": float(result.tokens)},
                                  outcome.provenance)
        written = write_cell_samples(run_dir, evaluated, step=cell.step, cell_identity=cell.identity)
        commit = cell_commit(evaluated, step=cell.step, cell_identity=cell.identity, wall_time=row.commit_time or now,
                             layout_state=ledger.get_state(tensorboard_layout.LAYOUT_STATE))
        record, kv = commit.record, None
        if monitor is not None and monitor.wants(name):
            decided, kv = monitor.observe(run_dir, cell.step, commit.metrics, monitor.monitored_samples(result, written))
            record = replace(record, texts={**record.texts, **decided})
        write_layout(ledger, commit.layout)
        ledger.finish_cell(cell.step, name, cell.identity, EVALUATED, metrics=commit.metrics, record=record,
                           provenance=commit.provenance, kv=kv)
        shown = " ".join(f"{k.split('/', 1)[1]}={v:.4g}" for k, v in commit.metrics.items() if not k.endswith("_stderr"))
        log.info("step %d suite %s: %s | %.1fs, %d graph(s), %.0f tokens/s", cell.step, name, shown[:400],
                 result.evaluate_s, result.compiled_graphs, commit.tokens_per_s or 0.0,
                 extra={"step": cell.step, "state": EVALUATED, "suite": name})
        return
    current = ledger.cell(cell.step, name)
    attempts = current.attempts if current is not None else 1
    if isinstance(outcome, Failed) or attempts >= max_attempts:
        reason = outcome.reason if isinstance(outcome, Failed) else f"{outcome.reason} on each of {attempts} attempts"
        state = outcome.state if isinstance(outcome, Failed) else FAILED
        ledger.finish_cell(cell.step, name, cell.identity, state, reason=reason, record=Record(
            "eval", cell.step, row.commit_time or now, {}, {f"evald/suites/{name}/failed": reason}))
        log.error("step %d suite %s not evaluated (%s): %s", cell.step, name, state, reason)
        return
    assert isinstance(outcome, Retry)
    ledger.finish_cell(cell.step, name, cell.identity, QUEUED, reason=f"attempt {attempts}: {outcome.reason}")
    log.error("step %d suite %s: attempt %d raised unexpectedly (%s); queued again", cell.step, name, attempts,
              outcome.reason)


def _suite_layout_if_new(ledger: Ledger, step: int, scalars: Mapping[str, float], wall_time: float) -> None:
    """The Custom Scalars layout, once a suite brings metrics it does not cover (``scalars`` named as the
    layout's state names them, ``eval/SUITE/TASK/METRIC``): evald.daemon.cell_commit's, for one step."""
    write_layout(ledger, layout_update(ledger.get_state(tensorboard_layout.LAYOUT_STATE), scalars, step, wall_time))


def _samples_text(result: SuiteResult) -> str:
    """A handful of documents per task of ``result``, for TensorBoard's Text page (cell_commit.samples_text)."""
    return samples_text(result.tasks)
