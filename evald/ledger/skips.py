"""What happened to a committed checkpoint that was not evaluated, told at its own step.

Every committed checkpoint gets exactly one of two things in TensorBoard, at the
checkpoint's own training step: its evaluation (``eval/*``), or ONE text under
``evald/skipped`` whose first words say why (docs/reliability.md, "Every step
accounted for"):

==========================  ==========================================================
``superseded``              lag policy ``latest``: a newer checkpoint was evaluated instead
``not every-k``             lag policy ``every-k``: not one of every k-th checkpoint
``deleted before evaluation``  the checkpoint disappeared before evald read it (the
                            trainer's own pruning: ``keep_checkpoint_max``,
                            ``save_total_limit``, ``keep_last`` without evald; or by hand)
``failed``                  it could not be evaluated; the reason follows
``incomplete parts``        reserved: a partitioned checkpoint whose parts never all
                            arrived (issue 9, multi-rank snapshots) uses this category
==========================  ==========================================================

The ledger keeps the finer state (``skipped``, ``failed``, ``deleted``) and the same
reason; the skip record also carries ``evald/lag_steps`` and ``evald/lag_s`` as they
were when the decision was made, so the lag is drawn at the step it describes.
"""

from __future__ import annotations

from typing import Mapping

TAG = "evald/skipped"
SUPERSEDED = "superseded"
NOT_EVERY_K = "not every-k"
DELETED = "deleted before evaluation"
FAILED = "failed"
INCOMPLETE = "incomplete parts"  # for partitioned checkpoints (h8): a step whose parts never all arrived
CATEGORIES = (SUPERSEDED, NOT_EVERY_K, DELETED, FAILED, INCOMPLETE)
_BY_STATE = {"failed": FAILED, "deleted": DELETED}


def text(category: str, detail: str) -> str:
    """``"<category>: <detail>"``; a detail that already starts with the category is kept as is."""
    assert category in CATEGORIES, category
    return detail if detail.startswith(category) else f"{category}: {detail}"


def for_state(state: str, source: str, reason: str) -> str:
    """The text of a step that ended ``failed`` or ``deleted``, naming the file it was read from."""
    detail = reason if reason.startswith(source) else f"{source}: {reason}"
    return text(_BY_STATE[state], detail)


def category(skip_text: str) -> str | None:
    """The category a skip text starts with (None for a text from before evald 0.2)."""
    return next((c for c in CATEGORIES if skip_text.startswith(c)), None)


def lag_scalars(step: int, newest_step: int | None, commit_time: float | None, now: float) -> Mapping[str, float]:
    """``evald/lag_steps`` and ``evald/lag_s`` of a step at the moment evald decided about it."""
    scalars = {"evald/lag_steps": float(max(0, (newest_step or step) - step))}
    if commit_time is not None:
        scalars["evald/lag_s"] = max(0.0, now - commit_time)
    return scalars
