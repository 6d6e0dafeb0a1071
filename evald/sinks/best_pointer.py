"""The best-checkpoint pointer: ``LOGDIR/best.json``, replaced atomically when the best changes.

``{"step", "dir", "monitor", "value", "updated_at"}``; ``dir`` is the entry of the
checkpoint directory the step was read from (a ``step_N`` directory or a foreign
file), for people and tools. The trainer hook does not read it: evald names the best
step on its control channel, with its retention leases (evald.sinks.leases), and the hook's
pruning never deletes it (docs/reliability.md, "Retention").
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from evald.contracts import layout
from evald.ledger.disk_full import DiskWait
from evald.sinks.sink import RunState

BEST_FILE = "best.json"


class BestPointer:
    """A sink (evald.sinks.sink): best.json, rewritten when the best step, its value or its entry changes
    (a better step, a re-evaluation that moved the best, a retry that rebuilt it), and at start."""

    name = "best pointer"

    def __init__(self, logdir: Path, disk: DiskWait) -> None:
        self.logdir, self.disk = Path(logdir), disk
        self._written: tuple | None = None

    def tick(self, state: RunState) -> None:
        best = state.decisions.best_step
        row = state.ledger.step(best) if best is not None else None
        if best is None or row is None:
            return
        wanted = (best, state.decisions.best_value, row.source, state.monitor)
        if wanted != self._written:
            step, source, value = best, row.source, state.decisions.best_value
            self.disk.retry(BEST_FILE, lambda: write_best_pointer(self.logdir, step, source, state.monitor, value))
            self._written = wanted

    def close(self) -> None:
        pass


def write_best_pointer(logdir: Path, step: int, source: str, monitor: str, value: float | None) -> None:
    layout.atomic_write_text(Path(logdir) / BEST_FILE, json.dumps({
        "step": int(step), "dir": source, "monitor": monitor, "value": value, "updated_at": time.time()}))
