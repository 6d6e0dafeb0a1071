"""``--monitor SUITE/TASK/METRIC`` is checked down to the metric at start-up (issue 27, Medium 5): a
misspelt metric (``mc/tiny_mc/acc_nrom``, docs/early-stopping.md's own example) is refused, exit 2, naming
the metrics the task reports; on main only the suite and the task were checked, and evald started and never
acted. The metric names are lm-eval's, from the suite's real task YAML."""

from __future__ import annotations

import json
import os

import pytest

from evald.cli.main import parse_config
from evald.decisions.monitor_targets import MonitorError


@pytest.fixture
def suite(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    data = tmp_path / "docs.jsonl"
    data.write_text("".join(json.dumps({"q": f"q{i}?", "choices": ["x", "y"], "label": i % 2}) + "\n"
                            for i in range(4)))
    (tasks / "mc.yaml").write_text(
        f"task: tiny_mc\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\ntest_split: test\n"
        "output_type: multiple_choice\ndoc_to_text: '{{q}}'\ndoc_to_choice: '{{choices}}'\n"
        "doc_to_target: '{{label}}'\nmetric_list:\n  - metric: acc\n  - metric: acc_norm\n")
    return json.dumps({"mc": {"tasks": ["tiny_mc"], "include_path": [str(tasks)]}}), tasks


def test_a_misspelt_suite_metric_is_refused_naming_the_known_metrics(suite):
    suites, _ = suite
    with pytest.raises(MonitorError) as refused:
        parse_config(["--suites", suites, "--monitor", "mc/tiny_mc/acc_nrom", "--mode", "max"], environ={})
    message = str(refused.value)
    assert "mc/tiny_mc/acc, mc/tiny_mc/acc_norm" in message and "did you mean mc/tiny_mc/acc_norm" in message


def test_a_metric_the_task_reports_is_accepted(suite):
    suites, _ = suite
    assert parse_config(["--suites", suites, "--monitor", "mc/tiny_mc/acc_norm", "--mode", "max"],
                        environ={}).config.monitor == "mc/tiny_mc/acc_norm"


def test_untrusted_task_yaml_is_refused_at_the_check_too(suite):
    """The check loads the suite's tasks, so the trust rule comes first there too (main() prints it, exit 2)."""
    suites, tasks = suite
    os.chmod(tasks, 0o777)
    with pytest.raises(MonitorError, match=str(tasks)):
        parse_config(["--suites", suites, "--monitor", "mc/tiny_mc/acc_norm", "--mode", "max"], environ={})
