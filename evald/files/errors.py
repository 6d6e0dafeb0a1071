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
    """What a file of the checkpoint holds is refused: its digest, size or header is not what the manifest
    says, it is not a regular file (a FIFO, a link, a device), or its values cannot go into the network's
    dtype unchanged. A fact about the file, the same for every reader of a shared filesystem, even when
    only one rank of an eval group reads that file or that slice: the group records it as failed whichever
    rank found it (docs/eval-group.md)."""
