"""What evald still needs from the checkpoint directory, published so that the trainer's pruning keeps it.

The trainer hook deletes old snapshots to stay within its budget (``keep_last``, ``max_bytes``).
evald says, in the sticky ``control_state`` it already publishes (evald.contracts.retention,
docs/wire-protocol.md "Leases"), which steps it still needs (``leases``: queued or being
evaluated, or with a benchmark suite's cell queued: evald.daemon.suite_turn) and which it has finished with (``released``: evaluated, skipped, failed or deleted,
whose ``step_N`` directory, or a part of a partitioned step, is still there, the best excepted). The hook deletes only released
steps, so a step evald has not heard of is kept too.

Under ``--lag-policy latest`` a queued step older than the newest queued one will be skipped
as superseded at the next pick whatever happens (unless it is the run's final step or was
re-queued by ``evald retry``), so it is released at once: the budget is not spent on it.

The state is re-published every ``REFRESH_S`` with fresh leases (and, by the server, between
the batches of an evaluation), so the lease stays alive while evald works, and stops being
renewed if evald dies or hangs: the hook then falls back to its own budget after ``lease_s``.
``lease_s`` is ``tuning.lease_s``, raised to three times the longest checkpoint load seen
(a load renews nothing until it ends).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

from evald.contracts import layout
from evald.contracts.partition import parse_group_name, source_left
from evald.contracts.retention import MAX_STEP_LIST
from evald.contracts.wire import ControlState
from evald.ledger.ledger import EVALUATING, QUEUED, Ledger
from evald.ledger.requeue import RETRY

REFRESH_S = 1.0


def _prunable(source: str) -> bool:
    """A snapshot the trainer hook prunes: evald's step directory, or a partitioned step's parts (each writer
    rank deletes its own once released)."""
    return layout.parse_step_dir_name(source) is not None or parse_group_name(source) is not None


class Leases:
    def __init__(self, ckpt_dir: Path, ledger: Ledger, lease_s: float) -> None:
        self.ckpt_dir, self.ledger, self.lease_s = Path(ckpt_dir), ledger, lease_s
        self.longest_load_s = 0.0
        self._gone: set[int] = set()   # final steps whose directory is gone: never looked at again
        self._refreshed = 0.0

    def due(self) -> bool:
        """Time to publish fresh leases (every REFRESH_S)."""
        return time.monotonic() - self._refreshed >= REFRESH_S

    def control_state(self, state: ControlState | None, *, run_id: str | None, seq: int, lag_policy: str,
                      final_step: int | None, best_step: int | None) -> ControlState | None:
        """``state`` (the decisions' sticky state, None before any decision) with the retention fields."""
        if state is None:
            if run_id is None:
                return None
            state = ControlState(run_id=run_id, seq=seq)
        self._refreshed = time.monotonic()
        return dataclasses.replace(state, **self.fields(lag_policy=lag_policy, final_step=final_step,
                                                        best_step=best_step))

    def fields(self, *, lag_policy: str, final_step: int | None, best_step: int | None) -> dict[str, Any]:
        waiting = self.ledger.steps(QUEUED, EVALUATING)
        will_skip = set()
        queued = [row for row in waiting if row.state == QUEUED]
        if lag_policy == "latest" and queued:
            newest = max(row.step for row in queued)
            will_skip = {row.step for row in queued
                         if row.step < newest and row.step != final_step and row.found_via != RETRY}
        leases = [row.step for row in waiting if row.step not in will_skip]
        cells = {c.step for c in self.ledger.cells(QUEUED, EVALUATING)} - set(leases)  # benchmark cells waiting
        leases = sorted(set(leases) | cells)
        needed = set(leases)
        released = []
        for step, source in self.ledger.step_sources():
            if len(released) >= MAX_STEP_LIST:
                break
            if step in needed or step == best_step or step in self._gone:
                continue
            if _prunable(source) and source_left(self.ckpt_dir, source):
                released.append(step)
            else:
                self._gone.add(step)  # done with, and gone or not the hook's to prune (a foreign file): never again
        return {"leases": tuple(leases[:MAX_STEP_LIST]), "released": tuple(released), "best_step": best_step,
                "lease_s": max(self.lease_s, 3.0 * self.longest_load_s)}
