"""Early stopping and the best step on a suite metric: its stderr tag, the paired SE with --min-delta Nse,
and --monitor refused at start-up when the configured suites cannot produce it."""

from __future__ import annotations

import math

import pytest

from evald.config import EvaldConfig
from evald.config.values import MinDelta
from evald.decisions.decisions import Decisions
from evald.decisions.early_stop import EarlyStopPolicy
from evald.decisions.monitor_targets import (MonitorError, check_monitor, check_suite_monitor, known_monitor_targets,
                                             parse_suite_monitor)

SUITES = {"fast": {"hellaswag": ["acc", "acc_norm", "acc_stderr"], "arc_easy": ["acc"]},
          "bpb": {"wiki": ["bits_per_byte", "byte_perplexity"]}}


def test_known_targets_are_suite_task_metric_without_stderrs_plus_the_default_tags():
    targets = known_monitor_targets(SUITES, ["eval/loss", "eval/accuracy"])
    assert targets == {"eval/loss", "eval/accuracy", "fast/hellaswag/acc", "fast/hellaswag/acc_norm",
                       "fast/arc_easy/acc", "bpb/wiki/bits_per_byte", "bpb/wiki/byte_perplexity"}
    check_monitor("fast/hellaswag/acc_norm", targets)
    check_suite_monitor("fast/hellaswag/acc_norm", SUITES)


@pytest.mark.parametrize("monitor,message", [
    ("fast/hellaswag/acc_nrom", r"task 'hellaswag' of suite 'fast' produces fast/hellaswag/acc, "
                                r"fast/hellaswag/acc_norm; did you mean fast/hellaswag/acc_norm"),
    ("fast/mmlu/acc", r"no configured suite 'fast' has a task 'mmlu'"),
    ("slow/hellaswag/acc", r"no configured suite 'slow' has a task 'hellaswag'"),
    ("fast/hellaswag/acc_stderr", r"produces fast/hellaswag/acc, fast/hellaswag/acc_norm"),
])
def test_a_suite_monitor_nothing_produces_is_refused_naming_what_would_match(monitor, message):
    with pytest.raises(MonitorError, match=message) as caught:
        check_suite_monitor(monitor, SUITES)
    assert str(caught.value).startswith(f"--monitor {monitor}: ")


def test_the_suite_check_leaves_evalds_own_tags_to_the_default_evaluations_check():
    check_suite_monitor("eval/loss", SUITES)        # not a suite metric: not this check's to refuse
    check_suite_monitor("eval/macro_f1", {})
    with pytest.raises(MonitorError, match="the default evaluation does not produce it"):
        check_monitor("eval/los", known_monitor_targets(SUITES, ["eval/loss"]))
    assert parse_suite_monitor("eval/a/b") is None and parse_suite_monitor("fast//acc") is None
    assert str(parse_suite_monitor("fast/hellaswag/acc_norm")) == "fast/hellaswag/acc_norm"


def test_with_min_delta_in_se_the_paired_se_replaces_the_unpaired_one():
    # acc_norm rises 0.50 -> 0.53 on 200 documents: unpaired SEs ~0.035 each (2se ~ 0.1), paired SE 0.01
    policy = EarlyStopPolicy(monitor="fast/hellaswag/acc_norm", mode="max", min_delta=MinDelta(2, "se"))
    policy.observe(10, 0.50, 0.0354)
    unpaired = EarlyStopPolicy(monitor="fast/hellaswag/acc_norm", mode="max", min_delta=MinDelta(2, "se"))
    unpaired.load_state_dict(policy.state_dict())
    verdict = policy.observe(20, 0.53, 0.0353, paired_se=0.01)
    assert verdict.improved and policy.best_step == 20
    assert "by 0.03, more than 2se paired = 0.02" in verdict.reason
    no_pair = unpaired.observe(20, 0.53, 0.0353)
    assert not no_pair.improved and f"2se = {2 * math.hypot(0.0353, 0.0354):.4g}" in no_pair.reason
    # a non-finite or absent paired SE falls back to the unpaired rule; an absolute min_delta ignores it
    fallback = EarlyStopPolicy(monitor="m", mode="max", min_delta=MinDelta(2, "se"))
    fallback.observe(10, 0.50, 0.0354)
    assert not fallback.observe(20, 0.53, 0.0353, paired_se=float("nan")).improved
    absolute = EarlyStopPolicy(monitor="m", mode="max", min_delta=MinDelta(0.05))
    absolute.observe(10, 0.50, 0.0354)
    assert not absolute.observe(20, 0.53, 0.0353, paired_se=0.001).improved


def test_decisions_monitor_a_suite_metric_with_its_stderr_and_the_paired_se():
    config = EvaldConfig(monitor="fast/hellaswag/acc_norm", mode="max", min_delta=MinDelta(2, "se"), patience=2)
    decisions = Decisions(config)
    first = decisions.observe_eval(10, {"fast/hellaswag/acc_norm": 0.50, "fast/hellaswag/acc_norm_stderr": 0.0354},
                                   newest_step=10, every_n_steps=10)
    assert first.improved and "0.5 ± 0.035" in first.reason
    second = decisions.observe_eval(20, {"fast/hellaswag/acc_norm": 0.53, "fast/hellaswag/acc_norm_stderr": 0.0353},
                                    newest_step=20, every_n_steps=10, paired_se=0.01)
    assert second.improved and decisions.best_step == 20 and "2se paired = 0.02" in second.reason
    na = decisions.observe_eval(30, {"fast/hellaswag/acc_norm": 0.52, "fast/hellaswag/acc_norm_stderr": "N/A"},
                                newest_step=30, every_n_steps=10)
    assert not na.improved and "has no standard error here" in na.reason
