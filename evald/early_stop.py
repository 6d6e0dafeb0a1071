"""The early-stop policy: Lightning's EarlyStopping knobs, a reason for every call.

``observe(step, value)`` is called once per evaluation, in step order, and returns a
Verdict with its reason. Its state (best value and step, evaluations without
improvement) is a plain dict that evald commits with each evaluation, so a restarted
evald keeps counting. Bad arguments are rejected here, in ``__init__``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from evald.trend import better


@dataclass(frozen=True)
class Verdict:
    stop: bool
    improved: bool
    reason: str


class EarlyStopPolicy:
    def __init__(self, *, monitor: str = "eval/loss", mode: str = "min", patience: int | None = None,
                 min_delta: float = 0.0, stopping_threshold: float | None = None,
                 divergence_threshold: float | None = None, check_finite: bool = True) -> None:
        if mode not in ("min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', got {mode!r}")
        if patience is not None and patience < 1:
            raise ValueError(f"patience must be >= 1 (or None: never stop on patience), got {patience!r}")
        if min_delta < 0:
            raise ValueError(f"min_delta must be >= 0, got {min_delta!r}")
        self.monitor, self.mode, self.patience, self.min_delta = monitor, mode, patience, min_delta
        self.stopping_threshold, self.divergence_threshold = stopping_threshold, divergence_threshold
        self.check_finite = check_finite
        self.best: float | None = None
        self.best_step: int | None = None
        self.wait = 0
        self.last_step: int | None = None

    def observe(self, step: int, value: float) -> Verdict:
        if self.last_step is not None and step <= self.last_step:
            return Verdict(False, False, f"step {step} already observed (last {self.last_step}); ignored")
        self.last_step = step
        name = self.monitor
        if not math.isfinite(value):
            if self.check_finite:
                return Verdict(True, False, f"{name} = {value} at step {step} is not finite")
            return Verdict(False, False, f"{name} = {value} at step {step} is not finite (check_finite off)")
        improved = better(value, self.best, self.mode, self.min_delta)
        if improved:
            previous = self.best
            self.best, self.best_step, self.wait = value, step, 0
            reason = (f"{name} improved to {value:.6g} at step {step}"
                      + (f" (from {previous:.6g})" if previous is not None else ""))
        else:
            self.wait += 1
            reason = (f"{name} = {value:.6g} at step {step}: no improvement over best {self.best:.6g} "
                      f"(step {self.best_step}) by more than {self.min_delta:g} for {self.wait} evaluation(s)")
        if self.stopping_threshold is not None and not better(self.stopping_threshold, value, self.mode):
            return Verdict(True, improved, f"{name} = {value:.6g} at step {step} reached the stopping "
                                           f"threshold {self.stopping_threshold:g}")
        if self.divergence_threshold is not None and not better(value, self.divergence_threshold, self.mode):
            return Verdict(True, improved, f"{name} = {value:.6g} at step {step} crossed the divergence "
                                           f"threshold {self.divergence_threshold:g}")
        if self.patience is not None and self.wait >= self.patience:
            return Verdict(True, improved, reason + f"; patience {self.patience} exhausted")
        return Verdict(False, improved, reason)

    def state_dict(self) -> dict:
        return {"best": self.best, "best_step": self.best_step, "wait": self.wait, "last_step": self.last_step}

    def load_state_dict(self, state: dict) -> None:
        for key in ("best", "best_step", "wait", "last_step"):
            if key in state:
                setattr(self, key, state[key])
