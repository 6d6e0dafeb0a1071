"""Finds checkpoint candidates in the watched directory: watchdog events and periodic rescans.

Both feed the same queue as the ZeroMQ receiver; the ledger de-duplicates.
The directory is watched non-recursively (each checkpoint is one entry in it), and so
are MindFormers' ``checkpoint_network/rank_0`` and ``checkpoint/rank_0`` inside it
(evald.files.mindformers), each once it exists: evald never creates the trainer's
directories. A directory that appears (or is replaced) is watched when an event in
its parent shows it (``reach``) or at the next rescan.
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
import threading
from pathlib import Path
from typing import Callable

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer
from watchdog.observers.polling import PollingObserver

from evald.files import mindformers as mindformers_layout
from evald.intake.mounts import filesystem_type, needs_polling

log = logging.getLogger("evald.discovery")

WATCHDOG, RESCAN = "watchdog", "rescan"


class _Handler(FileSystemEventHandler):
    def __init__(self, out: "queue.Queue[tuple[str, object]]", gone: Callable[[Path], None]) -> None:
        self._out = out
        self._gone = gone

    def on_deleted(self, event: FileSystemEvent) -> None:
        if event.is_directory:  # a watched directory removed: its watch is dead even if it comes back
            self._gone(Path(os.fsdecode(event.src_path)))

    def on_created(self, event: FileSystemEvent) -> None:
        self._out.put((WATCHDOG, Path(os.fsdecode(event.src_path))))

    def on_moved(self, event: FileSystemEvent) -> None:
        if event.is_directory:
            self._gone(Path(os.fsdecode(event.src_path)))
        self._out.put((WATCHDOG, Path(os.fsdecode(event.dest_path))))

    def on_modified(self, event: FileSystemEvent) -> None:
        # a foreign file written in place settles later; let the caller re-check it
        if not event.is_directory:
            self._out.put((WATCHDOG, Path(os.fsdecode(event.src_path))))


def _natural_key(name: str) -> list:
    """``x-1_5.ckpt`` before ``x-1_10.ckpt``; zero-padded ``step_N`` dirs sort by step anyway."""
    return [(0, int(part), "") if part.isascii() and part.isdigit() else (1, 0, part)
            for part in re.split(r"([0-9]+)", name)]


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
        self._said_missing = False
        self._stopped = False
        self._dirs = [self.ckpt_dir, *mindformers_layout.watched_dirs(self.ckpt_dir)]
        self._listed = [self.ckpt_dir, *mindformers_layout.served_dirs(self.ckpt_dir)]
        self._watches: dict[Path, tuple[object, int]] = {}  # directory -> (watchdog watch, its inode)
        self._dead: set[Path] = set()  # watched directories seen removed (observer threads add to it)
        self._dead_lock = threading.Lock()
        self._said: set[tuple[Path, str]] = set()

    def start(self) -> None:
        self._observer.start()
        self._watch()

    def _watch(self) -> bool:
        """Watch each directory once it exists, again if it was replaced; True if a watch was added."""
        added = False
        for directory in self._dirs:
            try:
                inode = directory.stat().st_ino if directory.is_dir() else None
            except OSError:
                inode = None
            old = self._watches.get(directory)
            with self._dead_lock:  # a new directory may get the inode number of the removed one
                dead = directory in self._dead
                self._dead.discard(directory)
            if old is not None and old[1] == inode and not dead:
                continue
            if old is not None:  # gone or replaced (MindFormers removes a directory it created too early)
                del self._watches[directory]
                try:
                    self._observer.unschedule(old[0])
                except Exception:  # its emitter may have stopped with the directory
                    pass
            if inode is None:
                if directory == self.ckpt_dir and not self._said_missing:
                    self._said_missing = True
                    log.warning("%s does not exist yet: waiting for the trainer to create it", self.ckpt_dir)
                continue
            try:
                watch = self._observer.schedule(_Handler(self._out, self._gone), str(directory), recursive=False)
            except OSError as exc:
                self._say_once(directory, f"cannot watch {directory} ({exc}); it is looked at by rescans only")
                continue
            self._watches[directory] = (watch, inode)
            added = True
            log.info("watching %s (%s, filesystem %s)", directory, self.mode, self.fs_type)
        return added

    def _gone(self, path: Path) -> None:
        if path in self._watches:
            with self._dead_lock:
                self._dead.add(path)

    def reach(self, path: Path) -> bool:
        """``path`` (from an event) may be a directory evald watches that appeared: True if it is now watched."""
        return Path(path) in self._dirs and self._watch()

    def rescan(self) -> list[Path]:
        """Every entry of the served directories, each in step order (the caller handles them directly)."""
        self._watch()
        found: list[Path] = []
        for directory in self._listed:
            try:
                with os.scandir(directory) as entries:
                    # In step order, not directory order: the every-k lag policy numbers checkpoints on
                    # arrival, and a burst found by one rescan arrives in hash order on ext4.
                    found += [Path(e.path) for e in sorted(entries, key=lambda e: _natural_key(e.name))]
            except (FileNotFoundError, NotADirectoryError):
                continue
            except OSError as exc:  # e.g. MindFormers' 0750 directories, evald's user not in their group
                self._say_once(directory, f"cannot list {directory} ({exc}): its checkpoints cannot be found")
        return found

    def _say_once(self, directory: Path, message: str) -> None:
        if (directory, message) not in self._said:
            self._said.add((directory, message))
            log.error("%s", message)

    def is_alive(self) -> bool:
        """Whether watchdog's observer thread still runs (the server checks it every turn)."""
        return self._stopped or self._observer.is_alive()

    def failure(self) -> str | None:
        return None if self.is_alive() else "watchdog's observer thread is no longer running"

    def stop(self) -> None:
        self._stopped = True
        try:
            self._observer.stop()
            self._observer.join(timeout=5)
        except Exception:
            log.exception("stopping the directory observer failed (ignored at shutdown)")
