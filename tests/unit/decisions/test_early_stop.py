"""The early-stop policy: every knob, a reason for every decision, state that survives a restart."""

from __future__ import annotations

import math

import pytest

from evald.decisions.early_stop import EarlyStopPolicy


def run(policy, values, start=10, every=10):
    return [policy.observe(start + i * every, v) for i, v in enumerate(values)]


def test_patience_counts_evaluations_without_improvement():
    verdicts = run(EarlyStopPolicy(patience=2), [3.0, 2.5, 2.6, 2.55])
    assert [v.stop for v in verdicts] == [False, False, False, True]
    assert "patience 2 exhausted" in verdicts[-1].reason and "best 2.5" in verdicts[-1].reason
    assert [v.improved for v in verdicts] == [True, True, False, False]


def test_min_delta_and_mode_max():
    policy = EarlyStopPolicy(mode="max", patience=1, min_delta=0.1)
    verdicts = run(policy, [0.5, 0.55])
    assert verdicts[1].stop and "by more than 0.1" in verdicts[1].reason


def test_thresholds_and_non_finite():
    assert run(EarlyStopPolicy(stopping_threshold=2.0), [3.0, 1.9])[1].stop
    diverged = run(EarlyStopPolicy(divergence_threshold=10.0), [3.0, 12.0])[1]
    assert diverged.stop and "divergence" in diverged.reason
    nan = run(EarlyStopPolicy(), [3.0, math.nan])[1]
    assert nan.stop and "not finite" in nan.reason
    assert not run(EarlyStopPolicy(check_finite=False), [3.0, math.nan])[1].stop


def test_state_survives_a_restart_and_old_steps_are_ignored():
    first = EarlyStopPolicy(patience=3)
    run(first, [2.0, 2.1, 2.2])  # wait = 2 after step 30
    second = EarlyStopPolicy(patience=3)
    second.load_state_dict(first.state_dict())
    assert second.observe(30, 5.0).reason.endswith("ignored")  # replay of an observed step
    verdict = second.observe(40, 2.3)
    assert verdict.stop and second.wait == 3


def test_bad_arguments_are_rejected_in_init():
    with pytest.raises(ValueError, match="mode"):
        EarlyStopPolicy(mode="up")
    with pytest.raises(ValueError, match="patience"):
        EarlyStopPolicy(patience=0)
    with pytest.raises(ValueError, match="min_delta"):
        EarlyStopPolicy(min_delta=-1.0)
