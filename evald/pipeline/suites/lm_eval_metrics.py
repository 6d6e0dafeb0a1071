"""The metric names each lm-eval task of a suite reports, as its per-sample outputs and TensorBoard
tags name them: ``acc`` for lm-eval's ``acc,none`` (filter ``none``), ``exact_match@strict-match``
for a filtered one (the names ``pipeline/suites/runner.py`` gives lm-eval's aggregates). They feed the
start-up check of ``--monitor SUITE/TASK/METRIC`` (``cli/main.py``, ``decisions/monitor_targets.py``)::

    suites = {name: suite_metric_names(config.suites[name])}    # lm-eval loads the suite's tasks
    check_suite_monitor(config.monitor, suites)

Reads lm-eval's own resolved tasks (``task.aggregation()``, ``task.config.filter_list``): the task's
YAML decides its metrics, not evald.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from evald.config.options import SuiteOptions
from evald.pipeline.suites.task_files import UntrustedTaskCode, task_manager


def metric_names(task: Any) -> list[str]:
    """One lm-eval task's metrics, each once per filter (``none`` is left out of the name)."""
    filters = [f["name"] for f in (task.config.filter_list or []) if isinstance(f, dict) and "name" in f] or ["none"]
    return [m if f in ("", "none") else f"{m}@{f}" for f in filters for m in task.aggregation()]


def task_metric_names(tasks: Mapping[str, Any]) -> dict[str, list[str]]:
    """``{task name: [metric, ...]}`` for ``TaskManager.load(...)["tasks"]`` (every leaf task, groups
    already flattened by lm-eval)."""
    return {name: metric_names(task) for name, task in tasks.items()}


def suite_metric_names(options: SuiteOptions) -> dict[str, list[str]] | None:
    """``{task: [metric, ...]}`` of one configured suite, as lm-eval loads its tasks (the task YAML judged by
    the trust rule first: UntrustedTaskCode is raised); None when lm-eval cannot load them here (a registry
    task whose data is not cached, a broken YAML): the suite's build then says why."""
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # as the suite runner: tasks and data are local
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        loaded = task_manager(tuple(options.include_path or ()), tuple(options.tasks)).load(list(options.tasks))
        return task_metric_names(loaded["tasks"])
    except UntrustedTaskCode:
        raise
    except Exception:  # noqa: BLE001 - whatever lm-eval raises on a task it cannot load: told at the suite's build
        return None
