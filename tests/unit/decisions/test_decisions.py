"""Decisions in-process: one pure object, its outcome and reasons, and the state that survives a restart."""

from __future__ import annotations

import dataclasses
import json

from evald.config import EvaldConfig
from evald.decisions.decisions import MAX_STEP, Decisions


def decisions(**options) -> Decisions:
    made = Decisions(dataclasses.replace(EvaldConfig(), **options))
    made.begin_run("r")
    return made


def test_a_stop_is_decided_once_with_its_step_and_reason():
    d = decisions(patience=1, stop_margin_steps=7)
    first = d.observe_eval(10, {"eval/loss": 2.0}, newest_step=10, every_n_steps=10)
    assert first.improved and first.stop_at_step is None and d.best_step == 10
    stop = d.observe_eval(20, {"eval/loss": 2.5}, newest_step=34, every_n_steps=10)
    assert stop.stop_at_step == 34 + 7 and "patience 1 exhausted" in stop.reason
    assert stop.texts()["evald/decision"].startswith("STOP: ")
    again = d.observe_eval(30, {"eval/loss": 2.6}, newest_step=40, every_n_steps=10)
    assert again.stop_at_step is None and d.stop_at_step == 41  # decided once, kept
    state = d.control_state()
    assert (state.run_id, state.stop_at_step, state.seq) == ("r", 41, 1)


def test_the_margin_defaults_to_the_trainers_interval_and_the_stop_step_is_capped():
    d = decisions(stopping_threshold=5.0)
    assert d.observe_eval(10, {"eval/loss": 1.0}, newest_step=12, every_n_steps=50).stop_at_step == 62
    d = decisions(stopping_threshold=5.0)
    assert d.observe_eval(10, {"eval/loss": 1.0}, newest_step=MAX_STEP, every_n_steps=50).stop_at_step == MAX_STEP


def test_a_missing_monitor_says_which_metrics_there_are():
    outcome = decisions(monitor="eval/accuracy").observe_eval(10, {"eval/loss": 1.0}, newest_step=10,
                                                               every_n_steps=None)
    assert "'eval/accuracy' is not among the metrics ['eval/loss']" in outcome.reason


def test_alerts_and_advice_are_part_of_the_outcome_and_train_alerts_come_back():
    d = decisions()
    [(tag, message)] = d.observe_train(1, {"loss": float("nan")}).items()
    assert tag == "health/nonfinite_loss" and message.startswith("step 1: nonfinite_loss: train loss is nan")
    outcomes = {}
    for step, loss in ((10, 2.0), (20, 2.1), (30, 2.2), (40, 2.3)):
        d.observe_train(step - 1, {"loss": 5.0 - step / 10})  # the train loss keeps falling
        outcomes[step] = d.observe_eval(step, {"eval/loss": loss}, newest_step=step, every_n_steps=10)
    # eval got worse three times in a row while train fell: the overfitting alert and advice, at 40
    assert [s for s, o in outcomes.items() if "health/overfitting" in o.alerts] == [40]
    assert [s for s, o in outcomes.items() if o.advice] == [40]
    assert outcomes[40].advice["kind"] == "overfitting" and outcomes[40].advice["scale"] == 0.5
    texts = outcomes[40].texts()
    assert "health/overfitting" in texts and texts["evald/lr_advice"].startswith("overfitting (scale 0.5)")
    assert d.control_state().lr_advice["id"] == 1


def test_state_survives_a_restart_and_a_new_run_clears_the_old_runs_stop():
    d = decisions(patience=1)
    d.observe_eval(10, {"eval/loss": 2.0}, newest_step=10, every_n_steps=10)
    d.observe_eval(20, {"eval/loss": 2.5}, newest_step=20, every_n_steps=10)
    saved = json.loads(json.dumps(d.state_dict()))
    restored = Decisions(dataclasses.replace(EvaldConfig(), patience=1))
    restored.load_state_dict(saved)
    def sticky(state):
        return {k: v for k, v in state.to_dict().items() if k != "sent_at"}

    assert restored.state_dict() == d.state_dict() and sticky(restored.control_state()) == sticky(d.control_state())
    restored.begin_run("r2")  # the trainer started a new run in the same directory
    assert restored.stop_at_step is None and restored.control_state().run_id == "r2"
    assert restored.control_state().seq == d.seq + 1 and restored.best_step == 10  # the policy's memory stays


def test_a_re_evaluated_older_step_gives_no_learning_rate_advice():
    """Issue 26 item 9: re-evaluating older steps (evald retry --step, backfill) fed the LR advisor as if
    they came after the newest one: three of them read as "both stalled" and a plateau advice followed."""
    from evald.config import EvaldConfig
    from evald.decisions.decisions import Decisions

    decisions = Decisions(EvaldConfig())
    for step, loss in ((100, 3.0), (200, 2.8), (300, 2.6), (400, 2.5)):
        decisions.observe_eval(step, {"eval/loss": loss}, newest_step=step, every_n_steps=100)
    decisions.rebuild_best({100: {"eval/loss": 3.0}, 200: {"eval/loss": 2.8}, 300: {"eval/loss": 2.6},
                            400: {"eval/loss": 2.5}})
    for step, loss in ((100, 3.0), (200, 2.8), (300, 2.6)):   # evaluated again, out of order
        outcome = decisions.observe_eval(step, {"eval/loss": loss}, newest_step=400, every_n_steps=100)
        assert outcome.advice is None and decisions.lr_advice is None
