"""Evaluation tasks: each builds a Graph-mode eval cell around the network, checks that the
validation data has the shape it needs, and turns the cell's outputs on the fixed subset
into metrics. ``lm`` and ``classification`` ship with evald.

A task checks ``should_abort()`` between batches and raises EvaluationInterrupted, so a
forced shutdown (a second SIGTERM) abandons an evaluation at a batch boundary.
"""

from __future__ import annotations

from typing import Any

from evald.pipeline.tasks.classification import ClassificationTask
from evald.pipeline.tasks.lm import LanguageModelTask


def make_task(name: str, **options: Any):
    if name == "lm":
        return LanguageModelTask(**options)
    if name == "classification":
        return ClassificationTask(**options)
    raise ValueError(f"unknown task {name!r}; evald knows 'lm' and 'classification'")
