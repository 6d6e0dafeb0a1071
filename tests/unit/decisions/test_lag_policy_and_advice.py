"""Lag policy decisions and learning-rate advice rules."""

from __future__ import annotations

from evald.intake.lag_policy import admit, decide
from evald.decisions.lr_advisor import LRAdvisor
from evald.decisions.trend import TrainLossTrend, better


def test_all_is_fifo_and_latest_skips_older_with_reasons():
    queued = [30, 10, 20]
    assert decide("all", queued).evaluate == 10 and decide("all", queued).skip == ()
    latest = decide("latest", queued)
    assert latest.evaluate == 30
    assert [k for k, _ in latest.skip] == [10, 20] and "superseded by step 30" in latest.skip[0][1]


def test_latest_never_skips_the_final_checkpoint():
    assert [k for k, _ in decide("latest", [10, 20, 30], final_step=20).skip] == [10]


def test_every_k_admits_every_kth_and_the_final_one():
    reasons = [admit("every-k", 3, i, (i + 1) * 10) for i in range(7)]
    assert [r is None for r in reasons] == [False, False, True, False, False, True, False]
    assert admit("every-k", 3, 6, 70, final_step=70) is None
    assert admit("all", 3, 0, 10) is None


def test_lr_advice_overfitting_then_plateau_once_per_episode():
    advisor = LRAdvisor(window=2)
    assert advisor.observe(10, 2.0, None) is None
    assert advisor.observe(20, 2.1, -0.1) is None
    overfit = advisor.observe(30, 2.2, -0.1)
    assert overfit["kind"] == "overfitting" and overfit["scale"] < 1 and overfit["id"] == 1
    assert advisor.observe(40, 2.2, -0.1) is None  # same episode: said once
    plateau = advisor.observe(50, 2.2, 0.01)
    assert plateau["kind"] == "plateau" and plateau["scale"] > 1 and plateau["id"] == 2
    assert advisor.observe(60, 1.0, 0.0) is None and advisor.active is None  # improvement ends it


def test_train_loss_trend():
    trend = TrainLossTrend()
    for loss in (3.0, 2.8):
        trend.add(loss)
    assert trend.take() is None
    for loss in (2.5, 2.3, float("nan")):
        trend.add(loss)
    assert trend.take() < 0


def test_better_is_the_one_min_max_rule():
    assert better(1.0, None, "min") and better(1.0, 2.0, "min") and not better(2.0, 1.0, "min")
    assert better(2.0, 1.0, "max") and not better(1.05, 1.0, "max", delta=0.1)
    assert not better(1.0, 1.0, "min") and not better(0.95, 1.0, "min", delta=0.1)


def test_train_loss_trend_survives_a_restart():
    trend = TrainLossTrend()
    trend.add(3.0)
    assert trend.take() is None
    trend.add(2.0)
    restored = TrainLossTrend()
    restored.load_state_dict(trend.state_dict())
    assert restored.take() == trend.take() == -1.0
