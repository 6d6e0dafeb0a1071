"""Training-health scalars gathered per step and sent to evald in batches.

Per step: whatever the caller knows (loss, learning rate, gradient norm, loss
scale, overflow) plus what this module measures: step time, samples and tokens
per second, and an ETA (mean of recent step times x remaining steps, the
seed article's "ETA dashboard"). Records are batched so the training thread
pays one deque append per ``flush_every`` steps.
"""

from __future__ import annotations

import collections
import time
from typing import Any, Mapping

from evald.contracts.wire import encode_scalar


class Telemetry:
    def __init__(self, *, total_steps: int | None = None, flush_every: int = 10,
                 eta_window: int = 50) -> None:
        self.total_steps = total_steps
        self.flush_every = max(1, int(flush_every))
        self._step_times: collections.deque[float] = collections.deque(maxlen=max(1, eta_window))
        self._last_step_end: float | None = None
        self._pending: list[dict[str, Any]] = []

    def record(self, step: int, scalars: Mapping[str, Any], *, samples: int | None = None,
               tokens: int | None = None) -> list[dict[str, Any]] | None:
        """Add one step; return a batch of records when ``flush_every`` are pending."""
        now = time.time()
        values: dict[str, float] = {}
        for key, value in scalars.items():
            number = to_float(value)
            if number is not None:
                values[key] = number
        if self._last_step_end is not None:
            step_time = now - self._last_step_end
            self._step_times.append(step_time)
            values["step_time_s"] = step_time
            if samples and step_time > 0:
                values["samples_per_s"] = samples / step_time
            if tokens and step_time > 0:
                values["tokens_per_s"] = tokens / step_time
            eta = self.eta_seconds(step)
            if eta is not None:
                values["eta_s"] = eta
        self._last_step_end = now
        self._pending.append({"step": int(step), "wall_time": now,
                              "scalars": {k: encode_scalar(v) for k, v in values.items()}})
        if len(self._pending) >= self.flush_every:
            return self.flush()
        return None

    def eta_seconds(self, step: int) -> float | None:
        if not self.total_steps or not self._step_times:
            return None
        mean = sum(self._step_times) / len(self._step_times)
        return max(0, self.total_steps - step) * mean

    def flush(self) -> list[dict[str, Any]] | None:
        if not self._pending:
            return None
        batch, self._pending = self._pending, []
        return batch


def to_float(value: Any) -> float | None:
    """A python float from a python number, numpy scalar or MindSpore Tensor; None if not scalar."""
    if value is None:
        return None
    if isinstance(value, bool):
        return float(value)
    try:
        if hasattr(value, "asnumpy"):
            value = value.asnumpy()
        if hasattr(value, "size") and getattr(value, "size", 1) != 1:
            return None
        number = float(value.item() if hasattr(value, "item") else value)
    except (TypeError, ValueError):
        return None
    return number
