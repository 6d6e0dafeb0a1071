"""The two comparisons every decision shares: "is this better?" and "is the train loss falling?".

``better`` is the one min/max rule (early stop, best checkpoint, LR advice and the
overfitting rule all use it). ``TrainLossTrend`` compares the mean train loss since
the previous evaluation with the mean over the interval before it: negative means
falling. The overfitting rule and the LR advisor both ask "eval stalls while train
falls?", with this one trend.
"""

from __future__ import annotations

import math


def better(value: float, reference: float | None, mode: str, delta: float = 0.0) -> bool:
    """True when ``value`` beats ``reference`` by more than ``delta`` in direction ``mode``."""
    if reference is None:
        return True
    return value < reference - delta if mode == "min" else value > reference + delta


class TrainLossTrend:
    def __init__(self) -> None:
        self._sum = 0.0
        self._count = 0
        self._previous_mean: float | None = None

    def add(self, loss: float) -> None:
        if math.isfinite(loss):
            self._sum += loss
            self._count += 1

    def take(self) -> float | None:
        """Close the interval at an evaluation; the trend, or None without two intervals."""
        if not self._count:
            return None
        mean = self._sum / self._count
        self._sum, self._count = 0.0, 0
        previous, self._previous_mean = self._previous_mean, mean
        return None if previous is None else mean - previous

    def state_dict(self) -> dict:
        return {"sum": self._sum, "count": self._count, "previous_mean": self._previous_mean}

    def load_state_dict(self, state: dict) -> None:
        self._sum = float(state.get("sum", 0.0))
        self._count = int(state.get("count", 0))
        self._previous_mean = state.get("previous_mean")
