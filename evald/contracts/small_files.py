"""Reading the small files of the checkpoint layout (MANIFEST.json, RUN.json, RUN_END.json)
so that no file can make the reader hang, exhaust memory or read outside where it points.

Anyone who can write the checkpoint directory controls these files: one could be a FIFO
(``open`` blocks forever), a link to ``/dev/zero`` (``read`` never ends), a link to a file
outside the directory, or 100 GB. So the file is opened once, without following a link in
its last component and without blocking, examined with ``fstat`` on that same descriptor
(no check-then-open race), and read up to a bound. The ``stat`` of what was read is
returned, so a caller that decides whether to trust a file (evald.intake.trust) judges exactly
the bytes it got. The rule itself is evald.contracts.safe_open; this module holds the layout files'
bounds. Part of the layout contract; imports neither mindspore nor zmq.
"""

from __future__ import annotations

import os
from pathlib import Path

from evald.contracts.safe_open import UnsafeFile, hard_link_text, kind_of, read_beneath

__all__ = ["MAX_MANIFEST_BYTES", "MAX_RUN_FILE_BYTES", "UnsafeFile", "hard_link_text", "kind_of", "read_regular",
           "read_regular_text"]

MAX_MANIFEST_BYTES = 64 << 20   # ~400k parameters; a manifest is ~150 bytes per parameter
MAX_RUN_FILE_BYTES = 1 << 20    # RUN.json / RUN_END.json: one wire message (MAX_MESSAGE_BYTES)


def read_regular(path: Path, limit: int) -> tuple[bytes, os.stat_result]:
    """The bytes of ``path`` and the ``stat`` of the file they came from.

    FileNotFoundError when absent (callers decide what absence means); UnsafeFile for a
    link (symbolic or hard), anything but a regular file, or more than ``limit`` bytes; other OSErrors pass.
    The file is opened under the one rule (evald.contracts.safe_open) below its own directory.
    """
    path = Path(path)
    return read_beneath(path.parent, path.name, limit)


def read_regular_text(path: Path, limit: int) -> str:
    """``read_regular`` decoded as UTF-8 (UnicodeDecodeError is a ValueError)."""
    data, _ = read_regular(path, limit)
    return data.decode("utf-8")
