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
        self._watching = False
        self._said_missing = False

    def start(self) -> None:
        self._observer.start()
        self._watch()

    def _watch(self) -> None:
        """Watch the directory once it exists: evald never creates the trainer's directory."""
        if self._watching or not self.ckpt_dir.is_dir():
            if not self._watching and not self._said_missing:
                self._said_missing = True
                log.warning("%s does not exist yet: waiting for the trainer to create it", self.ckpt_dir)
            return
        self._observer.schedule(_Handler(self._out), str(self.ckpt_dir), recursive=False)
        self._watching = True
        log.info("watching %s (%s, filesystem %s)", self.ckpt_dir, self.mode, self.fs_type)

    def rescan(self) -> list[Path]:
        """Every entry of the directory, in step order (the caller handles them directly)."""
        self._watch()
        try:
            with os.scandir(self.ckpt_dir) as entries:
                # In step order, not directory order: the every-k lag policy numbers checkpoints on
                # arrival, and a burst found by one rescan arrives in hash order on ext4.
                return [Path(e.path) for e in sorted(entries, key=lambda e: _natural_key(e.name))]
        except (FileNotFoundError, NotADirectoryError):
            return []

    def stop(self) -> None:
        try:
            self._observer.stop()
            self._observer.join(timeout=5)
        except Exception:
            log.exception("stopping the directory observer failed (ignored at shutdown)")
