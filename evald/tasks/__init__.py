"""Evaluation tasks: each builds a Graph-mode eval cell around the network, checks that the
validation data has the shape it needs, and turns the cell's outputs on the fixed subset
into metrics. ``lm`` and ``classification`` ship with evald.

A task checks ``should_abort()`` between batches and raises EvaluationInterrupted, so a
forced shutdown (a second SIGTERM) abandons an evaluation at a batch boundary.
"""

from __future__ import annotations

from typing import Any, Callable

ShouldAbort = Callable[[], bool]


class EvaluationInterrupted(Exception):
    """The evaluation was abandoned between batches (forced shutdown); it is redone later."""


class DataShapeError(ValueError):
    """The data factory returns items of the wrong shape for the task; the message says what came."""


def never() -> bool:
    return False


def make_task(name: str, **options: Any):
    if name == "lm":
        from evald.tasks.lm import LanguageModelTask

        return LanguageModelTask(**options)
    if name == "classification":
        from evald.tasks.classification import ClassificationTask

        return ClassificationTask(**options)
    raise ValueError(f"unknown task {name!r}; evald knows 'lm' and 'classification'")


def describe_item(item: Any) -> str:
    """A short description of a data item's structure, for shape errors."""
    import numpy as np

    if isinstance(item, (tuple, list)):
        parts = ", ".join(describe_item(x) for x in item[:4])
        return f"a {type(item).__name__} of {len(item)} ({parts}{', …' if len(item) > 4 else ''})"
    if isinstance(item, dict):
        return f"a dict with keys {sorted(item)[:6]}"
    array = np.asarray(item)
    return f"an array of shape {array.shape} and dtype {array.dtype}"
