"""Issue 18, item 5: a stop decided after the run had ended is advisory, and said so.

A MindFormers run of 40 steps ended before evald's decision (stop at step 43) was made: summary.json
said both "completed" and "stopped_early: true", and `evald status` said "stop at step 43".
The real ledger, decisions and summary writer, in-process.
"""

from __future__ import annotations

import dataclasses
import json

from evald.cli.status import gather, render
from evald.config import EvaldConfig
from evald.contracts.wire import RunFinished
from evald.decisions.decisions import Decisions
from evald.ledger.ledger import Ledger
from evald.sinks.summary import write_run_summary


def _decided_stop() -> Decisions:
    """Patience 1: the evaluation of step 40 is worse than step 10's, so evald decides to stop (after 40)."""
    decisions = Decisions(dataclasses.replace(EvaldConfig(), patience=1))
    decisions.run_id = "r"
    for at, loss in ((10, 1.0), (40, 2.0)):
        decisions.observe_eval(at, {"eval/loss": loss}, newest_step=at, every_n_steps=None)
    assert decisions.stop_at_step is not None and decisions.stop_at_step > 40
    return decisions


def _summarise(tmp_path, decisions: Decisions, end: RunFinished) -> dict:
    ledger = Ledger(tmp_path / "ledger.sqlite")
    try:
        write_run_summary(ledger, decisions, tmp_path, "r", end, "eval/loss")
        ledger.put_state("decisions", decisions.state_dict())
    finally:
        ledger.close()
    return json.loads((tmp_path / "summary.json").read_text())


def test_a_stop_decided_after_a_completed_run_is_advisory_in_the_summary_and_status(tmp_path):
    decisions = _decided_stop()
    stop = decisions.stop_at_step
    summary = _summarise(tmp_path, decisions, RunFinished(run_id="r", ckpt_dir="/c", final_step=40))
    assert summary["training_end_reason"] == "completed"
    assert summary["stopped_early"] is False
    assert summary["advisory_stop"]["stop_at_step"] == stop and "after the run ended" in summary["advisory_stop"]["note"]
    text = render(gather(tmp_path))
    assert f"at step {stop}:" not in text
    assert "decided after the run ended at step 40" in text


def test_a_stop_the_trainer_obeyed_is_still_a_stop(tmp_path):
    decisions = _decided_stop()
    summary = _summarise(tmp_path, decisions, RunFinished(run_id="r", ckpt_dir="/c", final_step=decisions.stop_at_step,
                                                          reason="early stop: patience"))
    assert summary["stopped_early"] is True and summary["advisory_stop"] is None
