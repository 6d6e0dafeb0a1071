"""The early-stop policy: Lightning's EarlyStopping knobs, a reason for every call.

``observe(step, value, se)`` is called once per evaluation, in step order, and returns a
Verdict with its reason. ``min_delta`` is absolute (``0.01``) or in standard errors
(``MinDelta(2, "se")``: the value must beat the best by more than twice the SE of their
difference, from ``se`` and the best's SE); every "improved" and "no improvement" reason
states the values, their SEs and the threshold compared. When the caller has both steps'
per-document outputs (a suite metric, ``SUITE/TASK/METRIC``), it passes ``paired_se``, the SE of
the difference between this value and the best's, paired by document
(``decisions/paired.py``); with ``min_delta`` in SEs the threshold is then ``k * paired_se``,
and the reason says "paired". Its state (best value, SE and
step, evaluations without improvement) is a plain dict that evald commits with each
evaluation, so a restarted evald keeps counting. Bad arguments are rejected in ``__init__``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from evald.config.values import MinDelta
from evald.decisions.trend import better


@dataclass(frozen=True)
class Verdict:
    stop: bool
    improved: bool
    reason: str


class EarlyStopPolicy:
    def __init__(self, *, monitor: str = "eval/loss", mode: str = "min", patience: int | None = None,
                 min_delta: float | MinDelta = 0.0, stopping_threshold: float | None = None,
                 divergence_threshold: float | None = None, check_finite: bool = True) -> None:
        if not isinstance(min_delta, MinDelta):
            min_delta = MinDelta(float(min_delta))
        if mode not in ("min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', got {mode!r}")
        if patience is not None and patience < 1:
            raise ValueError(f"patience must be >= 1 (or None: never stop on patience), got {patience!r}")
        if not min_delta.amount >= 0:
            raise ValueError(f"min_delta must be >= 0, got {min_delta!r}")
        self.monitor, self.mode, self.patience, self.min_delta = monitor, mode, patience, min_delta
        self.stopping_threshold, self.divergence_threshold = stopping_threshold, divergence_threshold
        self.check_finite = check_finite
        self.best: float | None = None
        self.best_se: float | None = None
        self.best_step: int | None = None
        self.wait = 0
        self.last_step: int | None = None

    def observe(self, step: int, value: float, se: float | None = None,
                paired_se: float | None = None) -> Verdict:
        if self.last_step is not None and step <= self.last_step:
            return Verdict(False, False, f"step {step} already observed (last {self.last_step}); ignored")
        self.last_step = step
        name = self.monitor
        if not math.isfinite(value):
            if self.check_finite:
                return Verdict(True, False, f"{name} = {value} at step {step} is not finite")
            return Verdict(False, False, f"{name} = {value} at step {step} is not finite (check_finite off)")
        paired = (self.min_delta.unit == "se" and self.best is not None and paired_se is not None
                  and math.isfinite(paired_se))
        threshold = self.min_delta.amount * paired_se if paired else self.min_delta.threshold(se, self.best_se)
        delta = 0.0 if threshold is None else threshold
        improved = better(value, self.best, self.mode, delta)
        shown, by = _shown(value, se), self._by(threshold, paired)
        if improved:
            before = None if self.best is None else (
                f" (from {_shown(self.best, self.best_se)} at step {self.best_step}: by {abs(value - self.best):.6g}, "
                f"more than {by})")
            self.best, self.best_se, self.best_step, self.wait = value, se, step, 0
            reason = f"{name} improved to {shown} at step {step}" + (before or "")
        else:
            self.wait += 1
            reason = (f"{name} = {shown} at step {step}: no improvement over best {_shown(self.best, self.best_se)} "
                      f"(step {self.best_step}) by more than {by} for {self.wait} evaluation(s)")
        if self.stopping_threshold is not None and not better(self.stopping_threshold, value, self.mode):
            return Verdict(True, improved, f"{name} = {value:.6g} at step {step} reached the stopping "
                                           f"threshold {self.stopping_threshold:g}")
        if self.divergence_threshold is not None and not better(value, self.divergence_threshold, self.mode):
            return Verdict(True, improved, f"{name} = {value:.6g} at step {step} crossed the divergence "
                                           f"threshold {self.divergence_threshold:g}")
        if self.patience is not None and self.wait >= self.patience:
            return Verdict(True, improved, reason + f"; patience {self.patience} exhausted")
        return Verdict(False, improved, reason)

    def rebuild(self, values: list[tuple[int, float, float | None]]) -> None:
        """The best from the current results (step, value, se), in step order: after results were
        superseded, the best is never a superseded value (issue 18.2)."""
        self.best = self.best_se = self.best_step = self.last_step = None
        self.wait = 0
        for step, value, se in sorted(values):
            self.last_step = step
            if math.isfinite(value) and better(value, self.best, self.mode, 0.0):
                self.best, self.best_se, self.best_step, self.wait = value, se, step, 0
            else:
                self.wait += 1

    def _by(self, threshold: float | None, paired: bool = False) -> str:
        """How the threshold is shown: ``0.01``, ``2se = 0.0354``, ``2se paired = 0.021`` (and why it is
        0 without an SE)."""
        if self.min_delta.unit == "abs":
            return f"{self.min_delta.amount:g}"
        if threshold is None:
            return f"{self.min_delta} = 0 ({self.monitor} has no standard error here)"
        return f"{self.min_delta}{' paired' if paired else ''} = {threshold:.4g}"

    def state_dict(self) -> dict:
        # monitor and mode are recorded for readers of the ledger (evald status: which metric is best, and
        # which way); they come from the configuration, so they are not loaded back
        return {"best": self.best, "best_se": self.best_se, "best_step": self.best_step, "wait": self.wait,
                "last_step": self.last_step, "monitor": self.monitor, "mode": self.mode}

    def load_state_dict(self, state: dict) -> None:
        for key in ("best", "best_se", "best_step", "wait", "last_step"):
            if key in state:
                setattr(self, key, state[key])


def _shown(value: float, se: float | None) -> str:
    """``2.5`` or, with a standard error, ``2.5 ± 0.012``."""
    return f"{value:.6g}" if se is None or not math.isfinite(se) else f"{value:.6g} ± {se:.2g}"
