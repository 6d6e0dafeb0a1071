"""Every read evald makes for a checkpoint stays inside the checkpoint directory.

Whoever can write the checkpoint directory can put a link there, a FIFO, a device,
a 1 TB sparse file, or swap a checked entry for a link between the check and the
read. So, around every read of a checkpoint (docs/security.md):

* before: the entry is examined with ``lstat``: a plain name of the directory, not a
  link, a directory (evald layout) or a regular file (foreign) of a sane size with one
  link only (a hard link's other name may be outside the directory; no writer makes one);
* the files inside an evald checkpoint are opened without following links and
  without blocking, and must be regular files of their declared size
  (evald.contracts.safetensors_io, evald.contracts.small_files);
* after: the entry must still be the same inode. If it was replaced while it was
  read, whatever was read (and any error naming sizes or hashes of what it led to)
  is thrown away, and the checkpoint fails with a reason that names nothing beyond it.

MindSpore's ``load_checkpoint`` opens foreign files by name (after ``realpath``), so for
them the before/after check is what keeps a swap from mattering.
"""

from __future__ import annotations

import os
import stat
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from evald.contracts.small_files import hard_link_text, kind_of
from evald.files.errors import CheckpointDeleted, CheckpointError

FOREIGN_FACTOR = 16            # weights + optimizer moments + fp32 master copies, with room to spare
FOREIGN_SLACK = 64 << 20


def foreign_limit(network_bytes: int | None = None) -> int:
    """The largest foreign file evald reads: half the host's memory (MindSpore reads a .ckpt whole),
    and, once the network is known, at most ``FOREIGN_FACTOR`` times its weights."""
    limit = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
    if network_bytes:
        limit = min(limit, FOREIGN_FACTOR * network_bytes + FOREIGN_SLACK)
    return limit


def examine(ckpt_dir: Path, name: str, *, directory: bool, limit: int | None = None) -> os.stat_result:
    """``lstat`` of entry ``name``; CheckpointError unless it is what a checkpoint may be."""
    if not name or "/" in name or name in (".", ".."):
        raise CheckpointError(f"{name!r} is not an entry name of the checkpoint directory; not read")
    try:
        info = os.lstat(Path(ckpt_dir) / name)
    except FileNotFoundError:
        raise CheckpointDeleted(f"{name}: deleted before it could be evaluated") from None
    except OSError as exc:
        raise CheckpointError(f"{name}: cannot be examined ({exc.strerror})") from None
    if stat.S_ISLNK(info.st_mode):
        raise CheckpointError(f"{name}: a symbolic link; only entries of the checkpoint directory itself are read")
    wanted, what = (stat.S_ISDIR, "a directory") if directory else (stat.S_ISREG, "a regular file")
    if not wanted(info.st_mode):
        raise CheckpointError(f"{name}: {kind_of(info.st_mode)}, not {what}; not read")
    if not directory and info.st_nlink > 1:  # MindSpore's writers rename a temp file: never a hard link
        raise CheckpointError(f"{name}: {hard_link_text(info)}")
    if limit is not None and info.st_size > limit:
        raise CheckpointError(f"{name}: {info.st_size} bytes, more than the {limit} evald reads for a "
                              f"checkpoint of this network (a sparse or runaway file?); not read")
    return info


@contextmanager
def confined(ckpt_dir: Path, name: str, *, directory: bool, limit: int | None = None
             ) -> Iterator[os.stat_result]:
    """Examine entry ``name``, run the body (the read), and make sure it was not swapped meanwhile."""
    before = examine(ckpt_dir, name, directory=directory, limit=limit)
    try:
        yield before
    except Exception:
        _same_or_raise(ckpt_dir, name, before)  # a swap explains the error: report the swap, not the error
        raise
    _same_or_raise(ckpt_dir, name, before)


def _same_or_raise(ckpt_dir: Path, name: str, before: os.stat_result) -> None:
    try:
        after = os.lstat(Path(ckpt_dir) / name)
    except FileNotFoundError:
        raise CheckpointDeleted(f"{name}: deleted while it was read; not evaluated") from None
    except OSError as exc:
        raise CheckpointError(f"{name}: cannot be examined after reading ({exc.strerror})") from None
    if (after.st_dev, after.st_ino, stat.S_IFMT(after.st_mode)) != (
            before.st_dev, before.st_ino, stat.S_IFMT(before.st_mode)):
        raise CheckpointError(f"{name}: replaced while it was read (by a link or another entry); what was "
                              f"read is discarded and it is not evaluated") from None
