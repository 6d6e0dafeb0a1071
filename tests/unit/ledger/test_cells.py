"""The ledger keys results on (step, evaluation identity): the validation and each suite are cells.

Issue 18 items 2 and 3: a fixed configuration evaluates again (the old result kept, marked
superseded), ``retry`` re-evaluates an evaluated step on request, and a step shows exactly one
current result.
"""

from __future__ import annotations

import pytest

from evald.ledger.ledger import EVALUATED, EVALUATING, FAILED, QUEUED, Ledger, Record
from evald.ledger.requeue import retry

ID_A, ID_B = "a" * 64, "b" * 64


@pytest.fixture
def ledger(tmp_path):
    ledger = Ledger(tmp_path / "ledger.sqlite")
    yield ledger
    ledger.close()


def _evaluated(ledger, step, identity, loss=1.0):
    ledger.admit(name=f"step_{step:09d}", step=step, kind="evald", found_via="rescan", run_id="r",
                 commit_time=1.0)
    ledger.start(step)
    ledger.finish(step, EVALUATED, metrics={"eval/loss": loss}, identity=identity,
                  record=Record("eval", step, 1.0, {"eval/loss": loss}, {}))


def test_a_new_validation_identity_requeues_evaluated_and_failed_steps_and_keeps_the_old_results(ledger):
    _evaluated(ledger, 10, ID_A, loss=3.378)
    ledger.admit(name="step_000000020", step=20, kind="evald", found_via="rescan", run_id="r", commit_time=1.0)
    ledger.start(20)
    ledger.finish(20, FAILED, reason="missing parameters (9)", identity=ID_A)
    assert ledger.supersede_validation(ID_A) == []      # same identity: nothing to do
    assert ledger.supersede_validation(ID_B) == [10, 20]
    assert [(s.step, s.state, s.metrics) for s in ledger.steps()] == [(10, QUEUED, None), (20, QUEUED, None)]
    old = ledger.superseded(10)
    assert [(c.evaluation, c.identity, c.state, c.metrics, c.superseded_by) for c in old] == [
        ("validation", ID_A, EVALUATED, {"eval/loss": 3.378}, ID_B)]
    assert ledger.superseded(20)[0].reason == "missing parameters (9)"
    # the step's TensorBoard text says its old result is superseded
    marks = [r for r in ledger.pending_records() if "evald/superseded" in r.texts]
    assert sorted(r.step for r in marks) == [10, 20]
    ledger.start(10)
    ledger.finish(10, EVALUATED, metrics={"eval/loss": 3.339}, identity=ID_B)
    assert ledger.step(10).metrics == {"eval/loss": 3.339}   # exactly one current result
    assert ledger.supersede_validation(ID_B) == []


def test_an_earlier_runs_steps_are_not_re_evaluated_with_this_runs_configuration(ledger):
    _evaluated(ledger, 10, ID_A)                   # run "r"
    assert ledger.supersede_validation(ID_B, run_id="another run") == []
    assert ledger.supersede_validation(ID_B, run_id="r") == [10]


def test_retry_re_evaluates_an_evaluated_step_on_request(ledger):
    _evaluated(ledger, 10, ID_A)
    done = retry(ledger, [10], "re-queued by evald retry", evaluated_too=True)
    assert done.requeued == (10,) and not done.not_failed
    assert ledger.step(10).state == QUEUED and ledger.step(10).found_via == "retry"
    assert ledger.superseded(10)[0].superseded_by == "retry"


def test_each_suite_cell_exactly_once_and_a_new_suite_identity_supersedes(ledger):
    _evaluated(ledger, 10, ID_A)
    _evaluated(ledger, 20, ID_A)
    assert ledger.queue_cells("fast", ID_A, [10, 20]) == [10, 20]
    assert ledger.queue_cells("fast", ID_A, [10, 20]) == []          # never twice
    assert [c.step for c in ledger.cells(QUEUED)] == [10, 20]
    ledger.start_cell(20, "fast", ID_A)
    assert ledger.cell(20, "fast").state == EVALUATING and ledger.cell(20, "fast").attempts == 1
    ledger.finish_cell(20, "fast", ID_A, EVALUATED, metrics={"fast/t/acc": 0.5},
                       record=Record("eval", 20, 1.0, {"fast/t/acc": 0.5}, {}))
    assert ledger.cell(20, "fast").metrics == {"fast/t/acc": 0.5}
    # a crash while evaluating: the cell goes back to the queue at start
    ledger.start_cell(10, "fast", ID_A)
    ledger.recover_interrupted(max_attempts=3)
    assert ledger.cell(10, "fast").state == QUEUED
    # the suite changed: new cells for the steps it had, the old ones superseded and still readable
    assert ledger.supersede_suite("fast", ID_B) == [10, 20]
    assert ledger.cell(20, "fast").identity == ID_B and ledger.cell(20, "fast").state == QUEUED
    old = [c for c in ledger.superseded(20) if c.evaluation == "suite:fast"]
    assert [(c.identity, c.metrics, c.superseded_by) for c in old] == [(ID_A, {"fast/t/acc": 0.5}, ID_B)]
    assert ledger.cell_counts() == {"fast": {QUEUED: 2}}
