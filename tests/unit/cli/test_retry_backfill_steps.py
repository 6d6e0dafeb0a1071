"""Every retained checkpoint can be evaluated later (issue 26, items 2 and 3): a step the lag policy
skipped is re-queued by ``evald retry --step N`` and by ``evald backfill`` (validation included), a
backfill right after a retry includes the retried step, and a step the run does not have is an error
naming the steps it has. Real files and a real ledger; the commands run in-process."""

from __future__ import annotations

import pytest

from evald.cli.main import main
from evald.contracts import layout
from evald.daemon import suite_turn
from evald.ledger.ledger import EVALUATED, QUEUED, SKIPPED, Ledger, Record
from evald.ledger.requeue import RETRY
from tests.unit.cli.conftest import admit_steps


@pytest.fixture
def run(tmp_path, new_run):
    """A run with the default lag policy's outcome: 25, 50, 75 skipped, 100 evaluated; all four retained."""
    served = new_run(tmp_path / "ckpt")
    ledger = Ledger(served.ledger)
    admit_steps(ledger, served.ckpt_dir, (25, 50, 75, 100))
    ledger.start(100, [(s, "superseded by step 100 (lag policy latest)") for s in (25, 50, 75)])
    ledger.finish(100, EVALUATED, metrics={"eval/loss": 1.0}, identity="v" * 64,
                  record=Record("eval", 100, 1.0, {"eval/loss": 1.0}, {}))
    ledger.close()
    return served


def _rows(run) -> dict[int, tuple[str, str]]:
    ledger = Ledger(run.ledger)
    try:
        return {row.step: (row.state, row.found_via) for row in ledger.steps()}
    finally:
        ledger.close()


def test_retry_step_requeues_a_step_the_lag_policy_skipped(run, capsys):
    assert _rows(run)[25][0] == SKIPPED
    assert main(["retry", "--ckpt-dir", str(run.ckpt_dir), "--step", "25"]) == 0
    out = capsys.readouterr().out
    assert "re-queued 1 step(s): 25" in out and "not failed" not in out
    assert _rows(run)[25] == (QUEUED, RETRY)     # the lag policy keeps what retry queued
    assert _rows(run)[50][0] == SKIPPED


def test_retry_of_a_step_the_run_does_not_have_is_an_error_naming_its_steps(run, capsys):
    before = _rows(run)
    for argv in (["--step", "999"], ["999"], ["--step", "25", "--step", "999"]):
        assert main(["retry", "--ckpt-dir", str(run.ckpt_dir), *argv]) == 2
        err = capsys.readouterr().err
        assert "999" in err and "25, 50, 75, 100" in err
    assert _rows(run) == before   # nothing changed, not even the steps that exist


def test_backfill_right_after_retry_includes_the_retried_step(run, capsys):
    assert main(["retry", "--ckpt-dir", str(run.ckpt_dir), "--step", "100"]) == 0
    capsys.readouterr()
    assert main(["backfill", "--ckpt-dir", str(run.ckpt_dir), "--suite", "mine"]) == 0
    out = capsys.readouterr().out
    assert "100" in out.split("checkpoint(s):")[1]
    ledger = Ledger(run.ledger)
    try:
        [request] = ledger.get_state(suite_turn.BACKFILL_KEY)
    finally:
        ledger.close()
    assert 100 in request["steps"]


def test_backfill_covers_the_skipped_retained_steps_validation_included(run, capsys):
    (run.ckpt_dir / layout.step_dir_name(50)).rmdir()          # 50's file is gone: left out, with the reason
    assert main(["backfill", "--ckpt-dir", str(run.ckpt_dir), "--suite", "mine"]) == 0
    out = capsys.readouterr().out
    assert "25, 75, 100" in out and "50" in out and "no longer" in out
    rows = _rows(run)
    assert rows[25] == (QUEUED, RETRY) and rows[75] == (QUEUED, RETRY)   # their validation first
    assert rows[50][0] == SKIPPED and rows[100][0] == EVALUATED
    ledger = Ledger(run.ledger)
    try:
        [request] = ledger.get_state(suite_turn.BACKFILL_KEY)
    finally:
        ledger.close()
    assert request == {"suite": "mine", "steps": [25, 75, 100]}


def test_backfill_without_a_suite_queues_the_validation_of_skipped_steps(run, capsys):
    assert main(["backfill", "--ckpt-dir", str(run.ckpt_dir), "--steps", "20:60"]) == 0
    out = capsys.readouterr().out
    assert "validation" in out and "25, 50" in out
    rows = _rows(run)
    assert rows[25] == (QUEUED, RETRY) and rows[50] == (QUEUED, RETRY) and rows[75][0] == SKIPPED
    ledger = Ledger(run.ledger)
    try:
        assert not ledger.get_state(suite_turn.BACKFILL_KEY)
    finally:
        ledger.close()


def test_a_partitioned_step_is_covered_by_a_backfill_while_all_its_parts_are_there(tmp_path):
    """Its ledger source is a glob of its parts' names: read as one path, it was always 'no longer in' the
    directory, so no partitioned run could be backfilled (nor served unless the network held the step)."""
    from evald.contracts.partition import group_name, part_dir_name

    ckpt = tmp_path / "ckpt"
    ledger = Ledger(tmp_path / "ledger.sqlite")
    for step in (10, 20):
        for index in (0, 1):
            (ckpt / part_dir_name(step, index, 2)).mkdir(parents=True)
        ledger.admit(name=group_name(step, 2), step=step, kind="parts", found_via="rescan", run_id="r",
                     commit_time=1.0)
        ledger.finish(step, EVALUATED, metrics={"eval/loss": 1.0}, identity="v" * 64,
                      record=Record("eval", step, 1.0, {"eval/loss": 1.0}, {}))
    (ckpt / part_dir_name(20, 1, 2)).rmdir()
    plan = suite_turn.plan_backfill(ledger, ckpt, None, None)
    assert plan.steps == (10,) and [step for step, _ in plan.left_out] == [20], plan
    ledger.close()
