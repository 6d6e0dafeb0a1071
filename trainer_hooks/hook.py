"""EvaldHook: the whole trainer side of evald, for any training loop (example in its docstring).

``EvaldCallback`` wraps this class for ``Model.train``; there is one
implementation. The promises (DEVELOPERS.md, "training is sacred"):

* ``step_end`` blocks only to copy weights to host memory every
  ``every_n_steps``; writing, hashing, committing and notifying happen on
  background threads. A snapshot due while the previous one is still being
  written is skipped and counted, never waited for.
* No method raises into the training loop: every failure is logged, counted
  and training goes on. An absent or dead evald changes nothing.
* Every rank writes its part of each snapshot (``writer_ranks``, default all:
  trainer_hooks.partition_plan); the first writer rank also announces the run and
  sends the training scalars.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from evald.contracts import integrity, layout
from evald.contracts.auth import SecurityConfig
from evald.contracts.wire import (
    CheckpointCommitted,
    RunAnnounced,
    RunFinished,
    TrainMetrics,
    default_control_endpoint,
    default_endpoint,
)
from trainer_hooks.factory_path import FactoryLike, announced_factory
from trainer_hooks.notifier import Notifier
from trainer_hooks.partition_plan import detect_rank, planner, shared_run_id, writer_list
from trainer_hooks.retention import Retention
from trainer_hooks.snapshot_writer import SnapshotWriter
from trainer_hooks.control_follower import ControlFollower
from trainer_hooks.stop_agreement import ReduceSum
from trainer_hooks.telemetry import Telemetry, to_float

log = logging.getLogger("trainer_hooks")


Scalar = Any   # a Python number, a numpy scalar or a 0-d MindSpore Tensor: telemetry turns each into a float


@dataclass(frozen=True)
class StepReport:
    """What one ``step_end`` call told the hook (the arguments, named once, for the methods behind it)."""

    step: int
    network: Any                    # the mindspore.nn.Cell whose weights are snapshot
    optimizer: Any                  # its optimizer (for the learning rate), or None
    epoch: int | None = None
    loss: Scalar = None
    lr: Scalar = None
    grad_norm: Scalar = None
    loss_scale: Scalar = None
    overflow: Scalar = None
    samples: int | None = None
    tokens: int | None = None
    extra_scalars: Mapping[str, Scalar] | None = None
    data_offset: int | None = None
    seed: int | None = None

class EvaldHook:
    """The trainer side of evald for any training loop: snapshot, notify, report, obey a stop.

    Every ``every_n_steps`` the weights are copied to host memory (the only part that blocks)
    and committed to ``ckpt_dir`` in the background; evald, beside the job, evaluates them and
    may ask every rank to stop at the same step. No method raises into the training loop.

    Args:
        ckpt_dir: where snapshots are committed (``step_<N>/``); evald watches this directory.
        every_n_steps: take a snapshot every this many steps.
        network: the ``nn.Cell`` to snapshot (or pass ``network=`` to ``step_end``).
        optimizer: its optimizer, so that optimizer state stays out of the snapshot.
        run_id: this run's id in ``RUN.json`` and messages; default ``$EVALD_RUN_ID`` or a timestamp.
        task: ``"lm"`` or ``"classification"``: how evald evaluates.
        model_factory: ``"module:function"`` (or ``{"target", "kwargs"}``) building the network for evald.
        data_factory: ``"module:function"`` returning the validation set.
        total_steps: the run's length, for the ETA.
        endpoint: evald's notification endpoint; default: the local one evald binds.
        control_endpoint: evald's control endpoint (stop decisions); default: beside ``endpoint``.
        writer_ranks: ranks that write snapshots, default ``"all"``; with several, each writes its part
            of every snapshot (docs/checkpoint-layout.md, "Partitioned snapshots"). Build the hook on every rank.
        rank: this process's rank; default: from MindSpore or ``RANK_ID``/``RANK``.
        world_size: default: from MindSpore or ``RANK_SIZE``/``WORLD_SIZE``.
        telemetry_every: send training scalars to evald every this many steps.
        obey_stop: stop when evald decides to.
        agree_every: how often the ranks agree on a stop (a small all-reduce).
        reduce_sum: the all-reduce used to agree; default: MindSpore's when distributed.
        keep_last: disk budget: at most this many snapshots (the best one beside them); only those evald is
            done with are deleted, else a new snapshot is skipped (trainer_hooks.retention).
        final_snapshot_timeout_s: how long ``train_end`` waits for the final snapshot.
        lr_advice_handler: called with evald's learning-rate advice (see ``ScaleLearningRate``).
        client_key: this trainer's CURVE key file (``evald keys``) for a ``tcp://`` endpoint; default
            ``$EVALD_CLIENT_KEY``.
        server_public_key: evald's CURVE public key file; default ``$EVALD_SERVER_PUBLIC_KEY``.
        allow_plaintext: send over ``tcp://`` without CURVE (anyone on the path can read and forge).
        max_bytes: disk budget in bytes of snapshots, like ``keep_last`` (either or both).
        holds: the parameters this rank holds (names or a predicate), when ranks hold different ones
            (pipeline stages): it writes exactly those.
        tensor_layouts: ``{name: {"dev_matrix", "tensor_map"}}`` of tensor-parallel slices, or a cell whose
            ``parameter_layout_dict`` has them (default: ``network``'s). Given explicitly, tested on a real
            Megatron-style tensor-parallel job (examples/llama_tp/train.py); read from
            ``parameter_layout_dict``, untested on a real sharded job.
        hash_algorithm: each snapshot file's integrity check, ``"xxh3-128"`` (fast, against corruption) or
            ``"sha256"`` (cryptographic); default ``$EVALD_HASH`` or ``"xxh3-128"``. evald reads either
            (docs/checkpoint-layout.md, "MANIFEST.json"; docs/security.md).

    Returns:
        ``step_end`` returns True when every rank has agreed to stop at this step: leave the loop.

    Example::

        hook = EvaldHook("runs/exp1/ckpt", every_n_steps=100, network=net, optimizer=opt,
                         model_factory="mypkg.model:build", data_factory="mypkg.data:val_set")
        for step in range(1, total_steps + 1):
            loss = train_step(*next(batches))
            if hook.step_end(step, loss=loss, lr=opt.get_lr()):
                break
        hook.train_end(step)
    """

    def __init__(
        self,
        ckpt_dir: str | os.PathLike,
        every_n_steps: int = 100,
        *,
        network: Any = None,
        optimizer: Any = None,
        run_id: str | None = None,
        task: str = "lm",
        model_factory: FactoryLike = None,
        data_factory: FactoryLike = None,
        total_steps: int | None = None,
        endpoint: str | None = None,
        control_endpoint: str | None = None,
        writer_ranks: Iterable[int] | str = "all",
        rank: int | None = None,
        world_size: int | None = None,
        telemetry_every: int = 10,
        obey_stop: bool = True,
        agree_every: int = 1,
        reduce_sum: ReduceSum | None = None,
        keep_last: int | None = None,
        final_snapshot_timeout_s: float = 120.0,
        lr_advice_handler: Callable[[Mapping[str, Any]], None] | None = None,
        client_key: str | os.PathLike | None = None,          # CURVE (docs/authentication.md)
        server_public_key: str | os.PathLike | None = None,
        allow_plaintext: bool | None = None,
        max_bytes: int | None = None,
        holds: Iterable[str] | Callable[[str], bool] | None = None,
        tensor_layouts: Any = None,
        hash_algorithm: str | None = None,
    ) -> None:
        self.every_n_steps = max(1, int(every_n_steps))
        self.network = network
        self.optimizer = optimizer
        self.total_steps = total_steps
        self.final_snapshot_timeout_s = final_snapshot_timeout_s
        self._errors = 0
        self.snapshots_taken = 0
        self._finished = False

        detected_rank, detected_world = detect_rank()
        self.rank = detected_rank if rank is None else rank
        self.world_size = detected_world if world_size is None else world_size
        self.writers = writer_list(writer_ranks, self.world_size)  # with several, each writes its part
        self.is_writer = self.rank in self.writers
        self.is_lead = self.is_writer and self.rank == self.writers[0]  # announces; sends the scalars
        self.run_id = run_id or os.environ.get("EVALD_RUN_ID") or shared_run_id(
            reduce_sum, self.rank, self.world_size, self.writers,
            f"run-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}")
        self.ckpt_dir = Path(ckpt_dir).resolve()
        # A misspelt check is the caller's error, raised here (before any thread), not a silent default.
        self.hash_algorithm = integrity.for_writing(hash_algorithm or os.environ.get("EVALD_HASH") or None).algorithm
        self.endpoint = endpoint or default_endpoint()
        self.control_endpoint = control_endpoint or default_control_endpoint()

        self.notifier: Notifier | None = None
        self.writer: SnapshotWriter | None = None
        self.telemetry = Telemetry(total_steps=total_steps, flush_every=telemetry_every)
        self.control: ControlFollower | None = None
        security = SecurityConfig.from_env(client_key=client_key, server_public_key=server_public_key,
                                           allow_plaintext=allow_plaintext)

        try:
            if self.is_writer:
                self.ckpt_dir.mkdir(parents=True, exist_ok=True)
                self.notifier = Notifier(self.endpoint, security=security)
                self.writer = SnapshotWriter(
                    self.ckpt_dir, self.run_id, on_committed=self._on_committed,
                    producer={"rank": self.rank, "world_size": self.world_size,
                              "host": socket.gethostname(), "pid": os.getpid()},
                    # every writer hears evald's leases: with partitions each rank deletes its own parts
                    retention=Retention(self.ckpt_dir, keep_last=keep_last, max_bytes=max_bytes,
                                        control_endpoint=self.control_endpoint, run_id=self.run_id,
                                        security=security) if keep_last or max_bytes else None,
                    planner=planner(self.rank, self.writers, holds, tensor_layouts),
                    hash_algorithm=self.hash_algorithm,
                )
                if network is not None:
                    self.writer.prepare(network, optimizer)
            if self.is_lead:
                announcement = RunAnnounced(
                    run_id=self.run_id, ckpt_dir=str(self.ckpt_dir), task=task,
                    model_factory=announced_factory(model_factory, "model_factory"),
                    data_factory=announced_factory(data_factory, "data_factory"),
                    total_steps=total_steps, every_n_steps=self.every_n_steps,
                    world_size=self.world_size, control_endpoint=self.control_endpoint,
                )
                layout.remove_run_end(self.ckpt_dir)  # a previous run's end is not this run's
                layout.write_run_file(self.ckpt_dir, announcement.encode().decode())
                self.notifier.send(announcement)  # type: ignore[union-attr]
            if obey_stop:
                self.control = ControlFollower(
                    rank=self.rank, world_size=self.world_size, control_endpoint=self.control_endpoint,
                    run_id=self.run_id, agree_every=agree_every, reduce_sum=reduce_sum, security=security,
                    lr_advice_handler=lr_advice_handler)
        except Exception:
            self._errors += 1
            log.exception("evald hook set-up failed; training continues without evald")

    def step_end(self, step: int, *, network: Any = None, optimizer: Any = None,
                 epoch: int | None = None, loss: Any = None, lr: Any = None,
                 grad_norm: Any = None, loss_scale: Any = None, overflow: Any = None,
                 samples: int | None = None, tokens: int | None = None,
                 extra_scalars: Mapping[str, Any] | None = None,
                 data_offset: int | None = None, seed: int | None = None) -> bool:
        """Call after every optimizer step. Returns True when training must stop now."""
        try:
            self._step_end(StepReport(step, network or self.network, optimizer or self.optimizer, epoch=epoch,
                                      loss=loss, lr=lr, grad_norm=grad_norm, loss_scale=loss_scale,
                                      overflow=overflow, samples=samples, tokens=tokens,
                                      extra_scalars=extra_scalars, data_offset=data_offset, seed=seed))
        except Exception:
            self._errors += 1
            log.exception("evald hook error at step %d (ignored; training continues)", step)
        # Outside the try above: the agreement is a collective that every rank must run at
        # every step whatever failed before it on this rank, or the ranks' collectives fall
        # out of step (a hang, or a spurious agreed stop).
        return self.control.should_stop(step) if self.control is not None else False

    def _step_end(self, report: StepReport) -> None:
        scalars = {"loss": report.loss, "learning_rate": report.lr, "grad_norm": report.grad_norm,
                   "loss_scale": report.loss_scale, "overflow": report.overflow, **(report.extra_scalars or {})}
        if self.notifier is not None and self.is_lead:
            batch = self.telemetry.record(report.step, {k: v for k, v in scalars.items() if v is not None},
                                          samples=report.samples, tokens=report.tokens)
            if batch:
                self.notifier.send(TrainMetrics(run_id=self.run_id, records=tuple(batch)))
        if self.writer is not None and report.network is not None and report.step % self.every_n_steps == 0:
            self._snapshot(report)

    def _snapshot(self, report: StepReport) -> None:
        step = report.step
        resume = layout.ResumeInfo(learning_rate=to_float(report.lr), loss_scale=to_float(report.loss_scale),
                                   seed=report.seed, data_offset=report.data_offset)
        if self.writer.try_snapshot(step, report.network, report.optimizer,  # type: ignore[union-attr]
                                    epoch=report.epoch, resume=resume):
            self.snapshots_taken += 1
        else:
            log.warning("snapshot at step %d skipped: the previous one is still being written (%d skipped so "
                        "far); raise every_n_steps or use faster storage", step, self.writer.skipped_busy)

    def _on_committed(self, step: int, path: Path, commit_time: float) -> None:
        if self.notifier is not None:
            self.notifier.send(CheckpointCommitted(run_id=self.run_id, ckpt_dir=str(self.ckpt_dir),
                                                   step=step, path=path.name, commit_time=commit_time))

    def train_end(self, final_step: int, *, network: Any = None, optimizer: Any = None,
                  epoch: int | None = None, reason: str | None = None) -> None:
        """Write a final snapshot (if not already taken), announce the end, shut down."""
        if self._finished:
            return
        self._finished = True
        try:
            network = network or self.network
            if self.writer is not None and self.writer.finish(final_step, network, optimizer or self.optimizer,
                                                              epoch=epoch, timeout_s=self.final_snapshot_timeout_s):
                self.snapshots_taken += 1  # the final snapshot, counted like the others
            if self.notifier is not None and not self.is_lead:
                self.notifier.close()
            elif self.notifier is not None:
                batch = self.telemetry.flush()
                if batch:
                    self.notifier.send(TrainMetrics(run_id=self.run_id, records=tuple(batch)))
                finished = RunFinished(run_id=self.run_id, ckpt_dir=str(self.ckpt_dir), final_step=final_step,
                                       reason=reason or self.stop_reason or "completed")
                # On disk first: an evald that misses the message (down, late, elsewhere) reads the file.
                layout.write_run_end(self.ckpt_dir, finished.encode().decode())
                self.notifier.send(finished)
                self.notifier.close()
        except Exception:
            self._errors += 1
            log.exception("evald hook failed while finishing the run (ignored)")
        finally:
            if self.control is not None:
                self.control.close()

    def stats(self) -> dict[str, Any]:
        return {
            "snapshots_taken": self.snapshots_taken,
            "snapshots_written": self.writer.written if self.writer else 0,
            "snapshots_skipped_busy": self.writer.skipped_busy if self.writer else 0,
            "snapshots_failed": self.writer.failed if self.writer else 0,
            "snapshots_skipped_budget": self.writer.retention.skipped if self.writer and self.writer.retention else 0,
            "snapshots_deleted": self.writer.retention.deleted if self.writer and self.writer.retention else 0,
            "notifications_sent": self.notifier.sent if self.notifier else 0,
            "notifications_dropped": self.notifier.dropped if self.notifier else 0,
            "hook_errors": self.errors,
            "control_messages_ignored": self.control.ignored_messages if self.control else 0,
        }

    @property
    def errors(self) -> int:
        """Failures logged and swallowed so far (training went on)."""
        return self._errors + (self.control.errors if self.control else 0)

    def count_error(self) -> None:
        self._errors += 1

    @property
    def stop_reason(self) -> str:
        return self.control.stop_reason if self.control else ""
