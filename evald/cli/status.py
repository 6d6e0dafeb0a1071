"""``evald status``: a run's state, read from its ledger without changing anything.

Safe while evald runs: the ledger is opened read-only (sqlite ``mode=ro``; a ledger
closed cleanly is opened ``immutable`` so that nothing is created beside it), and
whether an evald serves the run is read from ``/proc/locks`` (the kernel's table of
held locks), falling back to a shared non-blocking ``flock`` probe, released at once,
where that table cannot tell (a lock held from another host of a shared filesystem).
"""

from __future__ import annotations

import fcntl
import json
import os
import sqlite3
import time
from pathlib import Path
from typing import Any

from evald.contracts import layout
from evald.contracts.wire import ProtocolError, announcement_from_json
from evald.daemon.run_dir import IDENTITY_FILE, LEDGER_FILE, LOCK_FILE, read_identity
from evald.ledger.disk_full import DiskWait
from evald.ledger.ledger import DELETED, EVALUATED, EVALUATING, FAILED, QUEUED, REJECTED, SKIPPED, Ledger
from evald.ledger.requeue import RETRY
from evald.sinks.best_pointer import BEST_FILE

STATES = (QUEUED, EVALUATING, EVALUATED, SKIPPED, FAILED, DELETED)


class ReadOnlyLedger(Ledger):
    """The ledger's read methods on a read-only connection (no schema creation, no migration)."""

    def __init__(self, path: Path) -> None:  # not super().__init__, which would create the schema
        self.path = Path(path)
        self.disk = DiskWait()   # reads: a full disk does not stop them, but the methods share one wrapper
        mode = "ro" if Path(f"{path}-wal").exists() else "ro&immutable=1"
        self._db = sqlite3.connect(f"file:{self.path}?mode={mode}", uri=True, isolation_level=None, timeout=30)

    def times(self) -> dict[int, tuple[float | None, float, float | None]]:
        """``{step: (commit_time, admitted_at, finished_at)}``."""
        rows = self._db.execute("SELECT step, commit_time, admitted_at, finished_at FROM steps").fetchall()
        return {step: (commit, admitted, finished) for step, commit, admitted, finished in rows}


def gather(run_path: Path, now: float | None = None) -> dict[str, Any]:
    """Everything ``evald status`` shows, as plain JSON-able data. FileNotFoundError without a ledger."""
    run_path = Path(run_path)
    if not (run_path / LEDGER_FILE).exists():
        raise FileNotFoundError(f"{run_path / LEDGER_FILE} does not exist: no evald has served this run yet")
    now = time.time() if now is None else now
    identity = read_identity(run_path) or {}
    ckpt_dir = identity.get("ckpt_dir") or (str(run_path.parent) if IDENTITY_FILE not in os.listdir(run_path)
                                            and run_path.name == layout.EVALD_SUBDIR else None)
    ledger = ReadOnlyLedger(run_path / LEDGER_FILE)
    try:
        steps, files, times = ledger.steps(), ledger.files(), ledger.times()
        decisions = ledger.get_state("decisions", {}) or {}
        summarised = ledger.get_state("summarised")
        suites = ledger.cell_counts()
        superseded = sum(len(ledger.superseded(s.step)) for s in steps)
        suite_cells = {name: [{"step": c.step, "state": c.state, "identity": c.identity[:12], "reason": c.reason}
                              for c in ledger.cells(suite=name)] for name in suites}
        serving = ledger.get_state("serve")   # evald --serve's numbers (evald.daemon.serving), if it served
    finally:
        ledger.close()
    counts = {state: sum(1 for s in steps if s.state == state) for state in STATES}
    evaluated = [s for s in steps if s.state == EVALUATED]
    last = max(evaluated, key=lambda s: s.step, default=None)   # the newest step, not the latest to finish
    latest = max(evaluated, key=lambda s: (times[s.step][2] or 0, s.step), default=None)
    waiting = [s for s in steps if s.state in (QUEUED, EVALUATING)]
    oldest_wait = min((times[s.step][0] or times[s.step][1] for s in waiting), default=None)
    newest = max((s.step for s in steps), default=None)
    newest_evaluated = max((s.step for s in evaluated), default=None)
    early_stop, control = decisions.get("early_stop") or {}, decisions.get("control") or {}
    return {
        "run_dir": str(run_path), "run_name": run_path.name, "ckpt_dir": ckpt_dir,
        "run_id": _run_id(ckpt_dir) or control.get("run_id") or next((s.run_id for s in reversed(steps) if s.run_id),
                                                                     None),
        "served_by": lock_holder(run_path / LOCK_FILE),
        "checkpoints": counts, "total": len(steps),
        "failures": [{"step": s.step, "state": s.state, "file": s.source, "reason": s.reason}
                     for s in steps if s.state in (FAILED, DELETED)],
        "rejected_files": [{"file": name, "reason": reason} for name, step, status, reason in files
                           if status == REJECTED and step is None],
        "lag": {"steps": _lag_steps(waiting, newest_evaluated),
                "seconds": 0.0 if oldest_wait is None else max(0.0, now - oldest_wait),
                "newest_step": newest, "newest_evaluated_step": newest_evaluated},
        "last_evaluation": None if last is None else {"step": last.step, "metrics": last.metrics,
                                                      "finished_at": times[last.step][2]},
        "most_recent_evaluation": None if latest is None or latest is last else {"step": latest.step,
                                                                                 "why": latest.found_via},
        "best": {"step": early_stop.get("best_step"), "value": early_stop.get("best"),
                 "monitor": early_stop.get("monitor") or _best_pointer_monitor(run_path),
                 "mode": early_stop.get("mode")},
        "stop": _stop(control),
        "summarised": summarised is not None,
        "suites": {name: {"cells": counts_by_state, "steps": suite_cells[name]}
                   for name, counts_by_state in sorted(suites.items())},
        "superseded_results": superseded,
        "serving": serving,
    }


def _best_pointer_monitor(run_path: Path) -> str | None:
    """The monitor best.json names: a ledger written before the decisions recorded theirs."""
    try:
        monitor = json.loads((run_path / BEST_FILE).read_text()).get("monitor")
    except (OSError, ValueError, AttributeError):
        return None
    return monitor if isinstance(monitor, str) else None


def _stop(control: dict[str, Any]) -> dict[str, Any] | None:
    """The stop decision; advisory when the run had ended before it (the summary says so)."""
    if control.get("stop_at_step") is None:
        return None
    summary = control.get("summary") or {}
    advisory = not summary.get("stopped_early", True) if summary else False
    return {"at_step": control["stop_at_step"], "reason": control.get("stop_reason", ""), "advisory": advisory,
            "final_step": summary.get("final_step")}


def _lag_steps(waiting: list, newest_evaluated: int | None) -> int | None:
    """Steps between the newest evaluated one and the newest that still waits: 0 when nothing newer waits.
    A step skipped, failed or deleted waits for nothing, so it is no lag (evald.ledger.skips has its own)."""
    if newest_evaluated is None:
        return None
    newest_waiting = max((s.step for s in waiting), default=newest_evaluated)
    return max(0, newest_waiting - newest_evaluated)


def _run_id(ckpt_dir: str | None) -> str | None:
    text = layout.read_run_file(Path(ckpt_dir)) if ckpt_dir else None
    try:
        return announcement_from_json(text).run_id if text else None
    except (ProtocolError, OSError):
        return None


def lock_holder(lock_path: Path) -> dict[str, Any] | None:
    """The evald holding ``lock_path`` (pid, host, argv, since), or None when nobody serves the run."""
    try:
        fd = os.open(lock_path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        held = _in_proc_locks(os.fstat(fd))
        if held is None:  # the kernel's table cannot tell: probe without waiting, release at once
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                fcntl.flock(fd, fcntl.LOCK_UN)
                held = False
            except BlockingIOError:
                held = True
        if not held:
            return None
        try:
            return json.loads(os.pread(fd, 4096, 0) or b"{}")
        except ValueError:
            return {}
    finally:
        os.close(fd)


def _in_proc_locks(st: os.stat_result) -> bool | None:
    """True when /proc/locks lists a flock on this file; None when it cannot say."""
    try:
        table = Path("/proc/locks").read_text()
    except OSError:
        return None
    wanted = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in table.splitlines():
        parts = line.split()
        if "FLOCK" in parts and any(p == wanted for p in parts):
            return True
    return None  # not held here; another host may hold it


def render(info: dict[str, Any]) -> str:
    """The readable table ``evald status`` prints by default."""
    served = info["served_by"]
    who = (f"served by evald pid {served.get('pid')} on {served.get('host')}" if served is not None
           else "not served (no evald holds its lock)")
    lag = info["lag"]
    lines = [f"run          {info['run_name']}  ({info['run_dir']})",
             f"run id       {info['run_id'] or '-'}",
             f"checkpoints  {info['ckpt_dir'] or '-'}",
             f"evald        {who}",
             "",
             "state        " + "  ".join(f"{state} {info['checkpoints'][state]}" for state in STATES)
             + f"  (total {info['total']})",
             f"lag          {'-' if lag['steps'] is None else lag['steps']} steps "
             f"(newest {lag['newest_step']}, newest evaluated {lag['newest_evaluated_step']}); "
             f"oldest waiting checkpoint {lag['seconds']:.0f} s"]
    last = info["last_evaluation"]
    if last:
        shown = ", ".join(f"{k}={v:.4g}" for k, v in sorted((last["metrics"] or {}).items())
                          if k.startswith("eval/") and isinstance(v, (int, float)))  # all of them: --json
        since = info.get("most_recent_evaluation")
        if since:   # an older step evaluated after it: a retry, a backfill, a checkpoint found late
            shown += f" (evaluated since: step {since['step']}{', a retry' if since['why'] == RETRY else ''})"
        lines.append(f"last eval    step {last['step']}: {shown}")
    best, stop = info["best"], info["stop"]
    lines.append(f"best         {_best(best)}")
    if stop is None:
        lines.append("stop         -")
    elif stop.get("advisory"):
        lines.append(f"stop         none: decided after the run ended at step {stop['final_step']} (advisory, "
                     f"would have been step {stop['at_step']}): {stop['reason']}")
    else:
        lines.append(f"stop         at step {stop['at_step']}: {stop['reason']}")
    for name, suite in info.get("suites", {}).items():
        cells = "  ".join(f"{state} {n}" for state, n in sorted(suite["cells"].items()))
        waiting = [c["reason"] for c in suite.get("steps", []) if c["state"] == "queued" and c.get("reason")]
        lines.append(f"suite        {name}: {cells}" + (f" ({waiting[-1][:300]})" if waiting else ""))
    if info.get("superseded_results"):
        lines.append(f"superseded   {info['superseded_results']} earlier result(s) kept, not current "
                     f"(evald status --step N shows them)")
    serving = info.get("serving")
    if serving:
        where = serving.get("url", "-")
        if serving.get("stopped_at"):   # the endpoint stopped with evald: its URL answers nothing now
            where = (f"stopped {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(serving['stopped_at']))} "
                     f"(was {where})")
        lines.append(f"serving      {where}: {serving['served']:.0f} requests served, "
                     f"{serving['refused']:.0f} refused, {serving['busy']:.0f} busy (429), "
                     f"{serving['timed_out']:.0f} timed out; wait mean {serving['wait_s_mean']:.3f} s, "
                     f"max {serving['wait_s_max']:.3f} s; queue {serving['queue_depth']:.0f}; "
                     f"{serving['swaps']:.0f} swaps to serve a step the network did not hold")
    if info["failures"] or info["rejected_files"]:
        lines += ["", "failures (evald retry re-queues them)", "  step       state    file / reason"]
        lines += [f"  {f['step']:<10} {f['state']:<8} {f['file']}: {f['reason']}" for f in info["failures"]]
        lines += [f"  {'-':<10} rejected {f['file']}: {f['reason']}" for f in info["rejected_files"]]
    return "\n".join(lines)


def _best(best: dict[str, Any]) -> str:
    """``step 400: eval/loss 2.46537 (lower is better)``: the step, the metric it is best on, its value and
    which way is better, as the decisions recorded them."""
    if best["step"] is None:
        return "-"
    if not best.get("monitor"):
        return f"step {best['step']}: {_number(best['value'])} (its metric is not recorded)"
    direction = {"min": " (lower is better)", "max": " (higher is better)"}.get(best.get("mode") or "", "")
    return f"step {best['step']}: {best['monitor']} {_number(best['value'])}{direction}"


def _number(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, (int, float)) else str(value)
