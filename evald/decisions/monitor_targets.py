"""What ``--monitor`` may name, and the refusal when it names nothing the configuration produces.

A suite metric is ``SUITE/TASK/METRIC`` (``fast/hellaswag/acc_norm``), the TensorBoard tag the
suite's results are written under; its standard error is ``SUITE/TASK/METRIC_stderr``. Lightning
refuses, at the start, an ``EarlyStopping(monitor=...)`` that no logged metric can match; evald
does the same (principle: a wrong configuration gives an error, never a plausible number):

    targets = known_monitor_targets({"fast": {"hellaswag": ["acc", "acc_norm"]}}, default_tags)
    check_monitor(config.monitor, targets)   # MonitorError naming the closest names
    check_suite_monitor(config.monitor, {"fast": {"hellaswag": ["acc", "acc_norm"]}})  # suite names only

The metric names of each task come from lm-eval's resolved task (``pipeline``); this module only
puts them together, so it stays pure.

May import: the standard library only.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Iterable, Mapping

STDERR_SUFFIX = "_stderr"


class MonitorError(ValueError):
    """``--monitor`` names a metric that the configured evaluation and suites cannot produce."""


@dataclass(frozen=True)
class SuiteMetric:
    suite: str
    task: str
    metric: str

    def __str__(self) -> str:
        return f"{self.suite}/{self.task}/{self.metric}"


def parse_suite_monitor(monitor: str) -> SuiteMetric | None:
    """``fast/hellaswag/acc_norm`` -> SuiteMetric; None for evald's own tags (``eval/loss``)."""
    parts = monitor.split("/")
    if len(parts) != 3 or not all(parts) or parts[0] in ("eval", "train", "evald", "sample"):
        return None
    return SuiteMetric(*parts)


def stderr_tag(monitor: str) -> str:
    """The tag of a suite metric's standard error (lm-eval's ``_stderr``)."""
    return monitor + STDERR_SUFFIX


def known_monitor_targets(suites: Mapping[str, Mapping[str, Iterable[str]]],
                          default_tags: Iterable[str] = ()) -> set[str]:
    """Every tag a monitor may name: ``default_tags`` (the default validation's, e.g. ``eval/loss``)
    and ``SUITE/TASK/METRIC`` for each suite's task's metrics (``{suite: {task: [metric, ...]}}``).
    Standard errors (``..._stderr``) are left out: they are noise estimates, not targets."""
    targets = set(default_tags)
    for suite, tasks in suites.items():
        for task, metrics in tasks.items():
            targets.update(f"{suite}/{task}/{m}" for m in metrics if not m.endswith(STDERR_SUFFIX))
    return targets


def check_monitor(monitor: str, targets: set[str]) -> None:
    """Raise MonitorError when ``monitor`` is not among ``targets``, naming what would match."""
    if monitor in targets:
        return
    close = difflib.get_close_matches(monitor, sorted(targets), n=3, cutoff=0.6)
    suite = parse_suite_monitor(monitor)
    if suite is not None:
        same_task = sorted(t for t in targets if t.startswith(f"{suite.suite}/{suite.task}/"))
        where = (f"task {suite.task!r} of suite {suite.suite!r} produces {', '.join(same_task)}" if same_task else
                 f"no configured suite {suite.suite!r} has a task {suite.task!r}")
    else:
        where = "the default evaluation does not produce it"
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    shown = ", ".join(sorted(targets)[:20]) + (" ..." if len(targets) > 20 else "")
    raise MonitorError(f"--monitor {monitor}: {where}{hint} (what can be monitored: {shown or 'nothing'})")


def check_suite_monitor(monitor: str, suites: Mapping[str, Mapping[str, Iterable[str]]]) -> None:
    """Like :func:`check_monitor`, for a monitor shaped ``SUITE/TASK/METRIC`` only: any other monitor
    (``eval/loss``, a plug-in's ``eval/<name>``) is left to the default evaluation's own check."""
    if parse_suite_monitor(monitor) is not None:
        check_monitor(monitor, known_monitor_targets(suites))
