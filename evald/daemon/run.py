"""Everything evald does for the one checkpoint directory it serves.

Data flow (docs/architecture.md)::

    sources (receiver, discovery) --events--> Run.handle -> EventRouter (evald.daemon.routing)
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

from evald.config import EvaldConfig, ResolvedConfig
from evald.contracts import layout
from evald.contracts.wire import RunAnnounced, RunFinished
from evald.daemon import suite_turn, turn as evaluation
from evald.daemon.routing import EventRouter
from evald.daemon.run_dir import LEDGER_FILE
from evald.decisions.decisions import Decisions
from evald.intake.discovery import Discovery
from evald.intake.intake import Intake
from evald.intake.lag_policy import CatchUp
from evald.intake.receiver import Receiver
from evald.intake.train_stream import TrainStream
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
BLOCKED_REMINDER_S = 60.0


class Run:
    """The loop's work for one checkpoint directory. The constructor only records what it is given;
    ``start`` opens the ledger, reads the trainer's files, starts the watcher and publishes the state."""

    def __init__(self, resolved: ResolvedConfig, ckpt_dir: Path, run_dir: Path, *, control: ControlPublisher | None,
                 receiver: Receiver | None,
                 events: "queue.Queue[tuple[str, Any]]", pipeline: EvaluationPipeline,
                 disk: DiskWait | None = None) -> None:
        self.operator = resolved              # what the operator configured
        self.router: EventRouter | None = None   # the events' routes, and the trainer's files (start())
        self.ckpt_dir, self.run_dir, self.control, self.receiver = ckpt_dir, run_dir, control, receiver
        self.events = events
        self.counters = evaluation.Counters()
        self.catch_up = CatchUp(started_at=time.time())  # checkpoints committed from now on, while building: not lag
        self.disk = disk or DiskWait()
        self.pipeline = pipeline
        self._blocked_said_at = 0.0
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
        self.router = EventRouter(self.ckpt_dir, self.operator, self.receiver, intake=self.intake,
                                  discovery=self.discovery, decisions=self.decisions, train=self.train,
                                  counters=self.counters)
        self.router.read_announcement()
        self.router.read_run_end()
        self.discovery.start()
        self._opened.append(("watcher", self.discovery.stop))
        self._rescan()
        self._tick_sinks()
        log.info("serving %s (run %s); TensorBoard events, ledger and summary in %s", self.ckpt_dir,
                 self.run_id, self.run_dir)

    @property
    def resolved(self) -> ResolvedConfig:
        """The operator's configuration merged with the trainer's announcement (the operator's before start)."""
        return self.router.resolved if self.router is not None else self.operator

    @property
    def config(self) -> EvaldConfig:
        return self.resolved.config

    @property
    def announcement(self) -> RunAnnounced | None:
        return self.router.announcement if self.router is not None else None

    @property
    def run_end(self) -> RunFinished | None:
        return self.router.run_end if self.router is not None else None

    @property
    def run_id(self) -> str | None:
        return self.announcement.run_id if self.announcement else None

    def handle(self, source: str, item: Any) -> bool:
        """One event (evald.daemon.routing); True when it was news."""
        assert self.router is not None, "start() first"
        return self.router.handle(source, item)

    def _rescan(self) -> None:
        assert self.router is not None
        self.router.rescan()

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
            suite_turn.note_unbuildable(self.ledger, self.pipeline)   # a suite that failed: its cells say why
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
        assert self.router is not None
        if time.monotonic() - self.router.end_learned_at > FINAL_CHECKPOINT_GRACE_S:
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
