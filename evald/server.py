"""evald's lifecycle: startup, one main loop, shutdown (after uvicorn's Server).

How the trainer side meets this loop (see trainer_hooks.EvaldHook)::

    trainer rank 0                                evald (this process)
    -------------                                 --------------------
    step_end(): copy weights to host   --->  background thread commits step_N/
                                              (temp dir -> MANIFEST last -> rename)
    PUSH checkpoint_committed (NOBLOCK) ---->  receiver thread --+
                                 watchdog (moved/created) ------+--> one queue
                                 periodic rescan of ckpt_dir ---+
                                                                 |
            main loop: ledger de-duplicates -> lag policy picks -> load + verify
            -> hot-swap into the compiled network -> evaluate the fixed subset
            -> one fsynced TensorBoard record -> ledger "evaluated"
            -> early stop / best pointer / health alerts / LR advice
    SUB control_state (poll per step)  <----  PUB sticky control state

Signals: the first SIGINT/SIGTERM lets the current evaluation finish, then
shuts down cleanly; a second one abandons it (recorded as interrupted, so a
restart redoes it) and exits at once.
"""

from __future__ import annotations

import json
import logging
import math
import queue
import signal
import time
from pathlib import Path
from typing import Any

from evald import ledger as L
from evald.checkpoints import (
    FOREIGN,
    FOREIGN_SUFFIXES,
    Candidate,
    CheckpointDeleted,
    CheckpointError,
    candidate_for,
    load_weights,
)
from evald.config import EvaldConfig
from evald.contracts import layout
from evald.contracts.wire import (
    CheckpointCommitted,
    ControlState,
    FactorySpec,
    Message,
    ProtocolError,
    RunAnnounced,
    RunFinished,
    TrainMetrics,
    announcement_from_json,
    decode_scalar,
)
from evald.discovery import RESCAN, WATCHDOG, Discovery
from evald.early_stop import EarlyStopPolicy
from evald.lag_policy import admit, decide
from evald.receiver import BAD_MESSAGE, ZMQ
from evald.tb_events import EventLog, steps_on_disk
from evald.train_trend import TrainLossTrend

log = logging.getLogger("evald")

EVAL_MARKER_TAG = "evald/evaluate_s"  # present in every evaluation record
FINAL_CHECKPOINT_GRACE_S = 60.0


class ForcedExit(BaseException):
    """Raised from the second signal's handler to abandon the current evaluation."""


class Server:
    def __init__(self, config: EvaldConfig) -> None:
        self.config = config
        self.should_exit = False
        self.exit_code = 0
        self.events: "queue.Queue[tuple[str, Any]]" = queue.Queue()
        self.ckpt_dir: Path | None = None
        self.logdir: Path | None = None
        self.announcement: RunAnnounced | None = None
        self.ledger: L.Ledger | None = None
        self.event_log: EventLog | None = None
        self.discovery: Discovery | None = None
        self.receiver = None
        self.control = None
        self.evaluator = None
        self._evaluator_error: object = None
        self._device_selected = False
        self._made_progress = False
        self._known: set[str] = set()
        self._recheck: dict[Path, float] = {}
        self._train_steps_written: set[int] = set()
        self._latest_train_step = 0
        self._bad_messages = 0
        self._final_step: int | None = None
        self._summarised_step: int | None = None  # the final step whose run summary was written
        self._finish_reason = ""
        self._finished_at: float | None = None
        self._last_rescan = 0.0
        self._last_activity = time.monotonic()
        self._signals = 0
        self.trend = TrainLossTrend()
        self.early_stop = EarlyStopPolicy(
            monitor=config.monitor, mode=config.mode, patience=config.patience, min_delta=config.min_delta,
            baseline=config.baseline, stopping_threshold=config.stopping_threshold,
            divergence_threshold=config.divergence_threshold, check_finite=config.check_finite)
        from evald.health import HealthMonitor, HealthThresholds
        from evald.lr_advisor import LRAdvisor

        self.health = HealthMonitor(HealthThresholds.from_mapping({"eval_mode": config.mode,
                                                                   **config.health_thresholds}))
        self.advisor = LRAdvisor(mode=config.mode, window=config.advice_window, min_delta=config.min_delta)
        self.control_state: ControlState | None = None

    # ================================================================ lifecycle

    def run(self) -> int:
        self._install_signal_handlers()
        try:
            self.startup()
            self.main_loop()
        except ForcedExit:
            log.warning("forced exit: current evaluation abandoned")
            self.exit_code = self.exit_code or 1
        finally:
            self.shutdown()
        return self.exit_code

    def startup(self) -> None:
        logging.basicConfig(level=getattr(logging, self.config.log_level.upper(), logging.INFO),
                            format="%(asctime)s %(name)s %(levelname)s %(message)s")
        if self.config.zmq:
            from evald.control import ControlPublisher
            from evald.receiver import Receiver

            self.receiver = Receiver(self.config.endpoint, self.events)
            self.receiver.start()
            self.control = ControlPublisher(self.config.control_endpoint,
                                            republish_s=self.config.control_republish_s)
            log.info("listening for notifications on %s; control state on %s", self.config.endpoint,
                     self.config.control_endpoint)
        if self.config.ckpt_dir:
            self._attach(Path(self.config.ckpt_dir))
        else:
            log.info("no --ckpt-dir: waiting for a trainer's first notification on %s", self.config.endpoint)

    def main_loop(self) -> None:
        while not self.should_exit:
            self._drain_events(timeout=0.0 if self._made_progress else 0.2)
            self._tick()
            if self.should_exit:
                break
            self._made_progress = self._evaluate_next()
            if self._run_complete():
                # Fix (issue 3): summarise a finished run once. With --serve-forever this ran on
                # every turn of the loop (every 0.2 s): a new evald/summary record, summary.json
                # rewrite and control-state publication five times a second, forever.
                if self._summarised_step != self._final_step:
                    self._finish_run()
                    self._summarised_step = self._final_step
                if not self.config.serve_forever:
                    break
            # Fix (issue 3): a foreign file waiting to settle (self._recheck) is work too; evald
            # used to exit idle before reading it.
            if self.config.idle_exit_s is not None and not self._recheck and \
                    time.monotonic() - self._last_activity > self.config.idle_exit_s and not self._has_queued():
                log.info("nothing to do for %.0fs: exiting (--idle-exit-s)", self.config.idle_exit_s)
                break

    def shutdown(self) -> None:
        for name, closer in (("receiver", lambda: self.receiver and self.receiver.close()),
                             ("watcher", lambda: self.discovery and self.discovery.stop()),
                             ("control", lambda: self.control and self.control.close()),
                             ("events", lambda: self.event_log and self.event_log.close()),
                             ("ledger", lambda: self.ledger and self.ledger.close())):
            try:
                closer()
            except Exception:
                log.exception("closing the %s failed during shutdown", name)
        log.info("evald stopped")

    def _install_signal_handlers(self) -> None:
        def handle(signum, _frame):
            self._signals += 1
            if self._signals == 1:
                log.warning("%s: finishing the current evaluation, then exiting (send again to force)",
                            signal.Signals(signum).name)
                self.should_exit = True
            else:
                raise ForcedExit()

        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, handle)

    # ================================================================ attach to a run

    def _attach(self, ckpt_dir: Path) -> None:
        self.ckpt_dir = ckpt_dir.resolve()
        self.ckpt_dir.mkdir(parents=True, exist_ok=True)
        self.logdir = Path(self.config.logdir).resolve() if self.config.logdir else self.ckpt_dir / layout.EVALD_SUBDIR
        self.ledger = L.Ledger(self.logdir / "ledger.sqlite")
        removed = layout.remove_orphaned_temps(self.ckpt_dir, older_than_s=self.config.orphan_temp_age_s)
        for path in removed:
            log.warning("removed orphaned temp checkpoint %s (left by a writer that died mid-write)", path)
        run_text = layout.read_run_file(self.ckpt_dir)
        if run_text and self.announcement is None:
            try:
                self.announcement = announcement_from_json(run_text)
            except ProtocolError as exc:
                log.error("%s/%s is unreadable: %s", self.ckpt_dir, layout.RUN_FILE, exc)
        self._restore_state()
        self.event_log = EventLog(self.logdir)
        self.discovery = Discovery(self.ckpt_dir, self.events, watch=self.config.watch,
                                   polling_interval_s=self.config.polling_interval_s)
        self.discovery.start()
        self.discovery.rescan()
        self._last_rescan = time.monotonic()
        log.info("evaluating checkpoints of %s; TensorBoard events and ledger in %s", self.ckpt_dir, self.logdir)

    def _restore_state(self) -> None:
        """Bring ledger, TensorBoard and decision state into agreement after any crash."""
        assert self.ledger is not None and self.logdir is not None
        self._known = {e.key for e in self.ledger.all()}
        on_disk = steps_on_disk(self.logdir, EVAL_MARKER_TAG)
        self._train_steps_written = set(steps_on_disk(self.logdir, "train/step_time_s")) | set(
            steps_on_disk(self.logdir, "train/loss"))
        self.ledger.recover_interrupted(self.config.max_attempts)
        # A record that reached disk just before a crash counts as done: never write it twice.
        for entry in self.ledger.with_state(L.SEEN, L.QUEUED, L.FAILED):
            if entry.step in on_disk:
                metrics = {k: v for k, v in on_disk[entry.step].items() if k.startswith("eval/")}
                self.ledger.set_state(entry.key, L.EVALUATED, "recovered from TensorBoard events after a crash",
                                      metrics=metrics)
        # Fix (issue 3): a crash between a row's "seen" and its admission (two commits) left it
        # "seen" for ever: known, so never handled again, and never queued: a missed checkpoint.
        # Forget that it is known; the startup rescan admits it again (see _handle_path).
        self._known -= {e.key for e in self.ledger.with_state(L.SEEN)}
        self.early_stop.load_state_dict(self.ledger.get_state("early_stop", {}))
        health_state = self.ledger.get_state("health")
        if health_state:
            self.health.load_state_dict(health_state)
        self.advisor.load_state_dict(self.ledger.get_state("lr_advisor", {}))
        for entry in self.ledger.with_state(L.EVALUATED):  # decisions lost in a crash are replayed
            if entry.metrics and self.config.monitor in entry.metrics:
                self._decide(entry.step, entry.metrics[self.config.monitor], replay=True)
        saved = self.ledger.get_state("control_state")
        if saved:
            try:
                self.control_state = ControlState(**saved)
                if self.control is not None:
                    self.control.update(self.control_state)
            except TypeError:
                log.warning("ignoring an unreadable saved control state")
        final = self.ledger.get_state("run_finished")
        if final:
            self._final_step, self._finish_reason = final["final_step"], final["reason"]
            self._finished_at = time.monotonic()

    # ================================================================ inputs

    def _drain_events(self, timeout: float) -> None:
        try:
            source, item = self.events.get(timeout=timeout) if timeout else self.events.get_nowait()
        except queue.Empty:
            return
        while True:
            self._handle(source, item)
            try:
                source, item = self.events.get_nowait()
            except queue.Empty:
                return

    def _handle(self, source: str, item: Any) -> None:
        if source == ZMQ:
            self._handle_message(item)
        elif source in (WATCHDOG, RESCAN):
            self._handle_path(item, source)
        elif source == BAD_MESSAGE:
            self._bad_messages += 1

    def _handle_message(self, message: Message) -> None:
        self._last_activity = time.monotonic()
        ckpt_dir = getattr(message, "ckpt_dir", None)
        if self.ckpt_dir is None and ckpt_dir:
            if isinstance(message, RunAnnounced):
                self.announcement = message
            self._attach(Path(ckpt_dir))
        if ckpt_dir and self.ckpt_dir is not None and Path(ckpt_dir).resolve() != self.ckpt_dir:
            log.warning("ignored %s for %s: this evald serves %s (one evald per run; use another endpoint)",
                        message.TYPE, ckpt_dir, self.ckpt_dir)
            return
        if isinstance(message, RunAnnounced):
            if self.announcement is None or self.announcement.run_id != message.run_id:
                log.info("run %s announced (task %s, %s steps)", message.run_id, message.task, message.total_steps)
            self.announcement = message
        elif isinstance(message, CheckpointCommitted):
            self._latest_train_step = max(self._latest_train_step, message.step)
            self._handle_path(self.ckpt_dir / message.path, ZMQ)  # type: ignore[operator]
        elif isinstance(message, TrainMetrics):
            self._handle_train_metrics(message)
        elif isinstance(message, RunFinished):
            log.info("run %s finished at step %d (%s)", message.run_id, message.final_step, message.reason)
            self._final_step, self._finish_reason = message.final_step, message.reason
            self._finished_at = time.monotonic()
            if self.ledger is not None:
                self.ledger.put_state("run_finished", {"final_step": message.final_step, "reason": message.reason})
            if self.discovery is not None:
                self.discovery.rescan()

    def _handle_path(self, path: Path, source: str) -> None:
        if self.ledger is None or path.name in self._known:
            return
        candidate = candidate_for(path, steps_per_epoch=self.config.foreign_steps_per_epoch,
                                  settle_s=self.config.foreign_settle_s)
        if candidate is None:
            if path.name.endswith(FOREIGN_SUFFIXES) and not layout.is_temp_name(path.name) and path.exists():
                self._recheck[path] = time.monotonic() + self.config.foreign_settle_s
            return
        self._last_activity = time.monotonic()
        self._known.add(path.name)
        if isinstance(candidate, str):
            kind = FOREIGN if path.name.endswith(FOREIGN_SUFFIXES) else "evald"
            self.ledger.record_seen(path.name, -1, kind, str(path), source)
            self._record_failure(path.name, -1, candidate)
            return
        if not self.ledger.record_seen(candidate.key, candidate.step, candidate.kind, str(candidate.path),
                                       source, candidate.run_id, candidate.commit_time) \
                and self.ledger.get(candidate.key).state != L.SEEN:  # "seen" only after a crash: admit it
            return
        self._latest_train_step = max(self._latest_train_step, candidate.step)
        log.info("found checkpoint %s (step %d) via %s", candidate.key, candidate.step, source)
        steps = sorted(e.step for e in self.ledger.all() if e.step >= 0)
        reason = admit(self.config.lag_policy, self.config.every_k, steps.index(candidate.step),
                       candidate.step, final_step=self._final_step)
        if reason:
            self.ledger.set_state(candidate.key, L.SKIPPED, reason)
            log.info("skipped %s: %s", candidate.key, reason)
        else:
            self.ledger.set_state(candidate.key, L.QUEUED)

    def _handle_train_metrics(self, message: TrainMetrics) -> None:
        for record in message.records:
            try:
                step = int(record["step"])
                wall_time = float(record.get("wall_time", time.time()))
                scalars = {k: decode_scalar(v) for k, v in dict(record.get("scalars", {})).items()}
            except (KeyError, TypeError, ValueError) as exc:
                log.warning("ignored a malformed train_metrics record %r: %s", record, exc)
                continue
            scalars = {k: v for k, v in scalars.items() if v is not None}
            self._latest_train_step = max(self._latest_train_step, step)
            if "loss" in scalars:
                self.trend.add(scalars["loss"])
            alerts = self.health.observe_train(step, scalars)
            if self.event_log is not None and step not in self._train_steps_written:
                finite = {f"train/{k}": v for k, v in scalars.items() if math.isfinite(v)}
                texts = {a.tag: a.message for a in alerts}
                self.event_log.write(step, wall_time, finite, texts)
                self._train_steps_written.add(step)
        if self.ledger is not None:
            self.ledger.put_state("health", self.health.state_dict())

    def _tick(self) -> None:
        now = time.monotonic()
        if self.control is not None:
            self.control.tick()
        if self.discovery is not None and now - self._last_rescan >= self.config.rescan_interval_s:
            self._last_rescan = now
            self.discovery.rescan()
        for path, due in list(self._recheck.items()):
            if now >= due:
                del self._recheck[path]
                self._handle_path(path, RESCAN)

    # ================================================================ evaluation

    def _has_queued(self) -> bool:
        return self.ledger is not None and bool(self.ledger.with_state(L.QUEUED))

    def _evaluate_next(self) -> bool:
        """Evaluate (or skip) what the lag policy picks; True if a checkpoint was dealt with."""
        if self.ledger is None:
            return False
        queued = self.ledger.with_state(L.QUEUED)
        decision = decide(self.config.lag_policy, [(e.key, e.step) for e in queued], final_step=self._final_step)
        for key, reason in decision.skip:
            self.ledger.set_state(key, L.SKIPPED, reason)
            log.info("skipped %s: %s", key, reason)
        if decision.evaluate is None:
            return bool(decision.skip)
        entry = self.ledger.get(decision.evaluate)
        assert entry is not None
        if not self._ensure_evaluator():
            return False
        self._evaluate(entry, queue_depth=len(queued) - 1 - len(decision.skip))
        return True

    def _ensure_evaluator(self) -> bool:
        if self.evaluator is not None:
            return True
        task, model, data = self._specs()
        if model is None or data is None:
            message = ("cannot evaluate yet: no model or data factory known; pass --model-factory and "
                       "--data-factory, or let the trainer announce them (EvaldHook(model_factory=..., "
                       "data_factory=...))")
            if self._evaluator_error != message:
                log.error(message)
                self._evaluator_error = message
            return False
        from evald.device import select_device
        from evald.evaluator import Evaluator
        from evald.metrics.plugins import load_metric, plugin_name

        if self._evaluator_error == ("build", task, model, data):
            return False  # the same specs failed already; wait for a new announcement or config
        try:
            if not self._device_selected:
                select_device(self.config.device_target, self.config.device)
                self._device_selected = True
            plugins = [_Plugin(plugin_name(spec), load_metric(spec)) for spec in self.config.metric_plugins]
            generation = None
            if task == "lm" and self.config.generation_prompts > 0:
                from evald.tasks.generation import SampleGenerator

                generation = SampleGenerator(
                    prompts=self.config.generation_prompts, prompt_len=self.config.generation_prompt_len,
                    new_tokens=self.config.generation_new_tokens, top_k=self.config.generation_top_k,
                    top_p=self.config.generation_top_p, seed=self.config.generation_seed)
            self.evaluator = Evaluator(task=task, model=model, data=data, subset_size=self.config.subset_size,
                                       subset_seed=self.config.subset_seed, batch_size=self.config.batch_size,
                                       plugins=plugins, generation=generation)
        except Exception as exc:
            # A configuration error (bad factory, plug-in, device) must not crash-loop evald:
            # say what failed, keep every checkpoint queued, retry when the specs change.
            log.exception("cannot build the evaluation network (%s); checkpoints stay queued until the "
                          "factories or plug-ins are fixed and announced again", exc)
            self._evaluator_error = ("build", task, model, data)
            return False
        return True

    def _specs(self) -> tuple[str, FactorySpec | None, FactorySpec | None]:
        """Explicit evald configuration first, then the trainer's announcement."""
        a = self.announcement
        task = self.config.task or (a.task if a else None) or "lm"
        model = self.config.factory("model") or (a.model_factory if a else None)
        data = self.config.factory("data") or (a.data_factory if a else None)
        return task, model, data

    def _evaluate(self, entry: L.Entry, queue_depth: int) -> None:
        assert self.ledger is not None and self.event_log is not None
        self._last_activity = time.monotonic()
        self.ledger.set_state(entry.key, L.EVALUATING)
        candidate = Candidate(entry.key, entry.step, entry.kind, Path(entry.path), entry.run_id, entry.commit_time)
        started = time.time()
        try:
            weights = load_weights(candidate)
            result = self.evaluator.evaluate(weights, strict=candidate.kind != FOREIGN)  # type: ignore[union-attr]
        except ForcedExit:
            self.ledger.set_state(entry.key, L.QUEUED, "interrupted by a forced shutdown")
            raise
        except CheckpointError as exc:
            state = L.DELETED if isinstance(exc, CheckpointDeleted) else L.FAILED
            self._record_failure(entry.key, entry.step, str(exc), state=state)
            return
        except Exception as exc:  # a bug or an OOM must cost one checkpoint, not the evaluator
            log.exception("evaluating %s failed", entry.key)
            self._record_failure(entry.key, entry.step, f"evaluation raised {exc!r}")
            return
        commit_time = entry.commit_time or started
        written = time.time()
        counts = self.ledger.counts()
        scalars = dict(result.metrics)
        scalars.update({
            "evald/load_s": result.load_s,
            EVAL_MARKER_TAG: result.evaluate_s,
            "evald/lag_steps": float(max(0, self._latest_train_step - entry.step)),
            "evald/lag_s": max(0.0, written - commit_time),
            "evald/queue_depth": float(max(0, queue_depth)),
            "evald/skipped_total": float(counts.get(L.SKIPPED, 0)),
            "evald/failed_total": float(counts.get(L.FAILED, 0) + counts.get(L.DELETED, 0)),
            "evald/bad_messages_total": float(self._bad_messages),
        })
        monitored = result.metrics.get(self.config.monitor)
        texts = dict(result.texts)
        decision_reason = self._decide(entry.step, monitored, replay=False) if monitored is not None else \
            f"monitor {self.config.monitor!r} not among the metrics {sorted(result.metrics)}"
        texts["evald/decision"] = decision_reason
        write_started = time.time()
        self.event_log.write(entry.step, commit_time, {k: float(v) for k, v in scalars.items()
                                                        if math.isfinite(float(v))}, texts)
        write_s = time.time() - write_started
        self.ledger.set_state(entry.key, L.EVALUATED, metrics={k: v for k, v in result.metrics.items()
                                                              if math.isfinite(v)})
        self._persist_decisions()
        # The write's own duration cannot be inside the record it times: a second record. A crash
        # between the two loses this point (the evaluation is not redone), never duplicates one.
        self.event_log.write(entry.step, commit_time, {"evald/write_s": write_s,
                                                        "evald/commit_to_written_s": time.time() - commit_time})
        log.info("step %d: %s | load %.3fs evaluate %.3fs write %.3fs, %.1fs after commit | lag %d steps, "
                 "queue %d, skipped %d, failed %d",
                 entry.step, " ".join(f"{k.removeprefix('eval/')}={v:.4g}" for k, v in result.metrics.items()
                          if k.startswith("eval/")),
                 result.load_s, result.evaluate_s, write_s, time.time() - commit_time,
                 scalars["evald/lag_steps"], scalars["evald/queue_depth"], scalars["evald/skipped_total"],
                 scalars["evald/failed_total"])

    def _record_failure(self, key: str, step: int, reason: str, state: str = L.FAILED) -> None:
        assert self.ledger is not None
        self.ledger.set_state(key, state, reason)
        log.error("checkpoint %s not evaluated (%s): %s", key, state, reason)
        if self.event_log is not None:
            self.event_log.write(max(step, 0), time.time(), None, {f"evald/{state}": f"{key}: {reason}"})

    # ================================================================ decisions

    def _decide(self, step: int, value: float, *, replay: bool) -> str:
        verdict = self.early_stop.observe(step, value)
        if replay and verdict.reason.endswith("ignored"):
            return verdict.reason
        if verdict.improved and self.ckpt_dir is not None:
            layout.write_best_pointer(self.ckpt_dir, step, self.config.monitor, value)
        trend = self.trend.take()
        for alert in self.health.observe_eval(step, value, trend):
            if self.event_log is not None and not replay:
                self.event_log.write(step, time.time(), None, {alert.tag: alert.message})
        advice = self.advisor.observe(step, value, trend) if self.config.lr_advice else None
        if advice:
            log.warning("learning-rate advice at step %d: %s", step, advice["reason"])
            if self.event_log is not None and not replay:
                self.event_log.write(step, time.time(), None, {"evald/lr_advice": json.dumps(advice)})
        if verdict.stop and not self._stop_published_for_current_run():
            stop_at = max(self._latest_train_step, step) + self._stop_margin()
            log.warning("early stop: %s -> training stops at step %d", verdict.reason, stop_at)
            self._publish(stop_at_step=stop_at, reason=verdict.reason)
        elif advice:
            self._publish(lr_advice=advice, reason=advice["reason"])
        return ("STOP: " if verdict.stop else "") + verdict.reason

    def _stop_published_for_current_run(self) -> bool:
        state = self.control_state
        return state is not None and state.stop_at_step is not None and state.run_id == self._run_id()

    def _run_id(self) -> str:
        return self.announcement.run_id if self.announcement else "unknown"

    def _stop_margin(self) -> int:
        every = self.announcement.every_n_steps if self.announcement and self.announcement.every_n_steps else 0
        return max(1, self.config.stop_margin_steps or every)

    def _publish(self, **changes: Any) -> None:
        run_id = self._run_id()
        previous = self.control_state if self.control_state and self.control_state.run_id == run_id else None
        fields = {"stop_at_step": previous.stop_at_step if previous else None,
                  "reason": previous.reason if previous else "",
                  "lr_advice": previous.lr_advice if previous else None,
                  "summary": previous.summary if previous else None}
        fields.update(changes)
        self.control_state = ControlState(run_id=run_id, seq=(previous.seq + 1 if previous else 1), **fields)
        if self.ledger is not None:
            self.ledger.put_state("control_state", {k: v for k, v in self.control_state.to_dict().items()
                                                    if k not in ("v", "type")})
        if self.control is not None:
            self.control.update(self.control_state)

    def _persist_decisions(self) -> None:
        assert self.ledger is not None
        self.ledger.put_state("early_stop", self.early_stop.state_dict())
        self.ledger.put_state("health", self.health.state_dict())
        self.ledger.put_state("lr_advisor", self.advisor.state_dict())

    # ================================================================ run end

    def _run_complete(self) -> bool:
        if self._final_step is None or self.ledger is None or self._has_queued():
            return False
        final = [e for e in self.ledger.all() if e.step == self._final_step]
        if final and all(e.state in L.FINAL_STATES for e in final):
            return True
        if self._finished_at is not None and time.monotonic() - self._finished_at > FINAL_CHECKPOINT_GRACE_S:
            log.warning("the final checkpoint (step %d) never appeared in %s; ending anyway",
                        self._final_step, self.ckpt_dir)
            return True
        return False

    def _finish_run(self) -> None:
        assert self.ledger is not None and self.logdir is not None
        counts = self.ledger.counts()
        summary = {
            "run_id": self.announcement.run_id if self.announcement else None,
            "final_step": self._final_step, "training_end_reason": self._finish_reason,
            "monitor": self.config.monitor, "best_step": self.early_stop.best_step,
            "best_value": self.early_stop.best, "stopped_early": bool(
                self.control_state and self.control_state.stop_at_step is not None),
            "checkpoints": counts,
        }
        layout.atomic_write_text(self.logdir / "summary.json", json.dumps(summary, indent=1))
        if self.event_log is not None and self._final_step is not None:
            self.event_log.write(self._final_step, time.time(), None, {"evald/summary": json.dumps(summary)})
        self._publish(summary=summary)
        log.info("run complete: %s", json.dumps(summary))


class _Plugin:
    def __init__(self, name: str, metric: Any) -> None:
        self.name = name
        self.metric = metric


def main() -> int:  # console-script entry point kept in one place: evald.cli
    from evald.cli import main as cli_main

    return cli_main()


if __name__ == "__main__":
    raise SystemExit(main())
