"""Everything evald decides from its numbers, as one pure object.

After each evaluation ``observe_eval`` returns an Outcome: the early-stop verdict and
its reason, whether this step is the new best, health alerts, learning-rate advice and,
when training must stop, the step it stops at. After each batch of training scalars
``observe_train`` returns the health alerts they raise. Nothing here does I/O: the
caller commits ``state_dict()`` in the same ledger transaction as the evaluation it
came from, then hands the outcome to the sinks (TensorBoard, control channel, best
pointer). So after a crash the state and the record agree, and nothing is decided
or written twice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from evald.config import EvaldConfig
from evald.contracts.wire import ControlState
from evald.decisions.early_stop import EarlyStopPolicy
from evald.decisions.health import HealthMonitor
from evald.decisions.lr_advisor import LRAdvisor
from evald.decisions.monitor_targets import parse_suite_monitor, stderr_tag
from evald.decisions.trend import TrainLossTrend
from evald.pipeline.metrics.uncertainty import se_tag

MAX_STEP = 2**63 - 1  # the wire's bound on a step


@dataclass(frozen=True)
class Outcome:
    reason: str                              # the early-stop verdict, in words
    improved: bool                           # this step is the new best
    stop_at_step: int | None                 # set when this evaluation decided to stop training
    alerts: Mapping[str, str] = field(default_factory=dict)   # TensorBoard tag -> message
    advice: Mapping[str, Any] | None = None  # learning-rate advice, when a new episode starts
    advisory_stop_at: int | None = None      # advisory mode: where training would have been stopped

    def texts(self) -> dict[str, str]:
        prefix = "STOP: " if self.stop_at_step is not None else ""
        if self.advisory_stop_at is not None:
            prefix = f"ADVISORY STOP at step {self.advisory_stop_at} (advisory mode: training continues): "
        texts = {"evald/decision": prefix + self.reason}
        texts.update(self.alerts)
        if self.advice:
            texts["evald/lr_advice"] = f"{self.advice['kind']} (scale {self.advice['scale']}): {self.advice['reason']}"
        return texts


class Decisions:
    def __init__(self, config: EvaldConfig) -> None:
        self.monitor = config.monitor
        self.stop_margin_steps = config.stop_margin_steps
        self.advisory_only = config.advisory_stop
        self.early_stop = EarlyStopPolicy(
            monitor=config.monitor, mode=config.mode, patience=config.patience, min_delta=config.min_delta,
            stopping_threshold=config.stopping_threshold, divergence_threshold=config.divergence_threshold,
            check_finite=config.check_finite)
        self.health = HealthMonitor(config.health, eval_mode=config.mode)
        window = config.health.advice_window
        self.advisor = LRAdvisor(mode=config.mode, window=window, min_delta=config.min_delta) if window else None
        self.trend = TrainLossTrend()
        # What the control channel says to run ``run_id``; ``seq`` grows with every change.
        self.run_id: str | None = None
        self.seq = 0
        self.stop_at_step: int | None = None
        self.stop_reason = ""
        self.lr_advice: dict[str, Any] | None = None
        self.summary: dict[str, Any] | None = None
        self.advisory_stop: dict[str, Any] | None = None  # {stop_at_step, step, reason}: what it would have done

    @property
    def best_step(self) -> int | None:
        return self.early_stop.best_step

    @property
    def best_value(self) -> float | None:
        return self.early_stop.best

    def rebuild_best(self, results: Mapping[int, Mapping[str, float]]) -> None:
        """The best step and value from the current results of each step (after some were superseded)."""
        self.early_stop.rebuild([(step, float(m[self.monitor]), m.get(se_tag(self.monitor)))
                                 for step, m in results.items() if m and self.monitor in m])

    def observe_eval(self, step: int, metrics: Mapping[str, float], *, newest_step: int,
                     every_n_steps: int | None, paired_se: float | None = None) -> Outcome:
        """``paired_se``: for a suite monitor, the SE of the difference between this step's value and
        the best step's (``best_step``), paired by document (``sinks/sample_files.paired_se_of_monitor``);
        with ``--min-delta Nse`` it replaces the unpaired SE of the difference."""
        value = metrics.get(self.monitor)
        if value is None:
            return Outcome(f"monitor {self.monitor!r} is not among the metrics {sorted(metrics)}", False, None)
        suite_metric = parse_suite_monitor(self.monitor) is not None
        se = metrics.get(stderr_tag(self.monitor) if suite_metric else se_tag(self.monitor))
        se = None if se is None or isinstance(se, str) else float(se)  # lm-eval's stderr can be "N/A"
        # A step older than one already seen (evald retry --step, backfill) says nothing about where
        # training goes now: the early stop ignores it, and so does the learning-rate advisor.
        in_order = self.early_stop.last_step is None or step > self.early_stop.last_step
        verdict = self.early_stop.observe(step, float(value), se, paired_se)
        trend = self.trend.take()
        alerts = {a.tag: a.message for a in self.health.observe_eval(step, value, trend)}
        advice = None
        if self.advisor is not None and math.isfinite(value) and in_order:
            advice = self.advisor.observe(step, value, trend, se)
        stop_at = advisory_at = None
        if verdict.stop and self.stop_at_step is None and self.advisory_stop is None:
            margin = self.stop_margin_steps or every_n_steps or 1
            at = min(max(newest_step, step) + margin, MAX_STEP)
            if self.advisory_only:
                advisory_at, self.advisory_stop = at, {"stop_at_step": at, "step": step, "reason": verdict.reason}
            else:
                stop_at, self.stop_at_step, self.stop_reason = at, at, verdict.reason
            self.seq += 1
        elif advice:
            self.lr_advice = dict(advice)
            self.seq += 1
        return Outcome(verdict.reason, verdict.improved, stop_at, alerts, advice, advisory_at)

    def begin_run(self, run_id: str) -> None:
        """A stop or advice decided for an earlier run in this directory does not apply to a new one."""
        if run_id == self.run_id:
            return
        self.run_id = run_id
        if (self.stop_at_step is not None or self.lr_advice is not None or self.summary is not None
                or self.advisory_stop is not None):
            self.stop_at_step, self.stop_reason, self.lr_advice, self.summary = None, "", None, None
            self.advisory_stop = None
            self.seq += 1

    def observe_train(self, step: int, scalars: Mapping[str, float]) -> dict[str, str]:
        if "loss" in scalars:
            self.trend.add(scalars["loss"])
        return {a.tag: a.message for a in self.health.observe_train(step, scalars)}

    def stop_after_end(self, final_step: int, end_reason: str) -> dict[str, Any] | None:
        """A stop decision that training never obeyed: decided after the run had already ended at
        ``final_step`` (or the trainer completed anyway). It is advisory, said as such, not a stop."""
        if self.stop_at_step is None:
            return None
        if end_reason == "completed" or self.stop_at_step > final_step:
            return {"stop_at_step": self.stop_at_step, "reason": self.stop_reason,
                    "note": f"decided after the run ended at step {final_step}: advisory, training was not stopped"}
        return None

    def finish(self, summary: Mapping[str, Any]) -> None:
        self.summary = dict(summary)
        self.seq += 1

    def control_state(self) -> ControlState | None:
        if self.seq == 0 or self.run_id is None:
            return None
        return ControlState(run_id=self.run_id, seq=self.seq, stop_at_step=self.stop_at_step, reason=self.stop_reason,
                            lr_advice=self.lr_advice, summary=self.summary, advisory_stop=self.advisory_stop)

    def state_dict(self) -> dict[str, Any]:
        return {"early_stop": self.early_stop.state_dict(), "health": self.health.state_dict(),
                "advisor": self.advisor.state_dict() if self.advisor else None,
                "trend": self.trend.state_dict(),
                "control": {"run_id": self.run_id, "seq": self.seq, "stop_at_step": self.stop_at_step, "stop_reason": self.stop_reason,
                            "lr_advice": self.lr_advice, "summary": self.summary,
                            "advisory_stop": self.advisory_stop}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.early_stop.load_state_dict(state.get("early_stop") or {})
        if state.get("health"):
            self.health.load_state_dict(state["health"])
        if self.advisor is not None and state.get("advisor"):
            self.advisor.load_state_dict(state["advisor"])
        self.trend.load_state_dict(state.get("trend") or {})
        control = state.get("control") or {}
        self.run_id = control.get("run_id")
        self.seq = int(control.get("seq", 0))
        self.stop_at_step = control.get("stop_at_step")
        self.stop_reason = control.get("stop_reason", "")
        self.lr_advice = control.get("lr_advice")
        self.summary = control.get("summary")
        self.advisory_stop = control.get("advisory_stop")
