"""Everything evald does for the one checkpoint directory it serves.

Data flow (docs/architecture.md)::

    sources (receiver, discovery) --events--> Run.handle
        files    -> intake (ledger rows, lag policy)
        messages -> announcement (config), train stream (health, TensorBoard), run end
    Run.work  -> evaluation.evaluate_next: pipeline (load, verify, evaluate)
                 -> decisions -> one ledger transaction
    Run.tick  -> the sinks, one list ticked with the committed state (evald.sinks.sink): TensorBoard
                 (the ledger's outbox), counters, best pointer, control channel; and after each turn of work

The directory is the truth: the trainer's RUN.json names the run and its factories and
RUN_END.json says it finished. Messages only ring the bell: one for another directory
or another run is counted and ignored, and never changes what evald serves.
"""

from __future__ import annotations

import logging
import queue
import time
from pathlib import Path
from typing import Any, Callable

from evald.config import ConfigError, ResolvedConfig, with_announcement
from evald.contracts import layout, outside_paths
from evald.contracts.wire import CheckpointCommitted, Message, RunAnnounced, RunFinished, TrainMetrics
from evald.daemon import suite_turn, turn as evaluation
from evald.daemon.run_dir import LEDGER_FILE
from evald.decisions.decisions import Decisions
from evald.files.mindformers import entry_name, is_tracker
from evald.intake import trust
from evald.intake.discovery import RESCAN, WATCHDOG, Discovery
from evald.intake.intake import Intake
from evald.intake.lag_policy import CatchUp
from evald.intake.receiver import BAD_MESSAGE, ZMQ, ZMQ_UNTRUSTED, Receiver
from evald.intake.train_stream import TrainStream, reach
from evald.intake.trainer_files import Changes, may_name_factories, read_announcement, read_run_end
from evald.ledger.disk_full import DiskWait
from evald.ledger.ledger import EVALUATED, EVALUATING, FINAL_STATES, QUEUED, Ledger
from evald.ledger.requeue import RetryWatch, requeue_if_config_changed
from evald.pipeline.pipeline import EvaluationPipeline
from evald.sinks.best_pointer import BestPointer
from evald.sinks.control import ControlPublisher, ControlSink
from evald.sinks.counters import CountersFile, MessageCounts
from evald.sinks.leases import Leases
from evald.sinks.sink import RunState, Sink
from evald.sinks.summary import write_run_summary
from evald.sinks.tensorboard import TensorBoardSink

log = logging.getLogger("evald")

FINAL_CHECKPOINT_GRACE_S = 60.0
IGNORED_LOG_INTERVAL_S = 10.0
BLOCKED_REMINDER_S = 60.0


class Run:
    """The loop's work for one checkpoint directory. The constructor only records what it is given;
    ``start`` opens the ledger, reads the trainer's files, starts the watcher and publishes the state."""

    def __init__(self, resolved: ResolvedConfig, ckpt_dir: Path, run_dir: Path, *, control: ControlPublisher | None,
                 receiver: Receiver | None,
                 events: "queue.Queue[tuple[str, Any]]", pipeline: EvaluationPipeline,
                 disk: DiskWait | None = None) -> None:
        self.operator = resolved              # what the operator configured
        self.resolved = resolved              # ... merged with the trainer's announcement
        self.ckpt_dir, self.run_dir, self.control, self.receiver = ckpt_dir, run_dir, control, receiver
        self.events = events
        self.counters = evaluation.Counters()
        self.catch_up = CatchUp(started_at=time.time())  # checkpoints committed from now on, while building: not lag
        self.disk = disk or DiskWait()
        self.pipeline = pipeline
        self.announcement: RunAnnounced | None = None
        self.channel = trust.of_receiver(receiver)      # whether its messages may name factories
        self._channel_announcement: RunAnnounced | None = None
        self._run_file_changed = Changes(ckpt_dir / layout.RUN_FILE)
        self._ignored_said_at = float("-inf")
        self.run_end: RunFinished | None = None
        self._end_learned_at = self._blocked_said_at = 0.0
        self._last_rescan = time.monotonic()
        self._identities_for: Any = None
        self._subset_recorded: Any = None  # the SubsetInfo last written to subset.json
        self._opened: list[tuple[str, Callable[[], None]]] = []  # what close() closes, in reverse

    def start(self) -> None:
        self.ledger = Ledger(self.run_dir / LEDGER_FILE, self.disk)
        self._opened.append(("ledger", self.ledger.close))
        self.ledger.recover_interrupted(self.config.tuning.max_attempts)
        self.decisions = Decisions(self.config)
        self.decisions.load_state_dict(self.ledger.get_state("decisions", {}))
        self.suite_monitor = suite_turn.SuiteMonitor(  # a monitor on a suite metric decides on its cells
            self.decisions, newest_step=lambda: self.intake.newest_step,
            every_n_steps=lambda: self.announcement.every_n_steps if self.announcement else None)
        self.intake = Intake(self.ckpt_dir, self.ledger, self.config)
        requeue_if_config_changed(self.ledger, self.config, network_known=False)  # before intake judges
        self.retries = RetryWatch(self.ledger)
        self.train = TrainStream(self.ledger, self.decisions)
        self.sinks: list[Sink] = [TensorBoardSink(self.run_dir, self.ledger), CountersFile(self.run_dir),
                                  BestPointer(self.run_dir, self.disk)]
        if self.control is not None:
            self.sinks.append(ControlSink(self.control, Leases(self.ckpt_dir, self.ledger,
                                                               self.config.tuning.lease_s)))
        self._opened += [(sink.name, sink.close) for sink in self.sinks]
        self.discovery = Discovery(self.ckpt_dir, self.events, watch=self.config.tuning.watch,
                                   polling_interval_s=self.config.tuning.polling_interval_s)
        self._read_announcement()
        self._read_run_end()
        self.discovery.start()
        self._opened.append(("watcher", self.discovery.stop))
        self._rescan()
        self._tick_sinks()
        log.info("serving %s (run %s); TensorBoard events, ledger and summary in %s", self.ckpt_dir,
                 self.run_id, self.run_dir)

    @property
    def config(self):
        return self.resolved.config

    @property
    def run_id(self) -> str | None:
        return self.announcement.run_id if self.announcement else None

    def handle(self, source: str, item: Any) -> bool:
        """One event; True when it was news (a message for this run, or an entry not seen before)."""
        if source in (ZMQ, ZMQ_UNTRUSTED):  # an untrusted message is a doorbell too, never more
            self.counters.handled_messages += 1
            return self._message(item, trust.of_message(self.receiver, peer_trusted=source == ZMQ))
        if source in (WATCHDOG, RESCAN):
            return self._path(Path(item), source)
        if source == BAD_MESSAGE:
            self.counters.bad_messages += 1
        return False

    def _path(self, path: Path, found_via: str) -> bool:
        if self.discovery.reach(path):  # a MindFormers directory appeared: look inside at once
            self._rescan()
        if found_via == WATCHDOG and is_tracker(self.ckpt_dir, path):
            self._rescan()  # MindFormers' tracker file commits Checkpoint 2.0 iterations: look at them now
            return False
        name = entry_name(self.ckpt_dir, path)
        if name is None:
            return False
        if name == layout.RUN_FILE:
            return self._read_announcement()
        if name == layout.RUN_END_FILE:
            return self._read_run_end()
        return self.intake.found(name, found_via)

    def _message(self, message: Message, origin: trust.Source) -> bool:
        ckpt_dir = getattr(message, "ckpt_dir", None)
        if ckpt_dir is not None:
            try:
                named = outside_paths.resolve(ckpt_dir, f"the ckpt_dir of a {message.TYPE} message")
            except outside_paths.OutsidePathError as exc:
                return self._ignore(message, str(exc))
            if named != self.ckpt_dir:
                return self._ignore(message, f"it is for {outside_paths.shown(ckpt_dir)}, and this evald serves "
                                             f"{self.ckpt_dir}")
        if message.run_id != self.run_id:
            if self._run_file_changed():  # a new run announces itself in RUN.json before any message
                self._read_announcement()
            if message.run_id != self.run_id:
                return self._ignore(message, f"run {message.run_id!r} is not the run in "
                                             f"{self.ckpt_dir / layout.RUN_FILE} ({self.run_id!r})")
        if isinstance(message, RunAnnounced):
            if may_name_factories(message, origin) and message != self._channel_announcement:
                self._channel_announcement = message
                self._read_announcement()
        elif isinstance(message, CheckpointCommitted):
            self.intake.found(message.path, ZMQ)
        elif isinstance(message, TrainMetrics):
            self.train.add(message, reach(self.intake.newest_step, self.announcement))
        elif isinstance(message, RunFinished):
            # Only the trainer's RUN_END.json ends a run: the message just says "look now". So a
            # forged message cannot end the run, and a missed one changes nothing.
            self._read_run_end()
        return True

    def _ignore(self, message: Message, why: str) -> bool:
        self.counters.ignored_messages += 1
        if time.monotonic() - self._ignored_said_at >= IGNORED_LOG_INTERVAL_S:  # a flood must not fill the disk
            self._ignored_said_at = time.monotonic()
            log.warning("ignored a %s message: %s (%d ignored so far; one such line every %.0fs at most)",
                        message.TYPE, why, self.counters.ignored_messages, IGNORED_LOG_INTERVAL_S)
        return False

    def _read_announcement(self) -> bool:
        announced = read_announcement(self.ckpt_dir, self._channel_announcement, self.channel, operator=self.operator)
        if announced is None:
            return False
        try:
            resolved = with_announcement(self.operator, announced.options, announced.where)
        except ConfigError as exc:
            log.error("%s is not usable: %s", announced.where, exc)
            return False
        message = announced.message
        news = self.announcement is None or message != self.announcement
        if self.announcement is None or message.run_id != self.announcement.run_id:
            log.info("run %s announced in %s (task %s, %s steps, a checkpoint every %s)", message.run_id,
                     self.ckpt_dir, message.task, message.total_steps, message.every_n_steps)
            self.decisions.begin_run(message.run_id)
        self.announcement, self.resolved = message, resolved
        self.intake.run_id = message.run_id
        return news

    def _read_run_end(self) -> bool:
        message = read_run_end(self.ckpt_dir)
        if message is None or message.run_id != self.run_id:
            return False
        return self._end(message, str(self.ckpt_dir / layout.RUN_END_FILE))

    def _end(self, message: RunFinished, where: str) -> bool:
        if self.run_end is not None:
            return False
        self.run_end, self._end_learned_at = message, time.monotonic()
        self.intake.final_step = message.final_step
        log.info("run %s finished at step %d (%s), learned from %s", message.run_id, message.final_step,
                 message.reason, where)
        self._rescan()  # the final checkpoint may have landed without an event
        return True

    def _rescan(self) -> None:
        for path in self.discovery.rescan():
            self._path(path, RESCAN)

    def tick(self) -> None:
        now = time.monotonic()
        if now - self._last_rescan >= self.config.tuning.rescan_interval_s:
            self._last_rescan = now
            self._rescan()
        self.intake.recheck_settled()
        if self.retries.changed():  # `evald retry` forgot judged files: judge them again
            self.intake.forget_judged()
            self._rescan()
        self._tick_sinks()

    def _tick_sinks(self) -> None:
        """Every sink, in order, with the state committed so far."""
        state = RunState(
            ledger=self.ledger, decisions=self.decisions, run_id=self.run_id, lag_policy=self.config.lag_policy,
            final_step=self.intake.final_step, monitor=self.config.monitor,
            messages=MessageCounts(handled=self.counters.handled_messages, ignored=self.counters.ignored_messages,
                                   bad_frames=self.receiver.rejected if self.receiver is not None else 0),
            longest_load_s=self.counters.longest_load_s)
        for sink in self.sinks:
            sink.tick(state)

    def prepare(self) -> bool:
        """Build the evaluation network if its factories are known; False while it cannot be."""
        ready = self.pipeline.ensure_built(self.config)
        identities = (self.pipeline.validation_identity, tuple(sorted(self.pipeline.suites)))
        if ready and self._identities_for != identities:
            self._identities_for = identities  # once per build: results of other identities are superseded
            suite_turn.on_built(self.ledger, self.pipeline, self.run_id)
        if ready:
            requeue_if_config_changed(self.ledger, self.config, network_known=True)
        subset = self.pipeline.subset
        # Once per run directory and subset: the network may have been built before this run existed
        # (factories on the command line are built at start-up), or rebuilt with other data since.
        if ready and subset is not None and subset != self._subset_recorded:
            self.disk.retry("subset.json",
                            lambda: layout.atomic_write_text(self.run_dir / "subset.json", subset.to_json()))
            self._subset_recorded = subset
        return ready

    def work(self) -> bool:
        """Evaluate or skip one queued step; True if something was done."""
        waiting = self.ledger.steps(QUEUED)
        if self.pipeline.suites_pending and not waiting and self._suites_may_build() and self.prepare():
            # suites are built when no checkpoint waits, and never before the first one is validated
            self.pipeline.build_next_suite()
            self.prepare()   # the new suite's cells: identities, backfill requests
            return True
        if not waiting:
            if not self.prepare():
                return False
            suite_turn.take_backfill_requests(self.ledger, self.pipeline)
            suite_turn.queue_due(self.ledger, self.pipeline)
            ran = suite_turn.evaluate_cells(self.ledger, self.pipeline, self.ckpt_dir, self.run_dir,
                                            max_attempts=self.config.tuning.max_attempts,
                                            monitor=self.suite_monitor)
            self._tick_sinks()   # a suite monitor's decision: best pointer and control state follow it
            return ran
        if not self.prepare():
            if time.monotonic() - self._blocked_said_at > BLOCKED_REMINDER_S:
                self._blocked_said_at = time.monotonic()
                log.error("%d checkpoint(s) waiting, none can be evaluated: %s", len(self.ledger.steps(QUEUED)),
                          self.pipeline.blocked_reason)
            return False
        subset = self.pipeline.subset
        assert subset is not None, "prepare() is True only once the network and its subset are built"
        if self.receiver is not None:
            self.counters.bad_messages = self.receiver.rejected
        ctx = evaluation.Context(
            ckpt_dir=self.ckpt_dir, lag_policy=self.config.lag_policy, final_step=self.intake.final_step,
            newest_checkpoint_step=self.intake.newest_step, newest_train_step=max(self.train.last_step, 0),
            every_n_steps=self.announcement.every_n_steps if self.announcement else None,
            max_attempts=self.config.tuning.max_attempts, subset_text=subset.describe(), run_id=self.run_id,
            catch_up=self.catch_up)
        done = evaluation.evaluate_next(self.ledger, self.pipeline, self.decisions, ctx, self.counters)
        self._tick_sinks()   # the step's points, best pointer and decision out before its cells run
        if done is not None and done.evaluated and self.pipeline.suites:  # its cells, on the weights held
            suite_turn.queue_due(self.ledger, self.pipeline)
            if self.ledger.cell_counts():
                suite_turn.evaluate_cells(self.ledger, self.pipeline, self.ckpt_dir, self.run_dir,
                                          max_attempts=self.config.tuning.max_attempts, step=done.row.step,
                                          monitor=self.suite_monitor)
                self._tick_sinks()
        return True

    def _suites_may_build(self) -> bool:
        """A suite build (tens of seconds to minutes) must not delay the first checkpoint's validation: it
        waits until this evald has validated one, or the run has validated steps (a restart, a backfill)."""
        return self.counters.evaluated > 0 or bool(self.ledger.counts().get(EVALUATED))

    @property
    def blocked(self) -> bool:
        """Checkpoints wait but cannot be evaluated (no or broken factories, files evald may not read)."""
        return (bool(self.ledger.steps(QUEUED)) and self.pipeline.subset is None) or bool(self.intake.unreadable)

    @property
    def blocked_reason(self) -> str | None:
        unreadable = self.intake.unreadable
        if unreadable:
            return f"{len(unreadable)} file(s) evald may not read, e.g. {next(iter(unreadable.values()))}"
        return self.pipeline.blocked_reason

    def complete(self) -> bool:
        """The run has finished and every one of its checkpoints has been dealt with."""
        if (self.run_end is None or self.ledger.steps(QUEUED, EVALUATING) or self.intake.settling
                or (self.pipeline.suites_pending and self._suites_may_build())
                or self.intake.unreadable or suite_turn.waiting_cells(self.ledger, self.pipeline)):
            return False
        final = self.ledger.step(self.run_end.final_step)
        if final is not None and final.state in FINAL_STATES:
            return True
        if time.monotonic() - self._end_learned_at > FINAL_CHECKPOINT_GRACE_S:
            log.warning("the final checkpoint (step %d) never appeared in %s; ending anyway",
                        self.run_end.final_step, self.ckpt_dir)
            return True
        return False

    def finish(self) -> None:
        """Write the run summary once per run end (a restart does not write it again)."""
        assert self.run_end is not None
        if write_run_summary(self.ledger, self.decisions, self.run_dir, self.run_id, self.run_end,
                             self.config.monitor) is not None:
            self._tick_sinks()

    def close(self) -> None:
        """Close what ``start`` opened (all of it, or what it got to before it failed), newest first."""
        while self._opened:
            name, closer = self._opened.pop()
            try:
                closer()
            except Exception:
                log.exception("closing the %s failed during shutdown", name)
