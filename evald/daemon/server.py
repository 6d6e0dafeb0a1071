"""evald's lifecycle: startup, a small tick loop, shutdown (after uvicorn's Server).

How the trainer side meets this loop (see trainer_hooks.EvaldHook)::

    trainer ranks                               evald (this process)
    -------------                               --------------------
    snapshot thread: commit step_N/  --disk-->  discovery (watchdog + rescans) --+
    PUSH checkpoint_committed (NOBLOCK) ----->  receiver thread ------------------+--> events
                                                                                  |
          loop: Run.handle(event) -> Run.tick() (sinks) -> Run.work() (one evaluation)
    rank 0 SUB control_state  <------------  control PUB (stop step, LR advice, summary)

``serve`` is startup, ``on_tick`` until it returns False, shutdown. ``on_tick`` is the one loop
body, and tests drive it directly (tests/unit/daemon/test_crash_replay.py). Signals only set
flags (``handle_exit``): the first SIGINT/SIGTERM sets ``should_exit`` (the current evaluation
finishes, then evald exits 0; a checkpoint still being read stops between chunks, is re-queued,
exit 1); a second sets ``force_exit``, which the evaluation checks between
batches (abandoned, re-queued, exit 1). A background thread that dies (the notification
receiver, the directory watcher) stops evald with an error naming it (exit 3), never silently.

What the server uses is passed in: the pipeline (tests give a stand-in), the eval group, and the
disk-full wait, which ends when a signal comes.

Exit codes: 0 done; 1 forced exit, or an unexpected error (logged with its traceback); 2 bad
configuration, another evald in the way, or a run directory evald cannot write; 3 checkpoints wait
that cannot be evaluated (docs/reliability.md). "evald stopped (exit code N)" is always the last
line, with the code evald exits with.
"""

from __future__ import annotations

import logging
import queue
import signal
import time
from pathlib import Path
from typing import Any

from evald.config import ResolvedConfig
from evald.contracts import outside_paths, safetensors_io
from evald.contracts.auth import SecurityError
from evald.contracts.wire import SocketDirError, default_socket_dir
from evald.daemon import channels
from evald.daemon import private_files
from evald.daemon.locks import InUse, Lock, directory_lock_path
from evald.daemon.run import Run
from evald.daemon.run_dir import RunDirError, open_run
from evald.daemon.serving import WAKE, Serving
from evald.daemon.turn import SystemicFailure
from evald.intake import trust
from evald.intake.receiver import ZMQ, ZMQ_UNTRUSTED, Receiver
from evald.ledger import disk_full
from evald.ledger.ledger import LedgerVersionError
from evald.pipeline.group.protocol import Group
from evald.pipeline.pipeline import EvaluationPipeline, Pipeline
from evald.pipeline.tasks.base import EvaluationInterrupted
from evald.serve.http_thread import ServeError
from evald.sinks.control import ControlPublisher

log = logging.getLogger("evald")

EVENT_QUEUE_SIZE = 10_000
EVENTS_PER_TURN = 1_000
IDLE_WAIT_S = 0.2     # how long an idle turn waits for an event


class CannotEvaluate(RuntimeError):
    """The operator's own factories cannot be built: nothing this evald could ever evaluate."""


class BackgroundThreadDied(RuntimeError):
    """A thread evald depends on (receiver, watcher) is dead: evald would go deaf without saying so."""


class Server:
    def __init__(self, resolved: ResolvedConfig, group: Group | None = None,
                 pipeline: EvaluationPipeline | None = None) -> None:
        self.resolved = resolved
        self.config = resolved.config
        self.group = group  # rank 0 of an eval group, or None: one device
        self.should_exit = False
        self.force_exit = False
        self.exit_code = 0
        self.events: "queue.Queue[tuple[str, Any]]" = queue.Queue(maxsize=EVENT_QUEUE_SIZE)
        # the network's build blocks the loop for seconds: between its steps, keep_alive republishes the control state
        self.pipeline = pipeline or Pipeline(should_abort=self._should_abort, group=group, keep_alive=self._keep_alive)
        self.disk = disk_full.DiskWait(should_stop=lambda: self.should_exit)  # a signal ends a wait for space
        self.run: Run | None = None
        self.receiver: Receiver | None = None
        self.control: ControlPublisher | None = None
        self.locks: list[Lock] = []
        self.serving: Serving | None = None   # --serve: the HTTP endpoint (evald.daemon.serving)
        self._last_activity = time.monotonic()
        self._said_exiting = False
        self._worked = True    # the last turn evaluated or skipped something (the first turn looks at once)
        self._refused_attach, self._refused_attach_said_at = 0, float("-inf")
        safetensors_io.stop_reading_when(lambda: self.should_exit)  # a signal ends a read, between chunks

    def serve(self) -> int:
        self.install_signal_handlers()
        try:
            self.startup()
            while self.on_tick():
                pass
        except (InUse, RunDirError, SecurityError, LedgerVersionError, outside_paths.OutsidePathError,
                SocketDirError, ServeError) as exc:
            log.error("%s", exc)
            self.exit_code = 2
        except (CannotEvaluate, SystemicFailure, BackgroundThreadDied) as exc:
            log.error("%s", exc)
            self.exit_code = 3
        except (EvaluationInterrupted, disk_full.DiskFullShutdown):
            log.warning("forced exit: the work under way was abandoned; it is redone at the next start")
            self.exit_code = 1
        except Exception:  # noqa: BLE001 - a defect: its traceback goes to the log, and the code said is the true one
            log.exception("evald stopped on an unexpected error (a defect: please report it with this log); the "
                          "ledger keeps its place, start it again")
            self.exit_code = 1
        finally:
            self.shutdown()
        return self.exit_code

    def startup(self) -> None:
        log.info("evald starting with:\n  %s", "\n  ".join(self.resolved.describe()))
        private_files.apply_umask(self.config.state_mode)  # before evald creates any file
        if self.config.zmq:
            bound = channels.bind(self.config, self.events)
            self.receiver, self.control = bound.receiver, bound.control
            self.locks += bound.locks
        if self.config.serve.enabled:
            self.serving = Serving(self.config, self.pipeline, self.events)
            self.serving.start()
        if self.resolved.set_by_operator("model_factory") and self.resolved.set_by_operator("data_factory"):
            if not self.pipeline.ensure_built(self.config):  # compile now, not at the first checkpoint
                raise CannotEvaluate(f"{self.pipeline.blocked_reason}; fix the configuration and start again")
        if self.config.ckpt_dir and self.config.wait_for_ckpt_dir and not Path(self.config.ckpt_dir).is_dir():
            log.info("waiting for %s to be created (--wait-for-ckpt-dir); nothing is written until then",
                     self.config.ckpt_dir)
        elif self.config.ckpt_dir:
            self.attach(Path(self.config.ckpt_dir))
        else:
            log.info("no --ckpt-dir: waiting for the trainer's first notification on %s",
                     channels.notification_endpoint(self.config))

    def attach(self, ckpt_dir: Path) -> None:
        ckpt_dir = outside_paths.resolve(ckpt_dir, "the checkpoint directory")
        how = "give this one another --ckpt-dir"
        self.locks.append(Lock(directory_lock_path(ckpt_dir, default_socket_dir()), f"checkpoint directory "
                               f"{ckpt_dir}", how))
        run = open_run(ckpt_dir, self.config.logdir and Path(self.config.logdir), self.config.run_name)
        private_files.prepare_state_dir(run.path, self.config.state_mode)
        self.locks.append(Lock(run.lock, f"run directory {run.path}", "give this one another --logdir"))
        self.run = Run(self.resolved, ckpt_dir, run.path, control=self.control, receiver=self.receiver,
                       events=self.events, pipeline=self.pipeline, disk=self.disk)
        self.run.start()  # the ledger, the trainer's files, the watcher: what fails here is closed by shutdown
        log.info("TensorBoard run %r in %s: view it with  tensorboard --logdir %s", run.name, run.logdir, run.logdir)
        self.run.prepare()
        if self.serving is not None:
            self.serving.attach(run.name, run.path, ckpt_dir, self.run.ledger)

    def _keep_alive(self) -> None:
        """While the network builds (graphs compile for seconds, the loop waits): the control state keeps being
        re-published, so that a trainer that subscribes meanwhile hears evald's leases, not "no evald reachable"
        (its budget would then delete snapshots evald has not evaluated)."""
        if self.control is not None and self.run is not None:
            self.control.tick()

    def _should_abort(self) -> bool:
        """Checked between batches: says once that a signal came, and whether to abandon; meanwhile
        the control state (with its retention leases, evald.sinks.leases) keeps being re-published."""
        if self.control is not None and self.run is not None:
            self.control.tick()
        if self.serving is not None and not self.force_exit:
            self.serving.between_batches()  # a few queued requests on the checkpoint under evaluation
        if self.should_exit and not self._said_exiting:
            self._said_exiting = True
            log.warning("signal received: finishing this evaluation, then exiting (a second signal abandons it)")
        return self.force_exit

    def on_tick(self) -> bool:
        """One turn of the loop: events, the sinks, at most one evaluation. False: time to stop."""
        if self.should_exit:
            return False
        self._check_threads()
        if self.group is not None:
            self.group.heartbeat()  # idle ranks wait in a collective, which times out
        busy = self._worked or (self.serving is not None and self.serving.pending())
        self._drain_events(timeout=0.0 if busy else IDLE_WAIT_S)  # busy: straight on to the next step
        self._worked = False
        self._attach_when_created()
        if self.serving is not None and not self.should_exit:
            self.serving.on_tick()  # between evaluations: queued requests, swapping a pinned step in
        if self.run is None or self.should_exit:
            return not self.should_exit
        self.run.tick()
        if self.run.work():
            if self.serving is not None:
                self.serving.steps_changed()  # a step was evaluated: servable at the next turn
            self._last_activity = time.monotonic()
            self._worked = True
            return True
        if self.run.complete():
            self.run.finish()
            if not self.config.serve_forever:
                return False
        return not self._idle_too_long()

    def _check_threads(self) -> None:
        """Orbax's rule: a background thread's death is raised in the main loop, never left silent."""
        threads = [("the notification receiver", self.receiver),
                   ("the checkpoint directory watcher", self.run and self.run.discovery),
                   ("the HTTP endpoint (--serve)", self.serving and self.serving.http)]
        for what, owner in threads:
            if owner is not None and not owner.is_alive():
                reason = owner.failure() or "it stopped"
                raise BackgroundThreadDied(f"{what} thread died ({reason}); evald stops rather than miss "
                                           f"checkpoints or messages. Start it again; the ledger keeps its place")

    def _attach_when_created(self) -> None:
        """--wait-for-ckpt-dir: serve the directory once it exists (no log directory under a missing path)."""
        if self.run is None and self.config.ckpt_dir and Path(self.config.ckpt_dir).is_dir():
            self.attach(Path(self.config.ckpt_dir))

    def _drain_events(self, timeout: float) -> None:
        try:
            item = self.events.get(timeout=timeout)
        except queue.Empty:
            return
        for handled in range(1, EVENTS_PER_TURN + 1):
            source, payload = item
            if source == WAKE:
                pass  # a request arrived: this turn serves it
            elif (self.run is None and not self.config.ckpt_dir and source in (ZMQ, ZMQ_UNTRUSTED)
                    and getattr(payload, "ckpt_dir", None)):
                # The first trusted notification names the directory; an untrusted one is refused, with why.
                origin = trust.of_message(self.receiver, peer_trusted=source == ZMQ)
                if trust.may_attach(origin, payload.ckpt_dir, payload.TYPE):
                    self._attach_for(payload)
            if source != WAKE and self.run is not None and self.run.handle(source, payload):
                self._last_activity = time.monotonic()
            if handled == EVENTS_PER_TURN:
                return  # the sinks, the work and the signal flags get their turn; the rest waits in the queue
            try:
                item = self.events.get_nowait()
            except queue.Empty:
                return

    def _attach_for(self, message: Any) -> None:
        """Serve the directory a trusted first message names. One that cannot be served (a link loop,
        another evald's, a run directory that is not evald's) is refused and logged, at most once per
        10 s: no message can raise out of the loop, whatever it holds; evald waits for the next."""
        held = len(self.locks)
        try:
            self.attach(Path(message.ckpt_dir))
        except Exception as exc:  # noqa: BLE001 - whatever the message named
            if self.run is not None:  # made before what failed: its watcher and ledger are closed again
                self.run.close()
            for lock in self.locks[held:]:
                lock.release()
            del self.locks[held:]
            self.run, self._refused_attach = None, self._refused_attach + 1
            if time.monotonic() - self._refused_attach_said_at >= 10.0:
                self._refused_attach_said_at = time.monotonic()
                log.error("not serving the directory a %s message names: %s (%d such messages so far; one such "
                          "line every 10 s at most)", message.TYPE, str(exc)[:1000], self._refused_attach)

    def _idle_too_long(self) -> bool:
        limit = self.config.idle_exit_s
        if limit is None or self.run is None or self.run.intake.settling:
            return False
        if time.monotonic() - self._last_activity < limit:
            return False
        if self.run.blocked:
            log.error("nothing happened for %.0fs and checkpoints are still waiting: %s (--idle-exit-s)", limit,
                      self.run.blocked_reason)
            self.exit_code = 3
        else:
            log.info("nothing to do for %.0fs: exiting (--idle-exit-s)", limit)
        return True

    def shutdown(self) -> None:
        self._should_abort()
        if self.receiver is not None:
            log.info("notification channel: %s", self.receiver.stats())
        closers = [("HTTP endpoint", self.serving and self.serving.close), ("run", self.run and self.run.close), ("receiver", self.receiver and self.receiver.close),
                   ("control", self.control and self.control.close), ("group", self.group and self.group.close)]
        for name, closer in closers:
            try:
                if closer:
                    closer()
            except Exception:
                log.exception("closing the %s failed during shutdown", name)
        for lock in self.locks:
            lock.release()
        log.info("evald stopped (exit code %d)", self.exit_code)

    def handle_exit(self, signum: int, _frame: Any) -> None:
        """Signal handler: only sets flags (the loop and the evaluation read them)."""
        if self.should_exit:
            self.force_exit = True
        self.should_exit = True

    def install_signal_handlers(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self.handle_exit)
