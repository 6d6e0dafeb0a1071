"""The metrics of real lm-eval tasks (local YAML and data, nothing downloaded) become the suite monitor
targets; a monitor none of them produces is refused."""

from __future__ import annotations

import json

import pytest

from evald.decisions.monitor_targets import MonitorError, check_suite_monitor, known_monitor_targets
from evald.pipeline.suites.lm_eval_metrics import task_metric_names


def _tasks(tmp_path):
    data = tmp_path / "docs.jsonl"
    data.write_text("".join(json.dumps({"q": f"q{i}?", "choices": ["x", "y"], "label": i % 2, "a": "x"}) + "\n"
                            for i in range(4)))
    common = f"dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\ntest_split: test\n"
    (tmp_path / "mc.yaml").write_text(
        "task: tiny_mc\n" + common + "output_type: multiple_choice\ndoc_to_text: '{{q}}'\n"
        "doc_to_choice: '{{choices}}'\ndoc_to_target: '{{label}}'\nmetric_list:\n  - metric: acc\n"
        "  - metric: acc_norm\n")
    (tmp_path / "gen.yaml").write_text(
        "task: tiny_gen\n" + common + "output_type: generate_until\ndoc_to_text: '{{q}}'\ndoc_to_target: '{{a}}'\n"
        "generation_kwargs:\n  until: ['\\n']\nmetric_list:\n  - metric: exact_match\n"
        "filter_list:\n  - name: strict-match\n    filter:\n      - function: take_first\n")
    return tmp_path


def test_real_lm_eval_tasks_name_their_metrics_and_a_monitor_outside_them_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    from lm_eval.tasks import TaskManager

    loaded = TaskManager(include_path=str(_tasks(tmp_path))).load(["tiny_mc", "tiny_gen"])
    names = task_metric_names(loaded["tasks"])
    assert names == {"tiny_mc": ["acc", "acc_norm"], "tiny_gen": ["exact_match@strict-match"]}
    suites = {"fast": names}
    assert known_monitor_targets(suites) == {"fast/tiny_mc/acc", "fast/tiny_mc/acc_norm",
                                             "fast/tiny_gen/exact_match@strict-match"}
    check_suite_monitor("fast/tiny_mc/acc_norm", suites)
    with pytest.raises(MonitorError, match="did you mean fast/tiny_gen/exact_match@strict-match"):
        check_suite_monitor("fast/tiny_gen/exact_match", suites)
