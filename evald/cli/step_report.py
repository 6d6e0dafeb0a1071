"""``evald status --step N``: what happened to step N, from the ledger alone (read-only).

Evaluated (with its metrics, their standard errors and its provenance), skipped or failed
(with the reason, starting with the same category as the ``evald/skipped`` text in
TensorBoard), still waiting, or never seen, and for each the lag recorded when it was decided.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from evald.cli.status import ReadOnlyLedger
from evald.contracts import layout
from evald.daemon.run_dir import LEDGER_FILE
from evald.pipeline.metrics.uncertainty import SE_SUFFIX, se_tag


def describe(run_path: Path, step: int, ckpt_dir: str | None = None) -> dict[str, Any]:
    ledger = _Ledger(Path(run_path) / LEDGER_FILE)
    try:
        row = ledger.step(step)
        files = [{"file": name, "status": status, "reason": reason}
                 for name, file_step, status, reason in ledger.files() if file_step == step]
        try:
            provenance = ledger.provenance(step)
        except sqlite3.OperationalError:  # a ledger from before provenance was recorded
            provenance = None
        told = ledger.told(step)
        suites = [{"suite": c.suite, "state": c.state, "identity": c.identity[:12], "cell_identity": c.identity,
                   "reason": c.reason,
                   "metrics": c.metrics} for c in ledger.cells() if c.step == step]
        superseded = [{"evaluation": c.evaluation, "state": c.state, "identity": c.identity, "reason": c.reason,
                       "metrics": c.metrics, "superseded_by": c.superseded_by} for c in ledger.superseded(step)]
    finally:
        ledger.close()
    on_disk = None if ckpt_dir is None else (Path(ckpt_dir) / layout.step_dir_name(step)).exists()
    if row is None:
        return {"step": step, "state": None, "files": files, "on_disk": on_disk}
    return {"step": step, "state": row.state, "source": row.source, "found_via": row.found_via,
            "reason": row.reason, "attempts": row.attempts, "metrics": row.metrics, "files": files,
            "provenance": provenance, "tensorboard": told, "on_disk": on_disk, "suites": suites,
            "superseded": superseded}


class _Ledger(ReadOnlyLedger):
    def told(self, step: int) -> dict[str, Any]:
        """What the eval record(s) of this step told TensorBoard (evald's own tags: lag, skips, decision)."""
        told: dict[str, Any] = {}
        rows = self._db.execute("SELECT payload FROM records WHERE step=? AND stream='eval' ORDER BY id", (step,))
        for (payload,) in rows:
            data = json.loads(payload)
            told.update({k: v for k, v in data.get("scalars", {}).items() if k.startswith("evald/lag")})
            told.update({k: v for k, v in data.get("texts", {}).items()
                         if k in ("evald/skipped", "evald/decision", "evald/comparability")})
        return told


def render(info: dict[str, Any]) -> str:
    step = info["step"]
    if info["state"] is None:
        where = {None: "", True: "; a step_N directory of it is in the checkpoint directory now",
                 False: "; no step_N directory of it is in the checkpoint directory"}[info["on_disk"]]
        lines = [f"step {step}: evald has no record of it: no checkpoint of this step was found{where}"]
        lines += [f"  file {f['file']}: {f['status']}: {f['reason']}" for f in info["files"]]
        return "\n".join(lines)
    lines = [f"step {step}: {info['state']} (read from {info['source']}, found via {info['found_via']}, "
             f"{info['attempts']} attempt(s))"]
    told = info["tensorboard"]
    if "evald/skipped" in told:
        lines.append(f"  skipped     {told['evald/skipped']}")
    elif info["reason"]:
        lines.append(f"  reason      {info['reason']}")
    metrics = info["metrics"] or {}
    for name, value in sorted(metrics.items()):
        if name.startswith("eval/") and not name.endswith(SE_SUFFIX) and isinstance(value, (int, float)):
            se = metrics.get(se_tag(name))
            lines.append(f"  {name:<22}{value:.6g}" + (f" ± {se:.2g}" if isinstance(se, (int, float)) else ""))
    if "evald/decision" in told:
        lines.append(f"  decision    {told['evald/decision']}")
    if "evald/lag_steps" in told:
        lag_s = told.get("evald/lag_s")
        lines.append(f"  lag         {told['evald/lag_steps']:.0f} steps" + (f", {lag_s:.1f} s" if lag_s is not None
                                                                            else "") + " when decided")
    provenance = info["provenance"]
    if provenance:
        lines += [f"  weights     {provenance['weights_sha256']} ({provenance['weights_digest_of']})",
                  f"  run         {provenance['run_id']}",
                  f"  subset      {provenance['subset_sha256']}",
                  f"  config      {provenance['config_sha256']}",
                  f"  hot swap    {provenance['swap_check']}"]
    if "evald/comparability" in told:
        lines.append(f"  comparable  {told['evald/comparability']}")
    lines += [f"  file        {f['file']}: {f['status']}" + (f": {f['reason']}" if f["reason"] else "")
              for f in info["files"] if f["status"] != "used"]
    for cell in info.get("suites", []):
        shown = ", ".join(f"{k}={v:.4g}" for k, v in sorted((cell["metrics"] or {}).items())
                          if not k.endswith("_stderr"))
        lines.append(f"  suite       {cell['suite']}: {cell['state']}" + (f": {shown}" if shown else "")
                     + (f" ({cell['reason']})" if cell["state"] != "evaluated" and cell["reason"] else ""))
    for old in info.get("superseded", []):
        shown = ", ".join(f"{k}={v:.4g}" for k, v in sorted((old["metrics"] or {}).items())
                          if k.startswith("eval/") and not k.endswith(SE_SUFFIX)) or old["reason"] or ""
        lines.append(f"  superseded  {old['evaluation']} {old['state']} (identity {old['identity'][:12]}, "
                     f"replaced by {old['superseded_by'][:12]}): {shown}")
    return "\n".join(lines)
