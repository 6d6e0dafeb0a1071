"""Reading a foreign checkpoint file (MindSpore's ``.ckpt`` or ``.safetensors``) into host arrays, safely.

MindSpore's own loader reads it; before that, the file must be a regular file of the
checkpoint directory that evald's user may read, of a sane size (evald.files.confine), and it
must still be the same file after the read. Imports only evald.files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np

from evald.files.access import Unreadable, check_readable
from evald.files.confine import confined, foreign_limit
from evald.files.errors import CheckpointError, CheckpointUnreadable


def load_foreign(path: Path, choice: Callable[[str], bool] | None = None, network_bytes: int | None = None
                 ) -> dict[str, np.ndarray]:
    """A foreign file read by MindSpore: only a regular file of the directory (no link, FIFO, device),
    of a sane size (evald.files.confine.foreign_limit), and still the same file after the read."""
    import mindspore as ms

    fmt = "safetensors" if path.suffix == ".safetensors" else "ckpt"
    try:  # before MindSpore, whose message for it ("May not have permission") ends in "corrupt" here
        check_readable(path)
    except Unreadable as exc:
        raise CheckpointUnreadable(str(exc)) from exc
    with confined(path.parent, path.name, directory=False, limit=foreign_limit(network_bytes)):
        try:
            params = ms.load_checkpoint(str(path), format=fmt, choice_func=choice)
        except (ValueError, RuntimeError, OSError) as exc:
            raise CheckpointError(f"{path.name}: MindSpore cannot read it ({str(exc).splitlines()[0][:300]}); "
                                  f"truncated, empty or corrupt") from exc
        return {name: p.asnumpy() for name, p in params.items() if hasattr(p, "asnumpy")}  # not str entries
