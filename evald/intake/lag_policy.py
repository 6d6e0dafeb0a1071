"""What to evaluate when checkpoints arrive faster than they can be evaluated.

* ``all``: every checkpoint, oldest first (FIFO by step).
* ``latest``: the newest queued checkpoint; older queued ones are skipped.
* ``every-k``: every k-th checkpoint in step order (decided on arrival, so the
  choice does not depend on timing); the others are skipped.
The final checkpoint of a run is always evaluated, and so are steps re-queued by
``evald retry`` (``keep``). Every skip has a reason.

The policy judges from the moment evald could first evaluate (``CatchUp``): the
checkpoints committed while its network was being built (factories learnt from the
run announcement take a build of tens of seconds) are not lag. They, and what arrives
while they are evaluated, are evaluated oldest first, none skipped, until evald has
caught up; if the queue instead grows beyond that first backlog, evaluation does not
keep up and the policy applies from then on.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Collection, Sequence

log = logging.getLogger("evald")


@dataclass(frozen=True)
class Decision:
    evaluate: int | None                 # step to evaluate next
    skip: tuple[tuple[int, str], ...]    # (step, reason)


def decide(policy: str, queued: Sequence[int], *, final_step: int | None = None,
           keep: Collection[int] = (), catch_up: Collection[int] = ()) -> Decision:
    """``queued`` are steps already admitted by ``admit``; pick one, skip some (never ``keep``).

    ``catch_up`` (``CatchUp.protect``) are evaluated first, oldest first, and never skipped.
    """
    if not queued:
        return Decision(None, ())
    ordered = sorted(queued)
    if policy == "latest":
        newest = ordered[-1]
        skip = tuple((step, f"superseded by step {newest} (lag policy latest)")
                     for step in ordered[:-1] if step != final_step and step not in keep and step not in catch_up)
        first = [step for step in ordered if step in catch_up]
        return Decision(first[0] if first else newest, skip)
    return Decision(ordered[0], ())


@dataclass
class CatchUp:
    """The backlog evald finds when it can first evaluate, which is the build's delay, not lag.

    ``started_at`` is evald's start (wall clock): a checkpoint committed before it was
    already late, and the policy judges it as usual. At the first pick the backlog is
    every other queued step (a foreign file's commit time is unknown: it counts as
    backlog); ``limit`` is its size. Until the catch-up is ``over`` every such queued
    step is protected. It is over when a pick finds at most one such step (caught up),
    or more than ``limit`` (evaluation does not keep up: the policy applies).
    """

    started_at: float
    limit: int | None = None
    over: bool = False

    def protect(self, queued: Sequence[tuple[int, float | None]]) -> frozenset[int]:
        """The steps of ``queued`` (``(step, commit_time)``) the lag policy must not skip at this pick."""
        if self.over:
            return frozenset()
        backlog = frozenset(step for step, commit_time in queued
                            if commit_time is None or commit_time >= self.started_at)
        if self.limit is None:
            self.limit = len(backlog)
        if len(backlog) <= 1:
            self.over = True  # caught up (or nothing piled up): nothing to protect
            return frozenset()
        if len(backlog) > self.limit:
            self.over = True
            log.info("evaluation does not keep up with the checkpoints (%d queued, %d when evald could first "
                     "evaluate): the lag policy applies from now on", len(backlog), self.limit)
            return frozenset()
        return backlog


def admit(policy: str, every_k: int, ordinal: int, step: int, *, final_step: int | None = None) -> str | None:
    """None to queue a newly seen checkpoint, else the reason to skip it at once.

    ``ordinal`` is its 0-based position among all checkpoints of the run by step.
    """
    if policy == "every-k" and step != final_step and ordinal % every_k != every_k - 1:
        return f"not every-k: checkpoint #{ordinal + 1} is not a multiple of {every_k} (lag policy every-k)"
    return None
