"""Writes weights snapshots to disk on a background thread, one at a time.

The training thread either copies the weights into the writer's own reusable
host buffers with ``try_snapshot`` (the usual way), or hands over host copies
it made itself with ``try_submit``. If the previous snapshot is still being
written, the new one is skipped (and counted) instead of waiting: training
never waits for the disk. That one-at-a-time rule is also what makes a single
buffer set safe: the buffers are filled only after the writer has been
reserved under its lock, so they are never filled while being written, and
never written while being filled.

At start the writer removes its own orphaned temp directories
(``.step_N.tmp-*`` left by a writer that died), once they are older than
``orphan_temp_age_s``. The commit itself follows the checkpoint layout
contract in evald.contracts.layout. Before each write, ``retention``
(trainer_hooks.retention) makes room within the disk budget, deleting only
what evald has released, or says to skip the snapshot (counted).
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from evald.contracts import integrity, layout
from evald.contracts.partition import PART_DIR_PATTERN, parse_part_dir_name
from trainer_hooks.host_copy import HostBuffers, host_copy_of_weights
from trainer_hooks.partition_plan import PartitionPlan
from trainer_hooks.retention import Retention

log = logging.getLogger("trainer_hooks.snapshot_writer")


@dataclass
class SnapshotJob:
    step: int
    # The arrays, or (from try_snapshot) a callable that returns them once the copy is complete.
    weights: Mapping[str, np.ndarray] | Callable[[], Mapping[str, np.ndarray]]
    epoch: int | None = None
    resume: layout.ResumeInfo = field(default_factory=layout.ResumeInfo)
    final: bool = False  # the run's last snapshot: written even beyond the disk budget


@dataclass
class _Prepare:
    network: Any
    optimizer: Any = None


class SnapshotWriter:
    def __init__(
        self,
        ckpt_dir: Path,
        run_id: str,
        *,
        on_committed: Callable[[int, Path, float], None],
        producer: Mapping[str, Any] | None = None,
        keep_last: int | None = None,
        orphan_temp_age_s: float | None = 300.0,
        shard_bytes: int = layout.SHARD_BYTES,
        threads: int | None = None,
        retention: Retention | None = None,
        partition: PartitionPlan | None = None,
        planner: Callable[[Any, Any], PartitionPlan | None] | None = None,
        hash_algorithm: str = layout.HASH_ALGORITHM,
    ) -> None:
        self.ckpt_dir = Path(ckpt_dir)
        # Each file's integrity check (evald.contracts.integrity); an unknown one is refused here, not later.
        self.hash_algorithm = integrity.for_writing(hash_algorithm).algorithm
        # This rank's part of each snapshot (None: whole snapshots), or how to plan it once the network is known.
        self.partition = partition
        self._planner = planner
        self.run_id = run_id
        # keep_last alone (no evald channel): the budget decides, oldest first
        self.retention = retention or (Retention(self.ckpt_dir, keep_last=keep_last) if keep_last else None)
        if self.retention is not None:
            self.retention.list_own = self.own_snapshots  # a rank of a partitioned run deletes only its own parts
        self.written = 0
        self.last_committed: int | None = None  # the step of the last snapshot actually committed
        self.skipped_busy = 0
        self.failed = 0
        self.last_error: str | None = None
        self.orphans_removed = 0
        self._orphan_temp_age_s = orphan_temp_age_s
        self._shard_bytes = shard_bytes
        self._threads = threads
        self._buffers = HostBuffers()
        self._filling = False
        self._preparing: _Prepare | None = None
        self._allocating = False
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
        return self._busy or self._filling or self._pending is not None

    def try_submit(self, job: SnapshotJob) -> bool:
        """Hand ``job`` to the writer; False (and counted) if a write is still running."""
        with self._cond:
            if self.busy or self._closing:
                self.skipped_busy += 1
                return False
            self._pending = job
            self._cond.notify()
            return True

    def prepare(self, network: Any, optimizer: Any = None) -> bool:
        """Allocate the host buffers on the writer thread now, so that the first snapshot is a
        plain copy too (first-touching fresh memory costs far more than copying into it here).
        A snapshot due meanwhile waits for it: no longer than allocating itself would take."""
        with self._cond:
            if self.busy or self._closing or self._preparing is not None or self._allocating:
                return False
            self._preparing = _Prepare(network, optimizer)
            self._cond.notify()
            return True

    @property
    def buffers(self) -> HostBuffers:
        return self._buffers

    def try_snapshot(self, step: int, network: Any, optimizer: Any = None, *, epoch: int | None = None,
                     resume: layout.ResumeInfo | None = None) -> bool:
        """Copy the weights into the writer's reused host buffers and queue their commit.

        Blocks only for the copy to host memory. False (and counted) if the
        previous snapshot is still being written. A failed copy raises (the
        hook catches it) and leaves the writer idle.
        """
        with self._cond:
            # A preparation not started yet is dropped (this copy allocates, as it would have
            # without it); one under way is waited for: it is the allocation this copy would do.
            self._preparing = None
            self._cond.wait_for(lambda: not self._allocating)
            if self.busy or self._closing:
                self.skipped_busy += 1
                return False
            self._filling = True  # reserved: from here until the job is queued, the buffers are ours
        job = None
        try:
            ready = self._buffers.copy(network, optimizer, self.rows_for(network, optimizer))
            job = SnapshotJob(step=step, weights=ready, epoch=epoch, resume=resume or layout.ResumeInfo())
        finally:
            with self._cond:
                self._filling = False
                if job is not None:
                    self._pending = job
                self._cond.notify_all()
        return True

    def finish(self, final_step: int, network: Any, optimizer: Any, *, epoch: int | None, timeout_s: float) -> bool:
        """At the end of training: the final step's snapshot unless the last one written is it; then close.
        True when a final snapshot was taken (handed to the writer), as ``try_snapshot`` says for the others."""
        self.wait_idle(timeout_s)  # was the last one written, or skipped?
        taken = False
        if network is not None and self.last_committed != final_step:
            weights = host_copy_of_weights(network, optimizer, self.rows_for(network, optimizer))
            job = SnapshotJob(step=final_step, weights=weights, epoch=epoch, final=True)
            taken = self.submit_final(job, timeout_s)
        self.close(timeout_s=timeout_s)
        return taken

    def submit_final(self, job: SnapshotJob, timeout_s: float) -> bool:
        """At the end of training: wait (bounded) for the current write, then write ``job`` (bounded too).
        True when ``job`` was handed to the writer (taken), False when it was skipped as busy."""
        with self._cond:
            if not self._cond.wait_for(lambda: not self.busy, timeout_s):
                log.warning("final snapshot at step %d skipped: previous write still running after %.0fs",
                            job.step, timeout_s)
                self.skipped_busy += 1
                return False
            self._pending = job
            self._cond.notify()
            self._cond.wait_for(lambda: not self.busy, timeout_s)  # close() waits for the rest
            return True

    def wait_idle(self, timeout_s: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: not self.busy, timeout_s)

    def close(self, timeout_s: float = 60.0) -> None:
        with self._cond:
            self._cond.wait_for(lambda: not self.busy, timeout_s)
            self._closing = True
            self._cond.notify_all()
        self._thread.join(timeout=5.0)

    def _remove_orphans(self) -> None:
        if self._orphan_temp_age_s is None:
            return
        try:
            removed = layout.remove_orphaned_temps(self.ckpt_dir, older_than_s=self._orphan_temp_age_s)
        except OSError as exc:
            log.warning("could not look for orphaned temp checkpoints in %s: %r", self.ckpt_dir, exc)
            return
        self.orphans_removed += len(removed)
        for path in removed:
            log.info("removed %s: a snapshot a previous writer left half-written", path.name)

    def _allocate(self) -> None:
        with self._cond:
            job, self._preparing = self._preparing, None
            if job is None:  # taken back by a snapshot that came first
                return
            self._allocating = True
        try:
            self._buffers.allocate(job.network, job.optimizer, self.rows_for(job.network, job.optimizer))
        except Exception as exc:  # the first snapshot allocates instead
            log.warning("host buffers not prepared (%r); the first snapshot allocates them", exc)
        finally:
            with self._cond:
                self._allocating = False
                self._cond.notify_all()

    def rows_for(self, network: Any, optimizer: Any = None):
        """What of ``network`` this rank copies (trainer_hooks.host_copy.Rows); None: every weight."""
        if self.partition is None and self._planner is not None and network is not None:
            self.partition = self._planner(network, optimizer)
        return None if self.partition is None else self.partition.rows

    def _run(self) -> None:
        if self.retention is not None:
            self.retention.listen()  # this thread's own socket, connected before the first snapshot
        self._allocate()  # before the orphans: a snapshot may be waiting for it
        self._remove_orphans()
        while True:
            self._allocate()
            with self._cond:
                self._cond.wait_for(lambda: self._pending is not None or self._closing
                                    or self._preparing is not None)
                if self._preparing is not None:
                    continue
                if self._pending is None:
                    if self.retention is not None:
                        self.retention.close()
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
        weights = job.weights() if callable(job.weights) else job.weights
        if self.retention is not None and not self.retention.make_room(
                job.step, sum(int(a.nbytes) for a in weights.values()), final=job.final):
            return  # the disk budget is full of snapshots evald still needs: counted in retention.skipped
        final = layout.write_checkpoint(
            self.ckpt_dir, job.step, weights, run_id=self.run_id, epoch=job.epoch,
            resume=job.resume, producer=self._producer, shard_bytes=self._shard_bytes,
            threads=self._threads, part=self.partition and self.partition.part,
            slices=self.partition and self.partition.slices, hash_algorithm=self.hash_algorithm,
        )
        self.written += 1
        self.last_committed = job.step
        manifest = layout.read_manifest(final)
        log.info("committed snapshot %s", final.name)
        self._on_committed(job.step, final, manifest.commit_time)


    def own_snapshots(self) -> list[tuple[int, Path]]:
        """(step, directory) of the snapshots this writer committed, by step: whole ones, or this rank's parts."""
        if self.partition is None:
            return layout.list_committed(self.ckpt_dir)
        mine = (self.partition.part.index, self.partition.part.count)
        found = [(parse_part_dir_name(e.name), Path(e.path)) for e in os.scandir(self.ckpt_dir)
                 if PART_DIR_PATTERN.fullmatch(e.name) and (Path(e.path) / layout.MANIFEST_FILE).exists()]
        return sorted((info[0], path) for info, path in found if info and info[1:] == mine)
