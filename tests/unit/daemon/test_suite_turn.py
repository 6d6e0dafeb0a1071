"""Which suite cells are due, backfill requests, and a tokenizer that changes within a run."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from evald.daemon import suite_turn
from evald.ledger.ledger import EVALUATED, QUEUED, Ledger, Record


@pytest.fixture
def ledger(tmp_path):
    ledger = Ledger(tmp_path / "ledger.sqlite")
    yield ledger
    ledger.close()


def _pipeline(tokenizer="t" * 64, every_k=1, names=("fast",)):
    suites = {n: SimpleNamespace(options=SimpleNamespace(every_k=every_k), cell_identity=f"{n}-id".ljust(64, "0"),
                                 identity={"tokenizer": tokenizer}) for n in names}
    pipeline = SimpleNamespace(suites=suites, suite_errors={}, suites_pending=(), validation_identity="v" * 64)

    def refuse_suite(name, reason):   # as the pipeline's SuiteHost refuses one (evald.pipeline.seam.SuiteHosting)
        suites.pop(name, None)
        pipeline.suite_errors[name] = reason

    pipeline.refuse_suite = refuse_suite
    return pipeline


def _evaluate(ledger, step):
    ledger.admit(name=f"step_{step:09d}", step=step, kind="evald", found_via="rescan", run_id="r", commit_time=1.0)
    ledger.start(step)
    ledger.finish(step, EVALUATED, metrics={"eval/loss": 1.0}, identity="v" * 64,
                  record=Record("eval", step, 1.0, {"eval/loss": 1.0}, {}))


def test_every_k_selects_the_first_then_every_kth_evaluated_step(ledger):
    pipeline = _pipeline(every_k=2)
    suite_turn.on_built(ledger, pipeline)
    for step in (10, 20, 30, 40, 50):
        _evaluate(ledger, step)
    assert suite_turn.queue_due(ledger, pipeline) == [("fast", 10), ("fast", 30), ("fast", 50)]
    assert suite_turn.queue_due(ledger, pipeline) == []   # never twice


def test_a_suite_added_later_covers_new_steps_and_backfill_the_old_ones(ledger, tmp_path):
    for step in (10, 20):
        _evaluate(ledger, step)
    pipeline = _pipeline()
    suite_turn.on_built(ledger, pipeline)          # added to a run with evaluated steps
    assert suite_turn.queue_due(ledger, pipeline) == []
    _evaluate(ledger, 30)
    assert suite_turn.queue_due(ledger, pipeline) == [("fast", 30)]
    ckpt = tmp_path / "ckpt"
    for step in (10, 20):                          # retained on disk; 30's file is gone
        (ckpt / f"step_{step:09d}").mkdir(parents=True)
    steps = suite_turn.backfill_steps(ledger, ckpt, None, None)
    assert steps == [10, 20]
    ledger.put_state(suite_turn.BACKFILL_KEY, [{"suite": "fast", "steps": steps}])
    assert suite_turn.take_backfill_requests(ledger, pipeline) == 2
    assert sorted(c.step for c in ledger.cells(QUEUED)) == [10, 20, 30]
    ledger.put_state(suite_turn.BACKFILL_KEY, [{"suite": "fast", "steps": steps}])
    assert suite_turn.take_backfill_requests(ledger, pipeline) == 0   # no cell twice
    assert suite_turn.backfill_steps(ledger, ckpt, (15, 25), None) == [20]
    assert suite_turn.backfill_steps(ledger, ckpt, None, 2) == [10]


def test_a_tokenizer_that_changes_within_a_run_is_an_error_named_as_such(ledger):
    suite_turn.on_built(ledger, _pipeline(tokenizer="a" * 64))
    changed = _pipeline(tokenizer="b" * 64)
    suite_turn.on_built(ledger, changed)
    assert changed.suites == {}
    assert "tokenizer changed between checkpoints of this run" in changed.suite_errors["fast"]


def test_the_queued_cells_of_a_suite_that_cannot_be_built_say_why(ledger, tmp_path, caplog):
    """Issue 35: a suite whose build fails (a document with nothing to score) left its queued cells queued,
    with no reason anywhere but one log line. Now each says why, in the ledger and `evald status`, once."""
    from evald.cli.status import gather, render

    built = _pipeline()
    suite_turn.on_built(ledger, built)
    for step in (10, 20):
        _evaluate(ledger, step)
    assert suite_turn.queue_due(ledger, built) == [("fast", 10), ("fast", 20)]
    why = "cannot build suite fast: task t, document 9 (of its 12): the continuation '' gives no token"
    broken = SimpleNamespace(suites={}, suite_errors={"fast": why}, suites_pending=(), validation_identity="v" * 64)
    with caplog.at_level("ERROR", logger="evald"):
        assert suite_turn.note_unbuildable(ledger, broken) == 2
        assert suite_turn.note_unbuildable(ledger, broken) == 0      # said once
    cells = ledger.cells(QUEUED, suite="fast")
    assert [c.step for c in cells] == [10, 20] and all(c.reason == f"waiting: {why}" for c in cells)
    assert sum("2 queued cell(s) (steps 10, 20) wait until it is fixed" in r.getMessage() for r in caplog.records) == 1
    shown = render(gather(tmp_path))   # evald status of this run directory (its ledger.sqlite)
    assert f"suite        fast: queued 2 (waiting: {why})" in shown, shown


def test_through_the_loop_a_suite_build_that_fails_leaves_its_queued_cells_saying_why(tmp_path, private_umask):
    """Issue 35, through evald's own loop: cells an earlier run queued for suite mc; this run's build of mc
    fails (a document with nothing to score); the loop goes on, and the cells say why."""
    from evald.daemon.server import Server
    from evald.ledger.ledger import Ledger as RunLedger
    from tests.faults import ledger_path
    from tests.unit.daemon.rig import MeanWeightPipeline, config, stage

    why = "cannot build suite mc: task t, document 9 (of its 12): the continuation '' gives no token to score"

    class FailingSuite(MeanWeightPipeline):
        def __init__(self) -> None:
            super().__init__()
            self.suites_pending = ("mc",)

        def build_next_suite(self) -> bool:
            if not self.suites_pending:
                return False
            self.suite_errors["mc"], self.suites_pending = why, ()
            return True

    ckpt = stage(tmp_path / "ckpt", 10, 20)

    def run(pipeline, turns: int) -> None:
        server = Server(config(tmp_path, None, ckpt_dir=str(ckpt), logdir=None, idle_exit_s=None), pipeline=pipeline)
        try:
            server.startup()
            for _ in range(turns):
                server.on_tick()
        finally:
            server.shutdown()

    run(MeanWeightPipeline(), 50)                      # the earlier run: both steps validated
    ledger = RunLedger(ledger_path(ckpt))
    try:
        assert sorted(row.step for row in ledger.steps(EVALUATED)) == [10, 20]
        ledger.queue_cells("mc", "m" * 64, [10, 20])   # ... and mc's cells left queued
    finally:
        ledger.close()
    pipeline = FailingSuite()
    run(pipeline, 20)                                  # this run: mc cannot be built
    ledger = RunLedger(ledger_path(ckpt))
    try:
        cells = ledger.cells(suite="mc")
    finally:
        ledger.close()
    assert pipeline.suite_errors == {"mc": why} and [c.state for c in cells] == [QUEUED, QUEUED]
    assert all(c.reason == f"waiting: {why}" for c in cells), cells
