"""Option values with structure of their own: the device list and early stopping's minimum change."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceSpec:
    """``--device 7``, ``--device GPU:7`` or ``--device 4,5,6,7``: a backend and device ids."""

    target: str
    ids: tuple[int, ...]

    def __str__(self) -> str:
        ids = ",".join(str(i) for i in self.ids)
        return ids if self.target == "auto" else f"{self.target}:{ids}"


DEVICE_TARGETS = ("auto", "Ascend", "GPU", "CPU")


@dataclass(frozen=True)
class MinDelta:
    """``--min-delta``: an absolute change of the monitored metric (``0.01``), or a number of its
    standard errors on the fixed subset (``2se``, docs/early-stopping.md)."""

    amount: float = 0.0
    unit: str = "abs"  # "abs" or "se"

    def __str__(self) -> str:
        return f"{self.amount:g}se" if self.unit == "se" else f"{self.amount:g}"

    def threshold(self, se_value: float | None, se_reference: float | None) -> float | None:
        """The change that must be beaten, in the metric's units; None when it needs a missing SE.

        In SE units it is ``amount * sqrt(se_value**2 + se_reference**2)``, the SE of the difference
        of two independent estimates (``se_value`` alone when the reference has none)."""
        if self.unit == "abs":
            return self.amount
        if se_value is None or not math.isfinite(se_value):
            return None
        reference = se_reference if se_reference is not None and math.isfinite(se_reference) else 0.0
        return self.amount * math.hypot(se_value, reference)
