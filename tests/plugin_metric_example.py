"""Example metric plugins for tests/unit/pipeline/test_metric_plugins.py, loaded by 'module:ClassName' spec."""

from __future__ import annotations

import numpy as np
from mindspore.train import Metric


class MeanAbsoluteLogit(Metric):
    """Mean |logit| over all elements seen, times ``scale``: a tiny real plugin with a kwarg."""

    def __init__(self, scale: float = 1.0) -> None:
        super().__init__()
        self.scale = scale
        self.clear()

    def clear(self) -> None:
        self._total = 0.0
        self._count = 0

    def update(self, *inputs) -> None:
        logits = self._convert_data(inputs[0])
        self._total += float(np.abs(logits).sum())
        self._count += int(np.size(logits))

    def eval(self) -> float:
        if self._count == 0:
            raise RuntimeError("MeanAbsoluteLogit.eval() called before update()")
        return self.scale * self._total / self._count


class PerColumnMean(Metric):
    """Returns a vector from eval(), which run_metric must refuse (it logs scalars only)."""

    def clear(self) -> None:
        self._rows: list[np.ndarray] = []

    def update(self, *inputs) -> None:
        self._rows.append(self._convert_data(inputs[0]))

    def eval(self) -> np.ndarray:
        return np.concatenate(self._rows).mean(axis=0)


class NotAMetric:
    """Has the Metric methods but does not subclass mindspore.train.Metric."""

    def clear(self) -> None:
        pass

    def update(self, *inputs) -> None:
        pass

    def eval(self) -> float:
        return 0.0


def mean_abs(x: np.ndarray) -> float:
    """A plain function: a spec pointing here must be rejected."""
    return float(np.abs(x).mean())
