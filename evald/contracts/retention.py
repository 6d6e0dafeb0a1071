"""Retention leases: which snapshots the trainer may delete, as evald says on the control channel.

Part of the wire contract (docs/wire-protocol.md, "Leases"); shared by evald (evald.sinks.leases
builds the fields) and the trainer hook (trainer_hooks.retention honours them). The sticky
``control_state`` carries:

* ``leases``: steps evald still needs (queued or being evaluated), oldest first;
* ``released``: steps evald has finished with (evaluated, skipped, failed or deleted) whose
  ``step_N`` directory is still there, the best excepted, oldest first;
* ``best_step``: the best checkpoint so far, never to be deleted;
* ``lease_s``: for how long after the trainer heard this state it may rely on it.

The rule is ``may_delete``: only a released step that is not the best. A step evald has not
heard of yet is in neither list, so it is kept: a due checkpoint is never deleted before evald
has accounted for it. Each list holds at most ``MAX_STEP_LIST`` steps; what does not fit is
simply not listed, and so kept (safe, never lost).
"""

from __future__ import annotations

from typing import Any

from evald.contracts.wire_fields import fail, finite, preview, uint

MAX_STEP_LIST = 256
MAX_LEASE_S = 7 * 86400.0


def may_delete(state: Any, step: int) -> bool:
    """Whether the trainer may delete snapshot ``step`` under ``state`` (a ``wire.ControlState``)."""
    return step in state.released and step != state.best_step


def step_list(value: Any, where: str) -> tuple[int, ...]:
    """A JSON list of at most MAX_STEP_LIST steps; returned sorted, without repeats."""
    if not isinstance(value, list):
        fail(where, f"must be a list of steps, got {preview(value)}")
    if len(value) > MAX_STEP_LIST:
        fail(where, f"{len(value)} steps exceed the limit of {MAX_STEP_LIST}")
    return tuple(sorted({uint(step, f"{where}[{index}]") for index, step in enumerate(value)}))


def duration(value: Any, where: str) -> float:
    """A lease length in seconds: finite, > 0, at most MAX_LEASE_S."""
    seconds = finite(value, where)
    if not 0 < seconds <= MAX_LEASE_S:
        fail(where, f"must be in (0, {MAX_LEASE_S:g}] seconds, got {preview(value)}")
    return seconds
