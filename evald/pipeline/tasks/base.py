"""What every task shares: the abort check between batches, and the errors a task raises.

Imports nothing of evald.
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
