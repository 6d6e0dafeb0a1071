"""What to evaluate when checkpoints arrive faster than they can be evaluated.

* ``all``: every checkpoint, oldest first (FIFO by step).
* ``latest``: the newest queued checkpoint; older queued ones are skipped.
* ``every-k``: every k-th checkpoint in step order (decided on arrival, so the
  choice does not depend on timing); the others are skipped.
The final checkpoint of a run is always evaluated, and so are steps re-queued by
``evald retry`` (``keep``). Every skip has a reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Sequence


@dataclass(frozen=True)
class Decision:
    evaluate: int | None                 # step to evaluate next
    skip: tuple[tuple[int, str], ...]    # (step, reason)


def decide(policy: str, queued: Sequence[int], *, final_step: int | None = None,
           keep: Collection[int] = ()) -> Decision:
    """``queued`` are steps already admitted by ``admit``; pick one, skip some (never ``keep``)."""
    if not queued:
        return Decision(None, ())
    ordered = sorted(queued)
    if policy == "latest":
        newest = ordered[-1]
        skip = tuple((step, f"superseded by step {newest} (lag policy latest)")
                     for step in ordered[:-1] if step != final_step and step not in keep)
        return Decision(newest, skip)
    return Decision(ordered[0], ())


def admit(policy: str, every_k: int, ordinal: int, step: int, *, final_step: int | None = None) -> str | None:
    """None to queue a newly seen checkpoint, else the reason to skip it at once.

    ``ordinal`` is its 0-based position among all checkpoints of the run by step.
    """
    if policy == "every-k" and step != final_step and ordinal % every_k != every_k - 1:
        return f"not every-k: checkpoint #{ordinal + 1} is not a multiple of {every_k} (lag policy every-k)"
    return None
