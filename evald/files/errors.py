"""Why a checkpoint cannot be evaluated: the exceptions every stage raises and the ledger records.

Imports nothing of evald: every other module of evald.files, the pipeline and the intake use these.
"""

from __future__ import annotations


class CheckpointError(RuntimeError):
    """A checkpoint cannot be evaluated; the message says why and is recorded in the ledger."""


class CheckpointDeleted(CheckpointError):
    """The checkpoint disappeared (the trainer's cleanup, a user) before evald could read it."""


class CheckpointUnreadable(CheckpointError):
    """evald's user may not read it: a permission problem, not a bad file (evald.files.access)."""
