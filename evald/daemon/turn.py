"""One turn of the work loop: pick a step, evaluate it, commit the result and its decisions.

The lag policy picks the step (its skips committed with the pick), the pipeline
evaluates it, and ONE ledger transaction records the outcome, the TensorBoard record
that reports it (metrics, decision, alerts, advice) and the decision state. The sinks
then write what was committed. So a crash at any point leaves the ledger on one side
of the change; nothing is decided or written twice (docs/reliability.md).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from evald.decisions.decisions import Decisions, Outcome
from evald.intake.lag_policy import CatchUp, decide
from evald.ledger.ledger import EVALUATED, FAILED, QUEUED, SKIPPED, DELETED, Ledger, Record, Step
from evald.ledger.requeue import RETRY
from evald.ledger.skips import TAG as SKIP_TAG, for_state as skip_text_for, lag_scalars
from evald.pipeline.swap import provenance
from evald.pipeline.metrics.uncertainty import SE_SUFFIX, se_tag
from evald.pipeline.pipeline import Evaluated, EvaluationPipeline, Failed, Retry
from evald.pipeline.tasks.base import EvaluationInterrupted
from evald.sinks import tensorboard_layout

log = logging.getLogger("evald")


class SystemicFailure(RuntimeError):
    """Evaluations keep raising unexpectedly, whatever the checkpoint: a bug or a broken set-up."""


@dataclass
class Counters:
    evaluated: int = 0              # by this process
    unexpected_in_a_row: int = 0
    bad_messages: int = 0
    handled_messages: int = 0       # valid messages the loop handled (doorbells)
    ignored_messages: int = 0
    longest_load_s: float = 0.0     # the slowest checkpoint load so far, for the run summary


@dataclass(frozen=True)
class Context:
    """What an evaluation needs to know about the run besides the checkpoint."""

    ckpt_dir: Path
    lag_policy: str
    final_step: int | None
    newest_checkpoint_step: int     # from files in the directory: what a stop step is counted from
    newest_train_step: int          # from the trainer's messages: only for the lag figure
    every_n_steps: int | None
    max_attempts: int
    subset_text: str
    run_id: str | None = None       # the run's, for a checkpoint that does not name its own (a foreign file)
    catch_up: CatchUp | None = None  # the build's backlog, not lag (evald.intake.lag_policy)


@dataclass(frozen=True)
class TurnResult:
    """What one evaluation turn did to the step the lag policy picked."""

    row: Step                   # the step's row as the turn started it
    outcome: Outcome | None     # the decisions' outcome when it was evaluated; None: failed or queued again
    best_rebuilt: bool = False  # a re-evaluation: the best step was derived again from the current results

    @property
    def evaluated(self) -> bool:
        return self.outcome is not None


def evaluate_next(ledger: Ledger, pipeline: EvaluationPipeline, decisions: Decisions, ctx: Context,
                  counters: Counters) -> TurnResult | None:
    """Evaluate (or skip) what the lag policy picks; None when there was nothing to do.

    Raises EvaluationInterrupted (the step is queued again) and SystemicFailure.
    """
    queued = ledger.steps(QUEUED)
    if not queued:
        return None
    protected = ctx.catch_up.protect([(row.step, row.commit_time) for row in queued]) if ctx.catch_up else ()
    choice = decide(ctx.lag_policy, [row.step for row in queued], final_step=ctx.final_step,
                    keep={row.step for row in queued if row.found_via == RETRY}, catch_up=protected)
    for step, reason in choice.skip:
        log.info("skipped step %d: %s", step, reason, extra={"step": step, "state": SKIPPED, "reason": reason})
    if choice.evaluate is None:
        ledger.skip(choice.skip)
        return None
    ledger.start(choice.evaluate, choice.skip)
    row = ledger.step(choice.evaluate)
    assert row is not None
    try:
        result = pipeline.evaluate(ctx.ckpt_dir, row)
    except EvaluationInterrupted as exc:
        if row.attempts >= ctx.max_attempts:  # a checkpoint whose read outlasts every shutdown is not retried forever
            _commit_failure(ledger, ctx, row, FAILED, f"interrupted on each of {row.attempts} attempts (last: "
                            f"{exc or 'a forced shutdown'}); raise tuning.max_attempts or `evald retry {row.step}`")
        else:
            ledger.requeue(row.step, "interrupted by a forced shutdown; evaluated again at the next start")
        raise
    depth = len(queued) - 1 - len(choice.skip)
    if isinstance(result, Evaluated):
        counters.unexpected_in_a_row = 0
        counters.evaluated += 1
        return _commit_evaluation(ledger, decisions, ctx, counters, row, result, depth)
    if isinstance(result, Failed):
        _commit_failure(ledger, ctx, row, result.state, result.reason, identity=result.identity)
        return TurnResult(row, None)
    _unexpected(ledger, ctx, counters, row, result)
    return TurnResult(row, None)


def _commit_evaluation(ledger: Ledger, decisions: Decisions, ctx: Context, counters: Counters, row: Step,
                       evaluated: Evaluated, queue_depth: int) -> TurnResult:
    result = evaluated.result
    now = time.time()
    counters.longest_load_s = max(counters.longest_load_s, result.load_s)
    newest = _current_step(ctx, row.step)  # the trainer's word, capped near the disk (forged steps)
    outcome = decisions.observe_eval(row.step, result.metrics, newest_step=newest,
                                     every_n_steps=ctx.every_n_steps)
    best_rebuilt = row.found_via == RETRY and bool(ledger.superseded(row.step))
    if best_rebuilt:  # a re-evaluation: the best comes from current results only (issue 18.2), committed below
        current = {r.step: r.metrics or {} for r in ledger.steps(EVALUATED)}
        current[row.step] = dict(result.metrics)
        decisions.rebuild_best(current)
    counts = ledger.counts()
    scalars = dict(result.metrics)
    scalars.update({
        "evald/load_s": result.load_s,
        "evald/evaluate_s": result.evaluate_s,
        "evald/lag_steps": float(newest - row.step),
        "evald/lag_s": max(0.0, now - (row.commit_time or now)),
        "evald/queue_depth": float(max(0, queue_depth)),
        "evald/skipped_total": float(counts.get(SKIPPED, 0)),
        "evald/failed_total": float(counts.get(FAILED, 0) + counts.get(DELETED, 0)),
        "evald/bad_messages_total": float(counters.bad_messages),
        "evald/verify_s": result.verify_s,
    })
    texts = {**result.texts, **outcome.texts(), "evald/subset": ctx.subset_text}
    kv, found = {"decisions": decisions.state_dict()}, None
    if result.provenance:
        found = provenance.complete(result.provenance, run_id=row.run_id or ctx.run_id, step=row.step,
                                    source=row.source)
        texts[provenance.TAG] = provenance.text(found)
        previous = ledger.get_state(provenance.STATE_KEY)
        in_order = not previous or previous.get("step") is None or previous["step"] < row.step
        if not in_order:  # a re-evaluation or backfill: compare with the step before it, keep the newest's
            below = [s.step for s in ledger.steps(EVALUATED) if s.step < row.step]
            previous = ledger.provenance(below[-1]) if below else None
        change = provenance.change(previous, found)
        if change:
            texts[provenance.CHANGE_TAG] = change
            log.warning("step %d is %s", row.step, change)
        if in_order:
            kv[provenance.STATE_KEY] = provenance.state(found)
    _layout_if_new(ledger, row, result.metrics, decisions.monitor, row.commit_time or now)
    record = Record("eval", row.step, row.commit_time or now, scalars, texts)
    ledger.finish(row.step, EVALUATED, metrics=result.metrics, record=record, kv=kv, provenance=found,
                  identity=evaluated.identity)
    metrics = result.metrics
    shown = " ".join(f"{k.removeprefix('eval/')}={v:.4g}"
                     + (f"±{metrics[se_tag(k)]:.2g}" if se_tag(k) in metrics else "")
                     for k, v in metrics.items() if k.startswith("eval/") and not k.endswith(SE_SUFFIX))
    log.info("step %d: %s | load %.3fs evaluate %.3fs, %.1fs after commit | lag %d steps, queue %d, "
             "skipped %d, failed %d | %s", row.step, shown, result.load_s, result.evaluate_s,
             scalars["evald/lag_s"], scalars["evald/lag_steps"], queue_depth, scalars["evald/skipped_total"],
             scalars["evald/failed_total"], texts["evald/decision"],
             extra={"step": row.step, "key": row.source, "state": EVALUATED, "metrics": dict(result.metrics),
                    "load_s": result.load_s, "evaluate_s": result.evaluate_s, "lag_s": scalars["evald/lag_s"],
                    "lag_steps": int(scalars["evald/lag_steps"]), "queue_depth": queue_depth})
    if outcome.stop_at_step is not None:
        log.warning("early stop: %s -> training stops at step %d", outcome.reason, outcome.stop_at_step)
    if outcome.advisory_stop_at is not None:
        log.warning("advisory early stop (not enforced, training continues): %s -> training would stop at step %d",
                    outcome.reason, outcome.advisory_stop_at)
    if outcome.advice:
        log.warning("learning-rate advice at step %d: %s", row.step, outcome.advice["reason"])
    return TurnResult(row, outcome, best_rebuilt)


def _layout_if_new(ledger: Ledger, row: Step, metrics: dict, monitor: str, wall_time: float) -> None:
    """TensorBoard's Custom Scalars layout, through the outbox, when this evaluation changes what it
    covers (the first one; a new metric; another monitor): at this step, so one point per step."""
    state = ledger.get_state(tensorboard_layout.LAYOUT_STATE)
    cover = tensorboard_layout.covered(state, metrics, monitor)
    if cover != state:
        text = tensorboard_layout.layout_text(cover)
        ledger.add_records([Record(tensorboard_layout.LAYOUT_STREAM, row.step, wall_time, {},
                                   {tensorboard_layout.LAYOUT_TAG: text})],
                           kv={tensorboard_layout.LAYOUT_STATE: cover})


def _current_step(ctx: Context, step: int) -> int:
    """Where training is now, for the stop step: the trainer's word, but never more than two
    snapshot intervals beyond the newest checkpoint on disk (a forged step cannot push the stop
    out of reach; a trainer already past the stop step stops at its next step anyway)."""
    on_disk = max(ctx.newest_checkpoint_step, step)
    reach = 2 * (ctx.every_n_steps or 1)
    return min(max(ctx.newest_train_step, on_disk), on_disk + reach)


def _commit_failure(ledger: Ledger, ctx: Context, row: Step, state: str, reason: str,
                    identity: str | None = None) -> None:
    now, newest = time.time(), _current_step(ctx, row.step)
    ledger.finish(row.step, state, reason=reason, identity=identity, record=Record(
        "eval", row.step, now, lag_scalars(row.step, newest, row.commit_time, now),
        {SKIP_TAG: skip_text_for(state, row.source, reason)}))
    log.error("step %d (%s) not evaluated (%s): %s", row.step, row.source, state, reason,
              extra={"step": row.step, "key": row.source, "state": state, "reason": reason})


def _unexpected(ledger: Ledger, ctx: Context, counters: Counters, row: Step, retry: Retry) -> None:
    counters.unexpected_in_a_row += 1
    if row.attempts >= ctx.max_attempts and counters.evaluated > 0:
        # Other checkpoints evaluate fine: this one is the problem.
        _commit_failure(ledger, ctx, row, FAILED, f"{retry.reason} on each of {row.attempts} attempts")
        return
    ledger.requeue(row.step, f"attempt {row.attempts} raised unexpectedly: {retry.reason}")
    log.error("step %d: attempt %d raised unexpectedly (%s); it stays queued and will be tried again. "
              "This is not a verdict on the checkpoint: if it repeats, it is a bug or a set-up problem",
              row.step, row.attempts, retry.reason)
    if counters.unexpected_in_a_row >= ctx.max_attempts:
        raise SystemicFailure(f"{counters.unexpected_in_a_row} evaluations in a row raised unexpectedly (last: "
                              f"{retry.reason}); every checkpoint stays queued. Fix the cause (see the traceback "
                              f"above) and start evald again")
    return None
