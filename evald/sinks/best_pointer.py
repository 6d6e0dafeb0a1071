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

BEST_FILE = "best.json"


def write_best_pointer(logdir: Path, step: int, source: str, monitor: str, value: float | None) -> None:
    layout.atomic_write_text(Path(logdir) / BEST_FILE, json.dumps({
        "step": int(step), "dir": source, "monitor": monitor, "value": value, "updated_at": time.time()}))
