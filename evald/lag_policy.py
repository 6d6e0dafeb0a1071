"""What to evaluate when checkpoints arrive faster than they can be evaluated.

* ``all``: every checkpoint, oldest first (FIFO by step).
* ``latest``: the newest queued checkpoint; older queued ones are skipped.
* ``every-k``: every k-th checkpoint in step order (decided on arrival, so the
  choice does not depend on timing); the others are skipped.
The final checkpoint of a run is always evaluated. Every skip has a reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class Decision:
    evaluate: str | None                 # ledger key to evaluate next
    skip: tuple[tuple[str, str], ...]    # (key, reason)


def decide(policy: str, queued: Sequence[tuple[str, int]], *, final_step: int | None = None) -> Decision:
    """``queued`` is (key, step) pairs already admitted by ``admit``; pick one, skip some."""
    if not queued:
        return Decision(None, ())
    ordered = sorted(queued, key=lambda item: (item[1], item[0]))
    if policy == "latest":
        newest_key, newest_step = ordered[-1]
        skip = tuple((key, f"superseded by step {newest_step} (lag policy latest)")
                     for key, step in ordered[:-1] if step != final_step)
        return Decision(newest_key, skip)
    return Decision(ordered[0][0], ())


def admit(policy: str, every_k: int, ordinal: int, step: int, *, final_step: int | None = None
          ) -> str | None:
    """None to queue a newly seen checkpoint, else the reason to skip it at once.

    ``ordinal`` is its 0-based position among all checkpoints of the run by step.
    """
    if policy == "every-k" and step != final_step and ordinal % max(1, every_k) != every_k - 1:
        return f"lag policy every-k (k={every_k}): checkpoint #{ordinal + 1} is not a multiple of {every_k}"
    return None
