"""Evaluation tasks: each builds a Graph-mode eval cell around the network, checks that the
validation data has the shape it needs, and turns the cell's outputs on the fixed subset
into metrics. ``lm`` and ``classification`` ship with evald.

A task checks ``should_abort()`` between batches and raises EvaluationInterrupted, so a
forced shutdown (a second SIGTERM) abandons an evaluation at a batch boundary.

May import: config, contracts; within evald.pipeline: metrics, subset.
"""

from __future__ import annotations

from typing import Any, Sequence

from evald.pipeline.tasks.classification import ClassificationTask
from evald.pipeline.tasks.lm import LanguageModelTask


def make_task(name: str, **options: Any):
    if name == "lm":
        return LanguageModelTask(**options)
    if name == "classification":
        return ClassificationTask(**options)
    raise ValueError(f"unknown task {name!r}; evald knows 'lm' and 'classification'")


TASKS = {"lm": LanguageModelTask, "classification": ClassificationTask}


def metric_names(task: str, plugin_names: Sequence[str] = (), generation: bool = False) -> set[str]:
    """Every scalar an evaluation of ``task`` reports (with standard errors where it has them), so that
    ``--monitor`` can be checked at start-up, before any checkpoint is evaluated."""
    from evald.pipeline.metrics.sample_quality import sample_quality_report
    from evald.pipeline.metrics.uncertainty import se_tag

    names = set(TASKS[task].METRICS) | {se_tag(name) for name in TASKS[task].METRICS if name != "eval/perplexity"}
    names |= {"eval/perplexity_se"} if task == "lm" else set()
    names |= {f"eval/{name}" for name in plugin_names}
    if generation and task == "lm":
        keys = sample_quality_report([[0, 1]], [[0, 1]], 2)
        names |= {f"sample/{mode}/{key}" for mode in ("greedy", "sampled") for key in keys}
    return names
