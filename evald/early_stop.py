"""The early-stop policy: Lightning's and MindSpore's EarlyStopping knobs, a reason for every call.

``observe(step, value)`` is called once per evaluation, in step order. Its
state (best value and step, evaluations without improvement) is a plain dict
that evald persists in the ledger, so a restarted evald keeps counting.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Verdict:
    stop: bool
    improved: bool
    reason: str


class EarlyStopPolicy:
    def __init__(self, *, monitor: str = "eval/loss", mode: str = "min", patience: int | None = None,
                 min_delta: float = 0.0, baseline: float | None = None,
                 stopping_threshold: float | None = None, divergence_threshold: float | None = None,
                 check_finite: bool = True) -> None:
        if mode not in ("min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', got {mode!r}")
        self.monitor = monitor
        self.mode = mode
        self.patience = patience
        self.min_delta = abs(min_delta)
        self.baseline = baseline
        self.stopping_threshold = stopping_threshold
        self.divergence_threshold = divergence_threshold
        self.check_finite = check_finite
        self.best: float | None = None
        self.best_step: int | None = None
        self.wait = 0
        self.last_step: int | None = None
        self.stopped_at: int | None = None
        self.evaluations = 0

    def _better(self, value: float, reference: float, delta: float) -> bool:
        return value < reference - delta if self.mode == "min" else value > reference + delta

    def observe(self, step: int, value: float) -> Verdict:
        if self.last_step is not None and step <= self.last_step:
            return Verdict(False, False, f"step {step} already observed (last {self.last_step}); ignored")
        self.last_step = step
        self.evaluations += 1
        name = self.monitor
        if not math.isfinite(value):
            if self.check_finite:
                return self._stop(step, False, f"{name} = {value} at step {step} is not finite")
            return Verdict(False, False, f"{name} = {value} at step {step} is not finite (check_finite off)")
        improved = self.best is None or self._better(value, self.best, self.min_delta)
        if improved:
            previous = self.best
            self.best, self.best_step, self.wait = value, step, 0
            reason = (f"{name} improved to {value:.6g} at step {step}"
                      + (f" (from {previous:.6g})" if previous is not None else ""))
        else:
            self.wait += 1
            reason = (f"{name} = {value:.6g} at step {step}: no improvement over best {self.best:.6g} "
                      f"(step {self.best_step}) by more than {self.min_delta:g} for {self.wait} evaluation(s)")
        if self.stopping_threshold is not None and not self._better(self.stopping_threshold, value, 0.0):
            return self._stop(step, improved, f"{name} = {value:.6g} at step {step} reached the stopping "
                                              f"threshold {self.stopping_threshold:g}")
        if self.divergence_threshold is not None and not self._better(value, self.divergence_threshold, 0.0):
            return self._stop(step, improved, f"{name} = {value:.6g} at step {step} crossed the divergence "
                                              f"threshold {self.divergence_threshold:g}")
        if self.patience is not None and self.wait >= self.patience:
            return self._stop(step, improved, reason + f"; patience {self.patience} exhausted")
        needed = self.patience or 1
        if (self.baseline is not None and self.evaluations >= needed
                and not self._better(self.best, self.baseline, 0.0)):  # type: ignore[arg-type]
            return self._stop(step, improved, f"best {name} {self.best:.6g} is not better than baseline "
                                              f"{self.baseline:g} after {self.evaluations} evaluation(s)")
        return Verdict(False, improved, reason)

    def _stop(self, step: int, improved: bool, reason: str) -> Verdict:
        self.stopped_at = step
        return Verdict(True, improved, reason)

    def state_dict(self) -> dict:
        return {"best": self.best, "best_step": self.best_step, "wait": self.wait,
                "last_step": self.last_step, "stopped_at": self.stopped_at,
                "evaluations": self.evaluations}

    def load_state_dict(self, state: dict) -> None:
        for key in ("best", "best_step", "wait", "last_step", "stopped_at", "evaluations"):
            if key in state:
                setattr(self, key, state[key])
