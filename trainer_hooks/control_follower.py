"""Following evald's control state on every rank: the agreed stop, and learning-rate advice.

Rank 0 subscribes to evald's control channel; every rank takes part in the small
all-reduce of trainer_hooks.stop_agreement at the same steps, so that all of them stop
at one step. Learning-rate advice arrives on rank 0 with the same state and is handed to
the user's handler once per advice. Nothing here raises into the training loop.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Mapping

from evald.contracts.auth import SecurityConfig
from trainer_hooks.stop_agreement import ControlSubscriber, ReduceSum, StopAgreement, mindspore_reduce_sum

log = logging.getLogger("trainer_hooks")


class ControlFollower:
    """``should_stop(step)`` on every rank at every step; errors are counted in ``errors``, never raised."""

    def __init__(self, *, rank: int, world_size: int, control_endpoint: str, run_id: str, agree_every: int,
                 reduce_sum: ReduceSum | None, security: SecurityConfig,
                 lr_advice_handler: Callable[[Mapping[str, Any]], None] | None) -> None:
        self.lr_advice_handler = lr_advice_handler
        self.errors = 0
        self.stop_reason = ""
        self._last_lr_advice_id = -1
        self.agreement: StopAgreement | None = None
        if world_size > 1 and reduce_sum is None:
            reduce_sum = mindspore_reduce_sum()
        if world_size > 1 and reduce_sum is None:
            log.warning("world size %d but mindspore.communication is not initialised: early stop disabled "
                        "(ranks could not agree on a step)", world_size)
            return
        subscriber = ControlSubscriber(control_endpoint, run_id, security) if rank == 0 else None
        self.agreement = StopAgreement(rank=rank, world_size=world_size, agree_every=agree_every,
                                       subscriber=subscriber, reduce_sum=reduce_sum)

    def should_stop(self, step: int) -> bool:
        """The collective every rank runs at every step: True when all ranks agreed to stop now."""
        if self.agreement is None:
            return False
        try:
            stop = self.agreement.should_stop(step)
        except Exception:
            self.errors += 1
            log.exception("evald stop agreement failed at step %d (ignored; training continues)", step)
            return False
        if self.agreement.subscriber is not None:
            try:
                self._apply_lr_advice()
            except Exception:
                self.errors += 1
                log.exception("evald learning-rate advice failed at step %d (ignored)", step)
        if stop:
            self.stop_reason = self.agreement.reason
            log.warning("evald asked to stop training: stopping at step %d (%s)", step, self.stop_reason)
        return stop

    def _apply_lr_advice(self) -> None:
        if self.lr_advice_handler is None or self.agreement is None or self.agreement.subscriber is None:
            return
        state = self.agreement.subscriber.latest
        if state is None or not state.lr_advice or state.seq <= self._last_lr_advice_id:
            return
        advice_id = int(state.lr_advice.get("id", state.seq))
        if advice_id <= self._last_lr_advice_id:
            return
        self._last_lr_advice_id = advice_id
        try:
            self.lr_advice_handler(state.lr_advice)
        except Exception:
            self.errors += 1
            log.exception("learning-rate advice handler failed; advice ignored")

    @property
    def ignored_messages(self) -> int:
        return self.agreement.subscriber.ignored if self.agreement and self.agreement.subscriber else 0

    def close(self) -> None:
        if self.agreement is not None:
            self.agreement.close()
