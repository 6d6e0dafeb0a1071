"""Is the training loss still falling? Compared between consecutive evaluations.

The mean train loss since the previous evaluation minus the mean over the
interval before that: negative means falling. Used by the overfitting rule
and the learning-rate advisor, which both ask "eval stalls while train falls?".
"""

from __future__ import annotations

import math


class TrainLossTrend:
    def __init__(self) -> None:
        self._current: list[float] = []
        self._previous_mean: float | None = None

    def add(self, loss: float) -> None:
        if math.isfinite(loss):
            self._current.append(loss)

    def take(self) -> float | None:
        """Close the interval at an evaluation; the trend, or None without two intervals."""
        if not self._current:
            return None
        mean = sum(self._current) / len(self._current)
        self._current = []
        previous, self._previous_mean = self._previous_mean, mean
        return None if previous is None else mean - previous
