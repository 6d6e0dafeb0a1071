"""Writes weights snapshots to disk on a background thread, one at a time.

The training thread hands over host copies of the weights with ``try_submit``.
If the previous snapshot is still being written, the new one is skipped (and
counted) instead of waiting: training never waits for the disk. The commit
itself follows the checkpoint layout contract in evald.contracts.layout.
"""

from __future__ import annotations

import logging
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from evald.contracts import layout

log = logging.getLogger("trainer_hooks.snapshot_writer")


@dataclass
class SnapshotJob:
    step: int
    weights: Mapping[str, np.ndarray]
    epoch: int | None = None
    resume: layout.ResumeInfo = field(default_factory=layout.ResumeInfo)


class SnapshotWriter:
    def __init__(
        self,
        ckpt_dir: Path,
        run_id: str,
        *,
        on_committed: Callable[[int, Path, float], None],
        producer: Mapping[str, Any] | None = None,
        keep_last: int | None = None,
    ) -> None:
        self.ckpt_dir = Path(ckpt_dir)
        self.run_id = run_id
        self.keep_last = keep_last
        self.written = 0
        self.skipped_busy = 0
        self.failed = 0
        self.last_error: str | None = None
        self._on_committed = on_committed
        self._producer = dict(producer or {})
        self._pending: SnapshotJob | None = None
        self._busy = False
        self._cond = threading.Condition()
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="evald-snapshot-writer", daemon=True)
        self._thread.start()

    @property
    def busy(self) -> bool:
        return self._busy or self._pending is not None

    def try_submit(self, job: SnapshotJob) -> bool:
        """Hand ``job`` to the writer; False (and counted) if a write is still running."""
        with self._cond:
            if self._busy or self._pending is not None or self._closing:
                self.skipped_busy += 1
                return False
            self._pending = job
            self._cond.notify()
            return True

    def submit_final(self, job: SnapshotJob, timeout_s: float) -> bool:
        """At the end of training: wait (bounded) for the current write, then write ``job``."""
        with self._cond:
            if not self._cond.wait_for(lambda: not self._busy and self._pending is None, timeout_s):
                log.warning("final snapshot at step %d skipped: previous write still running after %.0fs",
                            job.step, timeout_s)
                self.skipped_busy += 1
                return False
            self._pending = job
            self._cond.notify()
            return self._cond.wait_for(lambda: not self._busy and self._pending is None, timeout_s)

    def close(self, timeout_s: float = 60.0) -> None:
        with self._cond:
            self._cond.wait_for(lambda: not self._busy and self._pending is None, timeout_s)
            self._closing = True
            self._cond.notify_all()
        self._thread.join(timeout=5.0)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending is not None or self._closing)
                if self._pending is None:
                    return
                job, self._pending, self._busy = self._pending, None, True
            try:
                self._write(job)
            except layout.AlreadyCommitted as exc:
                log.info("%s", exc)
            except Exception as exc:  # disk full, permissions...: record, keep training
                self.failed += 1
                self.last_error = f"step {job.step}: {exc!r}"
                log.error("snapshot at step %d could not be written to %s: %r; training continues",
                          job.step, self.ckpt_dir, exc)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _write(self, job: SnapshotJob) -> None:
        self.ckpt_dir.mkdir(parents=True, exist_ok=True)
        final = layout.write_checkpoint(
            self.ckpt_dir, job.step, job.weights, run_id=self.run_id, epoch=job.epoch,
            resume=job.resume, producer=self._producer,
        )
        self.written += 1
        manifest = layout.read_manifest(final)
        self._on_committed(job.step, final, manifest.commit_time)
        if self.keep_last:
            self._remove_old()

    def _remove_old(self) -> None:
        """Keep the newest ``keep_last`` checkpoints, and never the one evald marked best."""
        protected = layout.read_best_step(self.ckpt_dir)
        committed = layout.list_committed(self.ckpt_dir)
        for step, path in committed[: max(0, len(committed) - int(self.keep_last or 0))]:
            if step == protected:
                continue
            shutil.rmtree(path, ignore_errors=True)
