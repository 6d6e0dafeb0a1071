"""Training-health alert rules: catch a run going bad while it is still cheap to stop it.

The monitor watches the scalars a trainer already logs (loss, gradient norm,
loss scale) and evald's own evaluation results, and raises an :class:`Alert`
when one of five rules starts to hold:

- ``grad_explosion``: gradient norm above ``grad_norm_explosion`` (or non-finite);
- ``grad_vanishing``: gradient norm below ``grad_norm_vanishing`` for
  ``vanishing_window`` consecutive train records that carry a gradient norm;
- ``nonfinite_loss``: train loss is NaN or inf;
- ``loss_scale_collapse``: loss scale at or below ``loss_scale_floor``, or below
  ``loss_scale_drop_factor`` times the largest scale seen (or non-finite);
- ``overfitting``: the eval metric got worse than the previous evaluation for
  ``overfit_window`` consecutive evaluations while the train loss kept falling.

Each rule fires once per *episode*: when its condition starts to hold. It can
fire again only after the condition has cleared, so a run stuck in a bad state
yields one alert, not one per step. The monitor logs each alert once as a
WARNING on the ``evald.decisions.health`` logger and returns it; the caller writes it to
TensorBoard as a text event (tag :attr:`Alert.tag`). The monitor does no I/O of
its own beyond that, so its state (:meth:`HealthMonitor.state_dict`) can be
persisted and restored across evald restarts without re-firing open episodes.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from evald.config.health_thresholds import HealthThresholds
from evald.decisions.trend import better

__all__ = ["RULES", "Alert", "HealthMonitor"]

logger = logging.getLogger(__name__)

RULES: tuple[str, ...] = (
    "grad_explosion",
    "grad_vanishing",
    "nonfinite_loss",
    "loss_scale_collapse",
    "overfitting",
)

_STATE_VERSION = 2


@dataclass
class Alert:
    """One rule firing at one step; ``message`` names the step, rule, value, threshold and a remedy."""

    rule: str
    step: int
    message: str

    @property
    def tag(self) -> str:
        """TensorBoard tag for the text event of this alert."""
        return f"health/{self.rule}"


def _fmt(x: float) -> str:
    return f"{x:.6g}"


class HealthMonitor:
    """Stateful evaluator of the health rules over a stream of train and eval records."""

    def __init__(self, thresholds: HealthThresholds | None = None, eval_mode: str = "min") -> None:
        if eval_mode not in ("min", "max"):
            raise ValueError(f"eval_mode must be 'min' or 'max', got {eval_mode!r}")
        self.thresholds = thresholds if thresholds is not None else HealthThresholds()
        self.eval_mode = eval_mode
        self._reset_state()

    def _reset_state(self) -> None:
        self._active: dict[str, bool] = {rule: False for rule in RULES}
        self._vanishing_streak = 0
        self._max_loss_scale: float | None = None
        self._last_eval: float | None = None
        self._overfit_streak = 0
        self._overfit_start_value: float | None = None

    @property
    def active_rules(self) -> list[str]:
        """Rules whose episode is currently open (condition holds, alert already sent)."""
        return [rule for rule in RULES if self._active[rule]]

    def _episode(self, rule: str, holds: bool, step: int, message: str) -> list[Alert]:
        """Open/close the rule's episode; return an alert only on the transition into it."""
        if not holds:
            self._active[rule] = False
            return []
        if self._active[rule]:
            return []
        self._active[rule] = True
        alert = Alert(rule=rule, step=int(step), message=f"step {int(step)}: {rule}: {message}")
        logger.warning("%s", alert.message)
        return [alert]

    def observe_train(self, step: int, scalars: Mapping[str, float]) -> list[Alert]:
        """Apply the train-side rules to one train record.

        Uses the keys ``loss``, ``grad_norm`` and ``loss_scale``; a missing key
        leaves that rule's state unchanged (a record without ``grad_norm``
        neither extends nor breaks a vanishing streak). Returns new alerts.
        """
        t = self.thresholds
        alerts: list[Alert] = []

        if scalars.get("loss") is not None:
            loss = float(scalars["loss"])
            finite = math.isfinite(loss)
            alerts += self._episode(
                "nonfinite_loss", not finite, step,
                f"train loss is {loss} (threshold: must be finite); the run has diverged or hit an overflow: "
                "restart from the last good checkpoint with a lower learning rate, and check the data and "
                "any log/div/sqrt in the loss for invalid inputs",
            )

        if scalars.get("grad_norm") is not None:
            gnorm = float(scalars["grad_norm"])
            finite = math.isfinite(gnorm)
            alerts += self._episode(
                "grad_explosion", (not finite) or gnorm > t.grad_norm_explosion, step,
                f"gradient norm {_fmt(gnorm)} is above the threshold {_fmt(t.grad_norm_explosion)}; "
                "lower the learning rate or enable gradient clipping (ops.clip_by_global_norm)",
            )
            if finite and gnorm < t.grad_norm_vanishing:
                self._vanishing_streak += 1
            else:
                self._vanishing_streak = 0
            alerts += self._episode(
                "grad_vanishing", self._vanishing_streak >= t.vanishing_window, step,
                f"gradient norm {_fmt(gnorm)} has stayed below the threshold {_fmt(t.grad_norm_vanishing)} "
                f"for {self._vanishing_streak} consecutive records (window {t.vanishing_window}); the model "
                "has stopped learning: check for dead activations, a learning-rate schedule that decayed "
                "to ~0, frozen parameters, or a loss that no longer depends on the weights",
            )

        if scalars.get("loss_scale") is not None:
            scale = float(scalars["loss_scale"])
            finite = math.isfinite(scale)
            if finite and scale > 0:
                self._max_loss_scale = scale if self._max_loss_scale is None else max(self._max_loss_scale, scale)
            peak = self._max_loss_scale
            below_floor = finite and scale <= t.loss_scale_floor
            dropped = finite and peak is not None and scale < t.loss_scale_drop_factor * peak
            if not finite:
                detail = f"loss scale is {scale} (threshold: must be finite)"
            elif below_floor:
                detail = f"loss scale {_fmt(scale)} is at or below the floor {_fmt(t.loss_scale_floor)}"
            else:
                detail = (
                    f"loss scale {_fmt(scale)} fell below {_fmt(t.loss_scale_drop_factor)} x its peak "
                    f"{_fmt(peak or 0.0)} (threshold {_fmt(t.loss_scale_drop_factor * (peak or 0.0))})"
                )
            alerts += self._episode(
                "loss_scale_collapse", (not finite) or below_floor or dropped, step,
                f"{detail}; gradients overflow on (almost) every step: lower the learning rate, check for "
                "inf/NaN-producing ops in fp16, or train the unstable parts in fp32",
            )
        return alerts

    def observe_eval(self, step: int, value: float, train_loss_trend: float | None) -> list[Alert]:
        """Apply the overfitting rule to one evaluation result.

        ``train_loss_trend`` is evald.decisions.trend.TrainLossTrend's change in train loss over the
        last eval interval (negative = still falling); None (unknown) counts as not falling.
        """
        t = self.thresholds
        trend = train_loss_trend
        value = float(value)
        if not math.isfinite(value):
            self._overfit_streak = 0
            return self._episode("overfitting", False, step, "")

        worse = self._last_eval is not None and better(self._last_eval, value, self.eval_mode)
        falling = trend is not None and math.isfinite(trend) and trend < 0
        if worse and falling:
            if self._overfit_streak == 0:
                self._overfit_start_value = self._last_eval
            self._overfit_streak += 1
        else:
            self._overfit_streak = 0
            self._overfit_start_value = None
        self._last_eval = value

        direction = "rose" if self.eval_mode == "min" else "fell"
        start = self._overfit_start_value
        return self._episode(
            "overfitting", self._overfit_streak >= t.overfit_window, step,
            f"eval metric {direction} from {_fmt(start if start is not None else value)} to {_fmt(value)} over "
            f"{self._overfit_streak} consecutive evaluations (threshold {t.overfit_window}, eval_mode "
            f"'{self.eval_mode}') while train loss kept falling (trend {_fmt(trend if trend is not None else 0.0)} "
            "per eval interval); keep the best checkpoint and consider stopping early, adding regularisation "
            "(dropout, weight decay) or more data",
        )

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume the rules exactly, as a JSON-able dict (no NaN/inf)."""
        return {
            "version": _STATE_VERSION,
            "active": dict(self._active),
            "vanishing_streak": self._vanishing_streak,
            "max_loss_scale": self._max_loss_scale,
            "last_eval": self._last_eval,
            "overfit_streak": self._overfit_streak,
            "overfit_start_value": self._overfit_start_value,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a :meth:`state_dict`; open episodes stay open, so a restart does not re-alert.

        Thresholds are not part of the state: they come from the current config.
        """
        version = state.get("version")
        if version != _STATE_VERSION:
            raise ValueError(
                f"health monitor state has version {version!r}, this evald reads version {_STATE_VERSION}; "
                "delete the saved state to start the health rules afresh"
            )
        expected = set(self.state_dict())
        missing = expected - set(state)
        if missing:
            raise ValueError(f"health monitor state is missing keys {sorted(missing)}; it is corrupt or truncated")
        self._reset_state()
        active = state["active"]
        for rule in RULES:
            self._active[rule] = bool(active.get(rule, False))
        self._vanishing_streak = int(state["vanishing_streak"])
        self._max_loss_scale = None if state["max_loss_scale"] is None else float(state["max_loss_scale"])
        self._last_eval = None if state["last_eval"] is None else float(state["last_eval"])
        self._overfit_streak = int(state["overfit_streak"])
        start = state["overfit_start_value"]
        self._overfit_start_value = None if start is None else float(start)
