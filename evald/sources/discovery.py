"""Finds checkpoint candidates in the watched directory: watchdog events and periodic rescans.

Both feed the same queue as the ZeroMQ receiver; the ledger de-duplicates.
The directory is watched non-recursively (each checkpoint is one entry in it).
inotify reports MindSpore's own ``x.tmp -> x`` renames as *moved*, our
``.step_N.tmp-* -> step_N`` commits too, and a copy from outside as
*created*, so both are handled; temp names are filtered by the caller.
On NFS, CIFS, Lustre, GPFS and FUSE inotify misses other hosts' writes, so
``watch=auto`` switches to the PollingObserver there.
"""

from __future__ import annotations

import logging
import os
import queue
import re
from pathlib import Path

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer
from watchdog.observers.polling import PollingObserver

from evald.sources.mounts import filesystem_type, needs_polling

log = logging.getLogger("evald.discovery")

WATCHDOG, RESCAN = "watchdog", "rescan"


class _Handler(FileSystemEventHandler):
    def __init__(self, out: "queue.Queue[tuple[str, object]]") -> None:
        self._out = out

    def on_created(self, event: FileSystemEvent) -> None:
        self._out.put((WATCHDOG, Path(os.fsdecode(event.src_path))))

    def on_moved(self, event: FileSystemEvent) -> None:
        self._out.put((WATCHDOG, Path(os.fsdecode(event.dest_path))))

    def on_modified(self, event: FileSystemEvent) -> None:
        # a foreign file written in place settles later; let the caller re-check it
        if not event.is_directory:
            self._out.put((WATCHDOG, Path(os.fsdecode(event.src_path))))


def _natural_key(name: str) -> list:
    """``x-1_5.ckpt`` before ``x-1_10.ckpt``; zero-padded ``step_N`` dirs sort by step anyway."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", name)]


class Discovery:
    def __init__(self, ckpt_dir: Path, out: "queue.Queue[tuple[str, object]]", *, watch: str = "auto",
                 polling_interval_s: float = 1.0) -> None:
        self.ckpt_dir = Path(ckpt_dir)
        self._out = out
        fs_type = filesystem_type(self.ckpt_dir)
        if watch == "polling" or (watch == "auto" and needs_polling(fs_type)):
            self.mode = "polling"
            self._observer = PollingObserver(timeout=polling_interval_s)
            if watch == "auto":
                log.warning("%s is on a %s filesystem: inotify cannot see writes from other hosts there, "
                            "so evald polls it every %.1fs (override with --watch)", self.ckpt_dir, fs_type,
                            polling_interval_s)
        else:
            self.mode = "inotify"
            self._observer = Observer()
        self.fs_type = fs_type

    def start(self) -> None:
        self.ckpt_dir.mkdir(parents=True, exist_ok=True)
        self._observer.schedule(_Handler(self._out), str(self.ckpt_dir), recursive=False)
        self._observer.start()
        log.info("watching %s (%s, filesystem %s)", self.ckpt_dir, self.mode, self.fs_type)

    def rescan(self) -> int:
        """Queue every entry of the directory; returns how many."""
        count = 0
        try:
            with os.scandir(self.ckpt_dir) as entries:
                # Fix (issue 3): in step order, not directory order. The every-k lag policy numbers
                # checkpoints on arrival; a burst found by one rescan arrived in hash order
                # (ext4), so k=2 picked e.g. steps 50 and 60 instead of 20, 40 and 60.
                for entry in sorted(entries, key=lambda e: _natural_key(e.name)):
                    self._out.put((RESCAN, Path(entry.path)))
                    count += 1
        except FileNotFoundError:
            pass
        return count

    def stop(self) -> None:
        try:
            self._observer.stop()
            self._observer.join(timeout=5)
        except Exception:
            log.exception("stopping the directory observer failed (ignored at shutdown)")
