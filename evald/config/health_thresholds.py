"""The thresholds of the training-health rules and of the learning-rate advice ([health] table).

Kept apart from the rules (evald/health.py) so that configuration can validate them
without importing the rules.
"""

from __future__ import annotations

from dataclasses import dataclass

from evald.config.schema import opt


@dataclass(frozen=True)
class HealthThresholds:
    grad_norm_explosion: float = opt(1e5, "gradient norm above this (or non-finite) is an explosion",
                                     kind="float", min=0.0, min_exclusive=True)
    grad_norm_vanishing: float = opt(1e-3, "gradient norm below this for vanishing_window records is vanishing",
                                     kind="float", min=0.0)
    vanishing_window: int = opt(20, "consecutive train records below grad_norm_vanishing", kind="int", min=1)
    loss_scale_floor: float = opt(1.0, "a loss scale at or below this has collapsed", kind="float", min=0.0)
    loss_scale_drop_factor: float = opt(1e-3, "a loss scale below this times its peak has collapsed",
                                        kind="float", min=0.0, max=1.0)
    overfit_window: int = opt(3, "evaluations in a row that got worse while the train loss fell",
                              kind="int", min=1)
    advice_window: int = opt(3, "evaluations without improvement before learning-rate advice; 0 = no advice",
                             kind="int", min=0)

    def __post_init__(self) -> None:
        if not self.grad_norm_vanishing < self.grad_norm_explosion:
            raise ValueError(f"grad_norm_vanishing ({self.grad_norm_vanishing:g}) must be below "
                             f"grad_norm_explosion ({self.grad_norm_explosion:g})")
        if self.loss_scale_drop_factor >= 1.0:
            raise ValueError(f"loss_scale_drop_factor must be below 1, got {self.loss_scale_drop_factor:g}")
