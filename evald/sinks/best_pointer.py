"""The best-checkpoint pointer: ``LOGDIR/best.json``, replaced atomically when the best changes.

``{"step", "dir", "monitor", "value", "updated_at"}``; ``dir`` is the entry of the
checkpoint directory the step was read from (a ``step_N`` directory or a foreign
file). The trainer hook's ``keep_last`` cleanup reads it so that it never deletes the
best checkpoint (docs/checkpoint-layout.md).
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
