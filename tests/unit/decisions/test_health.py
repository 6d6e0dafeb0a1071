"""Health rules on synthetic traces: fire once per episode, re-fire after clearing, quiet when healthy."""

import json
import logging
import math

import pytest

from evald.config import ConfigError
from evald.config.options import EvaldConfig
from evald.config.schema import build_table
from evald.decisions.health import RULES, Alert
from evald.decisions.health import HealthMonitor as _Rules
from evald.config.health_thresholds import HealthThresholds
from evald.decisions.trend import TrainLossTrend


class HealthMonitor:
    """The rules driven as evald drives them: the train-loss trend from evald.decisions.trend between evaluations."""

    def __init__(self, thresholds=None, eval_mode="min"):
        self.rules = _Rules(thresholds, eval_mode=eval_mode)
        self.trend = TrainLossTrend()

    def observe_train(self, step, scalars):
        if scalars.get("loss") is not None:
            self.trend.add(scalars["loss"])
        return self.rules.observe_train(step, scalars)

    def observe_eval(self, step, value, train_loss_trend=None):
        derived = self.trend.take()
        return self.rules.observe_eval(step, value, derived if train_loss_trend is None else train_loss_trend)

    @property
    def active_rules(self):
        return self.rules.active_rules

    def state_dict(self):
        return {"rules": self.rules.state_dict(), "trend": self.trend.state_dict()}

    def load_state_dict(self, state):
        self.rules.load_state_dict(state["rules"])
        self.trend.load_state_dict(state["trend"])


def _rules(alerts):
    return [a.rule for a in alerts]


def _healthy_run(monitor, steps=600, eval_every=50):
    """Loss decaying smoothly, grad norm ~1, loss scale doubling; eval loss improving."""
    alerts = []
    for step in range(1, steps + 1):
        scalars = {
            "loss": 1.0 + 3.0 * math.exp(-step / 200) + 0.01 * math.sin(step),
            "grad_norm": 1.0 + 0.2 * math.sin(step / 7),
            "loss_scale": 2.0 ** (12 + step // 100),
        }
        alerts += monitor.observe_train(step, scalars)
        if step % eval_every == 0:
            alerts += monitor.observe_eval(step, 1.2 + 3.0 * math.exp(-step / 250))
    return alerts


def test_healthy_trace_is_quiet(caplog):
    with caplog.at_level(logging.WARNING, logger="evald.decisions.health"):
        assert _healthy_run(HealthMonitor()) == []
    assert caplog.records == []


def test_healthy_trace_quiet_with_max_mode_metric():
    monitor = HealthMonitor(eval_mode="max")
    alerts = []
    for step in range(1, 301):
        alerts += monitor.observe_train(step, {"loss": 3.0 - step / 200, "grad_norm": 1.0})
        if step % 30 == 0:
            alerts += monitor.observe_eval(step, 0.5 + step / 1000)  # accuracy rising
    assert alerts == []


def test_grad_explosion_fires_once_per_episode(caplog):
    m = HealthMonitor()
    trace = [1.0, 2e5, 3e5, 5e5, 1.0, 1.0, float("inf"), 1.0]
    with caplog.at_level(logging.WARNING, logger="evald.decisions.health"):
        alerts = [a for step, g in enumerate(trace) for a in m.observe_train(step, {"grad_norm": g})]
    assert _rules(alerts) == ["grad_explosion", "grad_explosion"]
    assert [a.step for a in alerts] == [1, 6]
    msg = alerts[0].message
    assert "step 1" in msg and "grad_explosion" in msg and "200000" in msg and "100000" in msg
    assert "gradient clipping" in msg
    assert [r.getMessage() for r in caplog.records] == [a.message for a in alerts]
    assert alerts[0].tag == "health/grad_explosion"


def test_grad_vanishing_needs_a_sustained_window():
    m = HealthMonitor(HealthThresholds(vanishing_window=20))
    alerts = []
    step = 0

    def feed(value, n):
        nonlocal step
        for _ in range(n):
            alerts.extend(m.observe_train(step, {"grad_norm": value}))
            step += 1

    feed(1e-4, 19)
    assert alerts == []  # 19 < window
    feed(1.0, 1)  # breaks the streak
    feed(1e-4, 10)
    m.observe_train(step, {"loss": 1.0})  # no grad_norm: neither extends nor breaks the streak
    feed(1e-4, 15)
    assert _rules(alerts) == ["grad_vanishing"]
    assert alerts[0].step == step - 6  # the 20th consecutive low record
    assert "20 consecutive" in alerts[0].message and "0.001" in alerts[0].message
    feed(1e-5, 50)
    assert len(alerts) == 1
    feed(0.5, 1)
    feed(1e-4, 20)
    assert _rules(alerts) == ["grad_vanishing", "grad_vanishing"]


def test_nonfinite_loss_fires_once_per_episode():
    m = HealthMonitor()
    trace = [2.0, float("nan"), float("nan"), float("inf"), 1.9, float("-inf")]
    alerts = [a for step, loss in enumerate(trace) for a in m.observe_train(step, {"loss": loss})]
    assert _rules(alerts) == ["nonfinite_loss", "nonfinite_loss"]
    assert [a.step for a in alerts] == [1, 5]
    assert "nan" in alerts[0].message


def test_loss_scale_collapse_by_drop_and_by_floor():
    m = HealthMonitor()
    trace = [4096.0, 16384.0, 65536.0, 32.0, 16.0, 8.0, 1024.0, 2048.0, 1.0, 0.5, 4096.0]
    alerts = [a for step, s in enumerate(trace) for a in m.observe_train(step, {"loss_scale": s})]
    # 32 < 1e-3 * 65536 -> collapse at step 3; 1024 clears; 1.0 <= floor fires again at step 8
    assert _rules(alerts) == ["loss_scale_collapse", "loss_scale_collapse"]
    assert [a.step for a in alerts] == [3, 8]
    assert "65536" in alerts[0].message and "0.001" in alerts[0].message
    assert "floor" in alerts[1].message


def _overfit_trace(monitor, evals, train_slope=-0.01, per_interval=10):
    """Feed `per_interval` train losses (slope per step) before each eval value."""
    alerts = []
    step, loss = 0, 3.0
    for value in evals:
        for _ in range(per_interval):
            step += 1
            loss += train_slope
            alerts += monitor.observe_train(step, {"loss": loss, "grad_norm": 1.0})
        alerts += monitor.observe_eval(step, value)
    return alerts


def test_overfitting_fires_after_window_and_refires_after_clearing():
    m = HealthMonitor(HealthThresholds(overfit_window=3))
    evals = [2.0, 1.8, 1.6, 1.7, 1.8, 1.9, 2.0, 2.1, 1.5, 1.6, 1.7, 1.8]
    alerts = _overfit_trace(m, evals)
    assert _rules(alerts) == ["overfitting", "overfitting"]
    # third consecutive rise: eval #6 (1.9) at step 60; after the dip to 1.5, eval #12 (1.8) at step 120
    assert [a.step for a in alerts] == [60, 120]
    assert "1.6" in alerts[0].message and "1.9" in alerts[0].message and "threshold 3" in alerts[0].message


def test_eval_worsening_without_falling_train_loss_is_not_overfitting():
    m = HealthMonitor()
    assert _overfit_trace(m, [2.0, 2.1, 2.2, 2.3, 2.4, 2.5], train_slope=+0.01) == []
    m = HealthMonitor()
    assert _overfit_trace(m, [2.0, 2.1, 2.2, 2.3, 2.4, 2.5], train_slope=0.0) == []


def test_overfitting_with_explicit_trend_and_max_mode():
    m = HealthMonitor(HealthThresholds(overfit_window=2), eval_mode="max")
    alerts = []
    for step, (acc, trend) in enumerate([(0.8, -0.1), (0.7, -0.1), (0.6, -0.1), (0.5, -0.1)]):
        alerts += m.observe_eval(step, acc, train_loss_trend=trend)
    assert _rules(alerts) == ["overfitting"] and alerts[0].step == 2


def test_state_dict_round_trip_preserves_episodes():
    thresholds = HealthThresholds(vanishing_window=5, overfit_window=2)
    m = HealthMonitor(thresholds)
    m.observe_train(0, {"loss": 3.0, "loss_scale": 65536.0})
    for step in range(1, 4):
        m.observe_train(step, {"grad_norm": 1e-4, "loss": 3.0 - step / 10})
    m.observe_eval(3, 1.0)
    m.observe_train(4, {"grad_norm": 1e-4, "loss": 2.5})  # vanishing streak 4 of 5
    m.observe_eval(4, 1.1)  # eval worse while train falls: overfit streak 1 of 2
    assert _rules(m.observe_train(5, {"loss": float("nan")})) == ["nonfinite_loss"]  # episode open

    state = json.loads(json.dumps(m.state_dict(), allow_nan=False))
    restored = HealthMonitor(thresholds)
    restored.load_state_dict(state)
    assert restored.state_dict() == m.state_dict()
    assert restored.active_rules == ["nonfinite_loss"]

    def continue_run(monitor):
        alerts = []
        alerts += monitor.observe_train(6, {"loss": float("nan"), "grad_norm": 1e-4, "loss_scale": 16.0})
        alerts += monitor.observe_train(7, {"loss": 2.3})
        alerts += monitor.observe_eval(7, 1.2)
        return [(a.rule, a.step) for a in alerts]

    expected = continue_run(m)
    assert continue_run(restored) == expected
    # nonfinite_loss stays one episode (no re-alert after restore); vanishing completes its
    # window at step 6; 16 < 1e-3 * 65536; the second worse eval completes the overfit window
    assert expected == [("grad_vanishing", 6), ("loss_scale_collapse", 6), ("overfitting", 7)]


def test_load_state_dict_rejects_foreign_state():
    with pytest.raises(ValueError, match="version"):
        _Rules().load_state_dict({"version": 99})
    with pytest.raises(ValueError, match="missing keys"):
        _Rules().load_state_dict({"version": 2})


def test_thresholds_are_validated_like_every_option():
    field = EvaldConfig.__dataclass_fields__["health"]
    table = build_table(HealthThresholds, {"grad_norm_explosion": 1e3}, "TOML file x.toml", "health")
    assert table.grad_norm_explosion == 1e3
    with pytest.raises(ConfigError, match="unknown key"):
        build_table(HealthThresholds, {"grad_norm_explosoin": 1e3}, "TOML file x.toml", "health")
    with pytest.raises(ConfigError, match="vanishing_window: must be >= 1"):
        build_table(HealthThresholds, {"vanishing_window": 0}, "command line", "--health")
    with pytest.raises(ConfigError, match="must be below grad_norm_explosion"):
        build_table(HealthThresholds, {"grad_norm_vanishing": 10, "grad_norm_explosion": 1}, "env", "health")
    with pytest.raises(ValueError, match="eval_mode"):
        _Rules(eval_mode="lower")
    assert field.metadata["table"] is HealthThresholds


def test_rule_names():
    assert RULES == ("grad_explosion", "grad_vanishing", "nonfinite_loss", "loss_scale_collapse", "overfitting")
    assert Alert("overfitting", 3, "m").tag == "health/overfitting"
