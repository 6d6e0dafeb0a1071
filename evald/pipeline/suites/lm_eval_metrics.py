"""The metric names each lm-eval task of a suite reports, as its per-sample outputs and TensorBoard
tags name them: ``acc`` for lm-eval's ``acc,none`` (filter ``none``), ``exact_match@strict-match``
for a filtered one (the names ``pipeline/suites/runner.py`` gives lm-eval's aggregates). They feed the start-up check of ``--monitor SUITE/TASK/METRIC``
(``decisions/monitor_targets.py``)::

    loaded = TaskManager(include_path=...).load(suite.tasks)
    suites = {suite.name: task_metric_names(loaded["tasks"])}
    check_suite_monitor(config.monitor, suites)

Reads lm-eval's own resolved tasks (``task.aggregation()``, ``task.config.filter_list``): the task's
YAML decides its metrics, not evald.
"""

from __future__ import annotations

from typing import Any, Mapping


def metric_names(task: Any) -> list[str]:
    """One lm-eval task's metrics, each once per filter (``none`` is left out of the name)."""
    filters = [f["name"] for f in (task.config.filter_list or []) if isinstance(f, dict) and "name" in f] or ["none"]
    return [m if f in ("", "none") else f"{m}@{f}" for f in filters for m in task.aggregation()]


def task_metric_names(tasks: Mapping[str, Any]) -> dict[str, list[str]]:
    """``{task name: [metric, ...]}`` for ``TaskManager.load(...)["tasks"]`` (every leaf task, groups
    already flattened by lm-eval)."""
    return {name: metric_names(task) for name, task in tasks.items()}
