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


class CheckpointFileBad(CheckpointError):
    """A file of the checkpoint is bad: its digest, size or header is not what the manifest says, or it is
    not a regular file (a FIFO, a link, a device). A fact about the file, the same for every reader of a
    shared filesystem: an eval group records it as failed whichever rank found it (docs/eval-group.md)."""
