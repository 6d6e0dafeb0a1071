"""Opt-in: apply evald's learning-rate advice by scaling the optimizer's learning rate.

Off by default: evald only advises. To let it act::

    hook = EvaldHook(..., lr_advice_handler=ScaleLearningRate(optimizer, min_lr=1e-6, max_lr=1e-2))

Each piece of advice (``{"id", "kind", "scale", "reason"}``) is applied once.
Works when the optimizer's learning rate is a fixed value (a Parameter that
can be reassigned); with a schedule (a LearningRateSchedule cell) MindSpore
has no scalar to scale, so the advice is logged and not applied.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping

import numpy as np

log = logging.getLogger("trainer_hooks.lr_advice")


class ScaleLearningRate:
    """Applies evald's learning-rate advice by scaling the optimizer's learning rate (opt-in).

    Args:
        optimizer: a MindSpore optimizer whose ``learning_rate`` is a fixed value (a Parameter);
            with a schedule the advice is logged and not applied.
        min_lr: the learning rate is never scaled below this.
        max_lr: ... nor above this.

    Returns:
        Called with one piece of advice (``{"id", "kind", "scale", "reason"}``), it returns None;
        ``applied`` lists the advice it applied.

    Example::

        hook = EvaldHook("runs/exp1/ckpt", network=net, optimizer=opt,
                         lr_advice_handler=ScaleLearningRate(opt, min_lr=1e-6, max_lr=1e-2))
    """

    def __init__(self, optimizer: Any, *, min_lr: float = 0.0, max_lr: float = float("inf")) -> None:
        self.optimizer = optimizer
        self.min_lr = min_lr
        self.max_lr = max_lr
        self.applied: list[Mapping[str, Any]] = []

    def __call__(self, advice: Mapping[str, Any]) -> None:
        import mindspore as ms

        lr = getattr(self.optimizer, "learning_rate", None)
        if getattr(self.optimizer, "dynamic_lr", False) or not isinstance(lr, ms.Parameter):
            log.warning("learning-rate advice %r not applied: the optimizer uses a schedule", advice.get("kind"))
            return
        old = float(lr.asnumpy().reshape(-1)[0])
        new = float(np.clip(old * float(advice.get("scale", 1.0)), self.min_lr, self.max_lr))
        lr.set_data(ms.Tensor(np.array(new, dtype=lr.asnumpy().dtype).reshape(lr.shape)))
        self.applied.append(dict(advice))
        log.warning("learning rate %.3g -> %.3g on evald's advice: %s", old, new, advice.get("reason", ""))
