"""Learning-rate advice from the seed article's rules (section 2.4).

* the eval metric stalls while the train loss still falls -> overfitting: lower the
  learning rate or start the decay early (advice: scale 0.5);
* both stall -> plateau: raise the learning rate or reset the optimizer state
  (advice: scale 2.0).
"Stalls" means no improvement of the eval metric for ``window`` evaluations (by more than
``min_delta``, absolute or in standard errors as for early stopping); the
train loss "falls" when evald.decisions.trend.TrainLossTrend is negative. Each piece of advice
is given once per episode and has an increasing id, so a trainer that applies it
(opt-in) applies it once.
"""

from __future__ import annotations

from typing import Any

from evald.config.values import MinDelta
from evald.decisions.trend import better


class LRAdvisor:
    def __init__(self, *, mode: str = "min", window: int = 3, min_delta: float | MinDelta = 0.0) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window!r}")
        self.mode = mode
        self.window = window
        self.min_delta = min_delta if isinstance(min_delta, MinDelta) else MinDelta(float(min_delta))
        self.best: float | None = None
        self.best_se: float | None = None
        self.stalled = 0
        self.active: str | None = None
        self.next_id = 1

    def observe(self, step: int, eval_value: float, train_loss_trend: float | None,
                se: float | None = None) -> dict[str, Any] | None:
        """Advice dict when a new episode starts, else None. ``train_loss_trend`` < 0 means falling."""
        if better(eval_value, self.best, self.mode, self.min_delta.threshold(se, self.best_se) or 0.0):
            self.best, self.best_se, self.stalled, self.active = eval_value, se, 0, None
            return None
        self.stalled += 1
        if self.stalled < self.window:
            return None
        kind = "overfitting" if train_loss_trend is not None and train_loss_trend < 0 else "plateau"
        if kind == self.active:
            return None
        self.active = kind
        advice = {
            "id": self.next_id, "step": step, "kind": kind, "scale": 0.5 if kind == "overfitting" else 2.0,
            "reason": (f"eval metric has not improved for {self.stalled} evaluations while the train loss "
                       f"still falls: overfitting; lower the learning rate or start the decay early"
                       if kind == "overfitting" else
                       f"eval metric and train loss both stalled for {self.stalled} evaluations: plateau; "
                       f"raise the learning rate or reset the optimizer state"),
        }
        self.next_id += 1
        return advice

    def state_dict(self) -> dict:
        return {"best": self.best, "best_se": self.best_se, "stalled": self.stalled, "active": self.active,
                "next_id": self.next_id}

    def load_state_dict(self, state: dict) -> None:
        for key in ("best", "best_se", "stalled", "active", "next_id"):
            if key in state:
                setattr(self, key, state[key])
