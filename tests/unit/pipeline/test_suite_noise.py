"""A suite evaluation writes nothing to the log that is not news (issue 26, item 9): the demo's task
YAMLs gave lm-eval no aggregation or direction for their metrics (six WARNING lines per task at every
load: 390 in one demo log), and lm-eval runs `git describe` in the current directory at every
evaluation, which printed "fatal: not a git repository" outside a git checkout."""

from __future__ import annotations

import logging

import pytest

pytest.importorskip("lm_eval")

from evald.pipeline.suites import runner
from examples.tiny_lm.benchmarks import write_benchmarks


def test_the_demo_tasks_load_without_a_warning(tmp_path, caplog):
    include = write_benchmarks(tmp_path / "bench", next_line_count=8, bpb_docs_per_set=1)
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=[include], include_defaults=False)
    with caplog.at_level(logging.WARNING):
        loaded = manager.load(["stdlib_next_line", "stdlib_bpb"])["tasks"]
    assert len(loaded) >= 2
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_lm_eval_asks_git_quietly_outside_a_checkout(tmp_path, monkeypatch, capfd):
    import lm_eval.evaluator

    runner.quiet_lm_eval_git()
    monkeypatch.chdir(tmp_path)    # no git repository here
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    lm_eval.evaluator.get_git_commit_hash()
    assert "fatal" not in capfd.readouterr().err
