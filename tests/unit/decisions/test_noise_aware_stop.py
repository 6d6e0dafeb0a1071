"""Early stopping beyond the noise, in-process: --min-delta in standard errors, reasons that state
the values and SEs compared, the advisory mode. The same with a real evald on real checkpoints is
tests/e2e/test_noise_aware_stop_e2e.py."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from evald.cli.main import parse_config
from evald.config import ConfigError, EvaldConfig
from evald.config.values import MinDelta
from evald.contracts import wire
from evald.decisions.decisions import Decisions
from evald.decisions.early_stop import EarlyStopPolicy


@pytest.mark.parametrize("argv, expected", [
    (["--min-delta", "2se"], MinDelta(2.0, "se")), (["--min-delta", "0.5 SE"], MinDelta(0.5, "se")),
    (["--min-delta", "0.01"], MinDelta(0.01, "abs")), ([], MinDelta(0.0, "abs")),
])
def test_min_delta_takes_a_number_or_standard_errors(argv, expected):
    assert parse_config(argv).config.min_delta == expected


def test_min_delta_in_toml_and_its_errors(tmp_path):
    toml = tmp_path / "evald.toml"
    toml.write_text('min_delta = "1.5se"\n')
    assert parse_config(["--config", str(toml)]).config.min_delta == MinDelta(1.5, "se")
    toml.write_text("min_delta = 0.25\n")
    assert parse_config(["--config", str(toml)]).config.min_delta == MinDelta(0.25, "abs")
    for bad in ("-1", "-2se", "2sd", "se", "nan", "inf se"):
        with pytest.raises(ConfigError, match=r"command line --min-delta: (must be >= 0, got -[0-9.]+; )?expected a number >= 0 .* \(e.g. 2se\)"):
            parse_config([f"--min-delta={bad}"])


def test_a_threshold_in_standard_errors_combines_both_values_ses():
    assert MinDelta(2, "se").threshold(0.03, 0.04) == pytest.approx(2 * 0.05)
    assert MinDelta(2, "se").threshold(0.03, None) == pytest.approx(0.06)
    assert MinDelta(2, "se").threshold(None, 0.04) is None
    assert MinDelta(0.1).threshold(None, None) == 0.1


def test_every_improved_and_no_improvement_reason_states_the_values_and_ses_compared():
    policy = EarlyStopPolicy(patience=2, min_delta=MinDelta(2, "se"))
    first = policy.observe(10, 3.0, 0.05)
    assert first.improved and first.reason == "eval/loss improved to 3 ± 0.05 at step 10"
    better = policy.observe(20, 2.8, 0.04)   # by 0.2 > 2 * hypot(0.04, 0.05) = 0.128
    assert better.improved and better.reason == ("eval/loss improved to 2.8 ± 0.04 at step 20 (from 3 ± 0.05 at "
                                                 "step 10: by 0.2, more than 2se = 0.1281)")
    noise = policy.observe(30, 2.75, 0.04)   # by 0.05 < 2 * hypot(0.04, 0.04) = 0.113
    assert not noise.improved and noise.reason == ("eval/loss = 2.75 ± 0.04 at step 30: no improvement over best "
                                                   "2.8 ± 0.04 (step 20) by more than 2se = 0.1131 for 1 "
                                                   "evaluation(s)")
    stop = policy.observe(40, 2.79, 0.04)
    assert stop.stop and "patience 2 exhausted" in stop.reason
    assert policy.state_dict()["best_se"] == 0.04


def test_without_a_standard_error_se_units_fall_back_to_zero_and_say_so():
    policy = EarlyStopPolicy(patience=1, min_delta=MinDelta(2, "se"), monitor="eval/my_plugin")
    policy.observe(10, 1.0)
    verdict = policy.observe(20, 1.1)
    assert "2se = 0 (eval/my_plugin has no standard error here)" in verdict.reason


def noisy_plateau(seed: int = 0):
    """A loss that falls by 0.3 per evaluation (steps 10-50), then plateaus at 2.0 from step 60 with
    noise of standard deviation 0.02, while each value's SE on the subset is 0.05 (the subset cannot
    tell such differences apart)."""
    rng = np.random.default_rng(seed)
    values = [3.5 - 0.3 * i for i in range(5)] + list(2.0 + rng.normal(0, 0.02, size=35))
    return [(10 * (i + 1), float(v), 0.05) for i, v in enumerate(values)]


def predicted_stop(points, k: float, patience: int) -> int | None:
    """The documented rule, written out again from docs/early-stopping.md: improved when better than
    the best by more than k * sqrt(se^2 + se_best^2); stop after `patience` evaluations without."""
    best = best_se = None
    wait = 0
    for step, value, se in points:
        threshold = k * math.hypot(se, best_se or 0.0)
        if best is None or value < best - threshold:
            best, best_se, wait = value, se, 0
        else:
            wait += 1
            if wait >= patience:
                return step
    return None


def run_policy(points, min_delta, patience=4):
    policy = EarlyStopPolicy(patience=patience, min_delta=min_delta)
    verdicts = [(step, policy.observe(step, value, se)) for step, value, se in points]
    stops = [step for step, v in verdicts if v.stop]
    improved_on_plateau = sum(v.improved for step, v in verdicts if step > 60)
    return stops, improved_on_plateau


def test_on_a_noisy_plateau_two_se_stops_once_where_predicted_and_zero_flaps():
    points = noisy_plateau()
    stops, flaps = run_policy(points, MinDelta(2, "se"))
    assert stops and stops[0] == predicted_stop(points, 2, 4) and flaps == 0
    assert stops[0] == 100    # 4 evaluations after the plateau began at step 60
    zero_stops, zero_flaps = run_policy(points, MinDelta(0))
    assert zero_flaps >= 3    # noise "improvements" keep resetting patience
    assert not zero_stops or zero_stops[0] > stops[0] + 40


def decisions(**options) -> Decisions:
    made = Decisions(dataclasses.replace(EvaldConfig(), **options))
    made.begin_run("r")
    return made


def test_decisions_pass_the_monitors_standard_error_to_the_policy():
    d = decisions(patience=1, min_delta=MinDelta(2, "se"))
    d.observe_eval(10, {"eval/loss": 2.0, "eval/loss_se": 0.1}, newest_step=10, every_n_steps=10)
    outcome = d.observe_eval(20, {"eval/loss": 1.8, "eval/loss_se": 0.1}, newest_step=20, every_n_steps=10)
    assert not outcome.improved and "2se = 0.2828" in outcome.reason and outcome.stop_at_step == 30


def test_advisory_mode_publishes_what_it_would_have_done_and_never_stops():
    d = decisions(patience=1, advisory_stop=True)
    d.observe_eval(10, {"eval/loss": 2.0}, newest_step=10, every_n_steps=10)
    outcome = d.observe_eval(20, {"eval/loss": 2.5}, newest_step=24, every_n_steps=10)
    assert outcome.stop_at_step is None and outcome.advisory_stop_at == 34
    assert outcome.texts()["evald/decision"].startswith(
        "ADVISORY STOP at step 34 (advisory mode: training continues): eval/loss = 2.5 at step 20")
    state = d.control_state()
    assert state.stop_at_step is None and state.advisory_stop == {"stop_at_step": 34, "step": 20,
                                                                  "reason": outcome.reason}
    assert wire.decode(state.encode()) == state       # it travels on the wire as it is
    later = d.observe_eval(30, {"eval/loss": 2.6}, newest_step=40, every_n_steps=10)
    assert later.advisory_stop_at is None and d.advisory_stop["stop_at_step"] == 34  # said once
    restored = decisions(patience=1, advisory_stop=True)
    restored.load_state_dict(d.state_dict())
    again = restored.control_state()
    assert again == dataclasses.replace(state, sent_at=again.sent_at)
