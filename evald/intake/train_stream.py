"""Training-health scalars from the trainer: alerts, the train-loss trend, TensorBoard points.

Each ``train_metrics`` message becomes TensorBoard records (one per training step,
tags ``train/<name>``, alerts as ``health/<rule>`` texts in the same record) and the
health state that produced them, committed in one ledger transaction. A step at or
below the newest one already recorded for this run is dropped, so a duplicate or a
replay after a restart is never written twice. A step beyond ``max_step`` (the caller's
sane reach past the newest checkpoint on disk) is dropped and counted too: one forged
record at step 2**63-1 would otherwise silence every later record of the run.
"""

from __future__ import annotations

import logging
from typing import Any

from evald.contracts.wire import TrainMetrics, decode_scalar
from evald.decisions.decisions import Decisions
from evald.ledger.ledger import Ledger, Record

log = logging.getLogger("evald.train")


class TrainStream:
    def __init__(self, ledger: Ledger, decisions: Decisions) -> None:
        self.ledger = ledger
        self.decisions = decisions
        state = ledger.get_state("train_stream", {})
        self.run_id: str | None = state.get("run_id")
        self.last_step: int = int(state.get("last_step", -1))
        self.beyond_reach = 0  # records dropped for a step too far ahead

    def add(self, message: TrainMetrics, max_step: int | None = None) -> int | None:
        """Record a batch of training scalars; returns the newest step it held, if any."""
        if message.run_id != self.run_id:
            self.run_id, self.last_step = message.run_id, -1
        records = []
        for raw in message.records:
            step = int(raw["step"])
            if max_step is not None and step > max_step:
                self.beyond_reach += 1
                if self.beyond_reach & (self.beyond_reach - 1) == 0:  # 1st, 2nd, 4th, 8th...: a flood stays quiet
                    log.warning("dropped a training record at step %d: beyond step %d, far past the newest "
                                "checkpoint (%d dropped so far)", step, max_step, self.beyond_reach)
                continue
            if step <= self.last_step:
                continue
            scalars = {str(k): decode_scalar(v) for k, v in dict(raw.get("scalars") or {}).items()}
            scalars = {k: v for k, v in scalars.items() if v is not None}
            alerts = self.decisions.observe_train(step, scalars)
            records.append(Record("train", step, float(raw["wall_time"]),
                                  {f"train/{k}": v for k, v in scalars.items()}, alerts))
            self.last_step = step
        if not records:
            return None
        self.ledger.add_records(records, kv={"decisions": self.decisions.state_dict(),
                                             "train_stream": {"run_id": self.run_id, "last_step": self.last_step}})
        return self.last_step


def reach(newest_checkpoint_step: int, announcement: Any) -> int | None:
    """The highest training step believed: ``max(10 * every_n_steps, 1000)`` past the newest checkpoint on
    disk; None (no bound) when the run announced no interval (then no hook sends training scalars)."""
    every = getattr(announcement, "every_n_steps", None)
    return newest_checkpoint_step + max(10 * every, 1000) if every else None
