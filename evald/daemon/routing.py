"""Where each event of a run goes, and what the run knows from the trainer's files.

``EventRouter.handle(source, item)`` takes one event from the loop's queue:

* a path (watchdog, or the periodic rescan): a MindFormers directory or tracker file makes it look
  inside at once; the trainer's RUN.json is read as the run's announcement, its RUN_END.json as the run's
  end; any other entry goes to intake (evald.intake.intake), which admits checkpoints to the ledger;
* a message (ZeroMQ, trusted or not: a doorbell either way): one for another directory or another run is
  counted and ignored (and said at most every IGNORED_LOG_INTERVAL_S); an announcement makes it read
  RUN.json again (a message names factories only over a channel that may); a commit notice goes to
  intake; train metrics to the train stream; a RunFinished makes it read RUN_END.json, which alone ends
  the run (so a forged or lost message changes nothing);
* a bad frame is counted.

It holds the announcement (and the configuration merged with it) and the run's end, the run reads them.
The directory is the truth: every message only makes it look at the directory sooner.

May import: config, contracts, intake, files (MindFormers' layout), decisions (a new run begins),
daemon.turn (the loop's counters).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from evald.config import ConfigError, ResolvedConfig, with_announcement
from evald.contracts import layout, outside_paths
from evald.contracts.wire import CheckpointCommitted, Message, RunAnnounced, RunFinished, TrainMetrics
from evald.daemon.turn import Counters
from evald.decisions.decisions import Decisions
from evald.files.mindformers import entry_name, is_tracker
from evald.intake import trust
from evald.intake.discovery import RESCAN, WATCHDOG, Discovery
from evald.intake.intake import Intake
from evald.intake.receiver import BAD_MESSAGE, ZMQ, ZMQ_UNTRUSTED, Receiver
from evald.intake.train_stream import TrainStream, reach
from evald.intake.trainer_files import Changes, may_name_factories, read_announcement, read_run_end

log = logging.getLogger("evald")

IGNORED_LOG_INTERVAL_S = 10.0


class EventRouter:
    def __init__(self, ckpt_dir: Path, operator: ResolvedConfig, receiver: Receiver | None, *, intake: Intake,
                 discovery: Discovery, decisions: Decisions, train: TrainStream, counters: Counters) -> None:
        self.ckpt_dir, self.operator, self.receiver = ckpt_dir, operator, receiver
        self.intake, self.discovery, self.decisions, self.train = intake, discovery, decisions, train
        self.counters = counters
        self.resolved = operator                         # the operator's configuration, merged with RUN.json's
        self.announcement: RunAnnounced | None = None
        self.run_end: RunFinished | None = None
        self.end_learned_at = 0.0                        # monotonic time the run's end was read
        self.channel = trust.of_receiver(receiver)       # whether its messages may name factories
        self._channel_announcement: RunAnnounced | None = None
        self._run_file_changed = Changes(ckpt_dir / layout.RUN_FILE)
        self._ignored_said_at = float("-inf")

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

    def rescan(self) -> None:
        """Every entry of the directory, as if each had just been found."""
        for path in self.discovery.rescan():
            self._path(path, RESCAN)

    def _path(self, path: Path, found_via: str) -> bool:
        if self.discovery.reach(path):  # a MindFormers directory appeared: look inside at once
            self.rescan()
        if found_via == WATCHDOG and is_tracker(self.ckpt_dir, path):
            self.rescan()  # MindFormers' tracker file commits Checkpoint 2.0 iterations: look at them now
            return False
        name = entry_name(self.ckpt_dir, path)
        if name is None:
            return False
        if name == layout.RUN_FILE:  # each rescan sees it again: read it only when it changed since the last read
            return self._run_file_changed() and self.read_announcement()
        if name == layout.RUN_END_FILE:
            return self.read_run_end()
        return self.intake.found(name, found_via)

    def _message(self, message: Message, origin: trust.Source) -> bool:
        ckpt_dir = getattr(message, "ckpt_dir", None)   # the message types that name a directory
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
                self.read_announcement()
            if message.run_id != self.run_id:
                return self._ignore(message, f"run {message.run_id!r} is not the run in "
                                             f"{self.ckpt_dir / layout.RUN_FILE} ({self.run_id!r})")
        if isinstance(message, RunAnnounced):
            if may_name_factories(message, origin) and message != self._channel_announcement:
                self._channel_announcement = message
                self.read_announcement()
        elif isinstance(message, CheckpointCommitted):
            self.intake.found(message.path, ZMQ)
        elif isinstance(message, TrainMetrics):
            self.train.add(message, reach(self.intake.newest_step, self.announcement))
        elif isinstance(message, RunFinished):
            # Only the trainer's RUN_END.json ends a run: the message just says "look now". So a
            # forged message cannot end the run, and a missed one changes nothing.
            self.read_run_end()
        return True

    def _ignore(self, message: Message, why: str) -> bool:
        self.counters.ignored_messages += 1
        if time.monotonic() - self._ignored_said_at >= IGNORED_LOG_INTERVAL_S:  # a flood must not fill the disk
            self._ignored_said_at = time.monotonic()
            log.warning("ignored a %s message: %s (%d ignored so far; one such line every %.0fs at most)",
                        message.TYPE, why, self.counters.ignored_messages, IGNORED_LOG_INTERVAL_S)
        return False

    def read_announcement(self) -> bool:
        """RUN.json (with what a trusted channel announced); True when it says something new."""
        self._run_file_changed()  # what is read now is what "changed since" compares with
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

    def read_run_end(self) -> bool:
        """RUN_END.json, when it is this run's; True the first time."""
        message = read_run_end(self.ckpt_dir)
        if message is None or message.run_id != self.run_id:
            return False
        if self.run_end is not None:
            return False
        self.run_end, self.end_learned_at = message, time.monotonic()
        self.intake.final_step = message.final_step
        log.info("run %s finished at step %d (%s), learned from %s", message.run_id, message.final_step,
                 message.reason, self.ckpt_dir / layout.RUN_END_FILE)
        self.rescan()  # the final checkpoint may have landed without an event
        return True
