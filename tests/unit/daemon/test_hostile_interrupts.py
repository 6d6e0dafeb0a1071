"""Issue 19, kind 1: a step whose read (or evaluation) is interrupted counts an attempt each time and
is failed with its reason after tuning.max_attempts, instead of being picked again forever; a read
stopped by a signal is an interruption, never a verdict on the checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest

from evald.contracts import safetensors_io as sio
from evald.daemon import turn
from evald.ledger.ledger import FAILED, QUEUED, Ledger
from evald.pipeline.pipeline import Pipeline
from evald.pipeline.tasks.base import EvaluationInterrupted


class _Interrupted:
    """A pipeline whose every evaluation is interrupted by a signal during the read."""

    def evaluate(self, ckpt_dir, row):
        raise EvaluationInterrupted("a signal came while step 5 was read")


def _context(tmp_path: Path, max_attempts: int) -> turn.Context:
    return turn.Context(ckpt_dir=tmp_path, lag_policy="all", final_step=None, newest_checkpoint_step=5,
                        newest_train_step=5, every_n_steps=None, max_attempts=max_attempts, subset_text="")


def test_an_interrupted_step_fails_with_its_reason_after_max_attempts(tmp_path):
    ledger = Ledger(tmp_path / "ledger.sqlite")
    ledger.admit(name="step_000000005", step=5, kind="evald", found_via="rescan", run_id="r",
                 commit_time=1.0, skip_reason=None)
    ctx = _context(tmp_path, max_attempts=3)
    for attempt in range(1, 4):
        with pytest.raises(EvaluationInterrupted):
            turn.evaluate_next(ledger, _Interrupted(), None, ctx, turn.Counters())
        row = ledger.step(5)
        assert row.attempts == attempt
        assert row.state == (QUEUED if attempt < 3 else FAILED), (attempt, row)
    assert "interrupted" in row.reason and "3 attempts" in row.reason
    assert turn.evaluate_next(ledger, _Interrupted(), None, ctx, turn.Counters()) is None  # never picked again
    ledger.close()


def test_a_read_stopped_by_a_signal_interrupts_the_evaluation_instead_of_failing_the_checkpoint():
    class Stopped:
        def evaluate(self, path, kind, should_abort):
            raise sio.ReadInterrupted(f"{path}: read stopped: evald was told to stop")

    class Row:
        step, source, kind = 7, "step_000000007", "evald"

    pipeline = Pipeline(should_abort=lambda: False)
    pipeline.evaluator = Stopped()
    with pytest.raises(EvaluationInterrupted):
        pipeline.evaluate(Path("/nonexistent"), Row())


class _Killed(BaseException):
    """Stands in for SIGKILL: nothing after it runs (no handler, no ledger write)."""


def test_a_step_being_read_when_evald_is_killed_counts_an_attempt_and_fails_after_max_attempts(tmp_path):
    path = tmp_path / "ledger.sqlite"
    ledger = Ledger(path)
    ledger.admit(name="step_000000005", step=5, kind="evald", found_via="rescan", run_id="r",
                 commit_time=1.0, skip_reason=None)
    ledger.close()
    seen = []

    class KilledWhileReading:
        def evaluate(self, ckpt_dir, row):
            seen.append(ledger.step(5))   # what the ledger holds while the weights are read
            raise _Killed()

    for kill in range(1, 4):              # each turn is one evald process, killed during the read
        ledger = Ledger(path)
        ledger.recover_interrupted(max_attempts=3)
        with pytest.raises(_Killed):
            turn.evaluate_next(ledger, KilledWhileReading(), None, _context(tmp_path, 3), turn.Counters())
        ledger._db.close()                # no clean shutdown
        assert seen[-1].state == "evaluating" and seen[-1].attempts == kill  # counted before the read
    ledger = Ledger(path)
    ledger.recover_interrupted(max_attempts=3)
    assert ledger.step(5).state == FAILED and "interrupted 3 times" in ledger.step(5).reason
    ledger.close()
