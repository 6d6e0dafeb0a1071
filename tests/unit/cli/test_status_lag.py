"""Issue 18 item 16: ``evald status`` reports no lag when nothing waits.

After an incomplete step (newer than every evaluated one) was skipped, status said "lag 6
steps (newest 18, newest evaluated 12)" though nothing was waiting. Lag counts what waits.
A real ledger, read by the status command's own read-only reader."""

from __future__ import annotations

from evald.cli.status import gather, render
from evald.ledger.ledger import EVALUATED, FAILED, Ledger, Record
from evald.daemon.run_dir import LEDGER_FILE


def _ledger(tmp_path) -> Ledger:
    return Ledger(tmp_path / LEDGER_FILE)


def _evaluate(ledger: Ledger, step: int) -> None:
    ledger.admit(name=f"step_{step:09d}", step=step, kind="evald", found_via="watchdog", run_id="r", commit_time=1.0)
    ledger.start(step)
    ledger.finish(step, EVALUATED, metrics={"eval/loss": 1.0},
                  record=Record("eval", step, 1.0, {"eval/loss": 1.0}, {}))


def test_no_lag_when_the_newer_step_was_skipped_and_nothing_waits(tmp_path):
    ledger = _ledger(tmp_path)
    for step in (6, 12):
        _evaluate(ledger, step)
    ledger.admit(name="step_000000018-part-0-of-2", step=18, kind="parts", found_via="rescan", run_id="r",
                 commit_time=1.0, skip_reason="incomplete: 1 of its 2 parts were committed")
    ledger.close()
    info = gather(tmp_path)
    assert info["lag"]["steps"] == 0, info["lag"]
    assert "lag          0 steps" in render(info)


def test_the_lag_is_still_shown_while_a_newer_step_waits(tmp_path):
    ledger = _ledger(tmp_path)
    _evaluate(ledger, 12)
    ledger.admit(name="step_000000018", step=18, kind="evald", found_via="zmq", run_id="r", commit_time=1.0)
    ledger.admit(name="step_000000024", step=24, kind="evald", found_via="zmq", run_id="r", commit_time=1.0)
    ledger.start(24)
    ledger.finish(24, FAILED, reason="corrupt", record=Record("eval", 24, 1.0, {}, {"evald/skipped": "x"}))
    ledger.close()
    assert gather(tmp_path)["lag"]["steps"] == 6  # step 18 waits; the failed 24 is not lag
