"""``evald backfill --merge``: a backfill fleet's cell files taken into the run's ledger, each exactly once.

For each sealed cell file (evald.daemon.fleet_cells): its per-sample files are written into the run
directory (deterministic and atomic, so writing them again changes no byte), then ONE ledger
transaction (``Ledger.take_cell``) records the cell with its TensorBoard record at the checkpoint's
own step, unless the ledger already has it: a merge run twice, a duplicated worker, or a file
copied back all count a cell once. The records go out through the ledger's outbox: the evald that
serves the run writes them at its next tick; with none serving it, the merge holds the run's lock
and writes them itself (evald.sinks.tensorboard), one point per tag and step.

May import: ledger, sinks, contracts, and the daemon's fleet_cells, locks, run_dir.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from evald.daemon.fleet_cells import FleetFileError, cell_files, read_cell, read_plan, PLAN_FILE
from evald.daemon.locks import InUse, Lock
from evald.daemon.run_dir import LEDGER_FILE, LOCK_FILE
from evald.ledger.ledger import EVALUATED, Ledger, Record
from evald.ledger.samples import write_samples
from evald.sinks.tensorboard import TensorBoardSink

log = logging.getLogger("evald.fleet")


@dataclass
class MergeReport:
    taken: list[tuple[str, int]] = field(default_factory=list)
    already: int = 0
    conflicts: list[str] = field(default_factory=list)
    bad: list[str] = field(default_factory=list)
    missing: list[tuple[str, int]] = field(default_factory=list)   # planned cells with no file yet
    written: int | None = None      # TensorBoard records written by the merge (None: the serving evald writes them)

    def describe(self) -> str:
        parts = [f"{len(self.taken)} cell(s) taken in", f"{self.already} already in the ledger"]
        if self.missing:
            shown = ", ".join(f"{suite}@{step}" for suite, step in self.missing[:20])
            parts.append(f"{len(self.missing)} planned cell(s) have no file yet ({shown}): rerun their workers")
        if self.conflicts:
            parts.append(f"{len(self.conflicts)} of another suite identity, not taken")
        if self.bad:
            parts.append(f"{len(self.bad)} unreadable file(s), not taken")
        if self.written is not None:
            parts.append(f"{self.written} TensorBoard record(s) written")
        else:
            parts.append("the evald serving the run writes their TensorBoard points at its next tick")
        return "; ".join(parts)


def merge(fleet_dir: Path, run_dir: Path) -> MergeReport:
    report = MergeReport()
    ledger = Ledger(run_dir / LEDGER_FILE)
    try:
        for path in cell_files(fleet_dir):
            try:
                body = read_cell(path)
            except FleetFileError as exc:
                report.bad.append(str(exc))
                log.error("%s", exc)
                continue
            outcome = _take(ledger, run_dir, body)
            if outcome == "taken":
                report.taken.append((body["suite"], int(body["step"])))
            elif outcome == "already":
                report.already += 1
            else:
                report.conflicts.append(f"{path}: the run's current {body['suite']} cell of step {body['step']} has "
                                        f"another identity (the suite changed since the fleet ran)")
                log.error("%s", report.conflicts[-1])
        if (fleet_dir / PLAN_FILE).exists():
            plan = read_plan(fleet_dir)
            have = {(c.suite, c.step) for c in ledger.cells() if c.state != "queued" and c.state != "evaluating"}
            report.missing = [cell for cell in plan.cells() if cell not in have]
        report.written = _drain(run_dir, ledger)
    finally:
        ledger.close()
    return report


def _take(ledger: Ledger, run_dir: Path, body: dict) -> str:
    suite, step, identity = body["suite"], int(body["step"]), body["cell_identity"]
    now = time.time()
    wall_time = body.get("commit_time") or now
    if body["state"] != EVALUATED:
        reason = body.get("reason") or "failed in a fleet worker"
        return ledger.take_cell(step, suite, identity, body["state"], reason=reason, record=Record(
            "eval", step, wall_time, {}, {f"evald/suites/{suite}/failed": reason}))
    for task, result in body["tasks"].items():   # before the transaction: a crash here writes the same bytes again
        write_samples(run_dir, suite=suite, task=task, step=step, identity=body["identity"],
                      identity_sha256=body["identity_sha256"], cell_identity=identity, metrics=result["metrics"],
                      samples=result["samples"])
    scalars = {k: float(v) for k, v in body["scalars"].items()}
    timing = body.get("timing", {})
    bookkeeping = {f"evald/suites/{suite}/{key}": float(timing[key]) for key in ("evaluate_s", "load_s",
                                                                                 "compiled_graphs") if key in timing}
    texts = {f"{suite}/samples": body.get("samples_text", ""),
             f"evald/suites/{suite}/identity": f"suite identity `{body['identity_sha256']}`, cell `{identity}`, "
                                               f"lm-eval {body['identity'].get('lm_eval')}; evaluated by a backfill "
                                               f"fleet worker"}
    return ledger.take_cell(step, suite, identity, EVALUATED, metrics=scalars,
                            record=Record("eval", step, wall_time, {**scalars, **bookkeeping}, texts),
                            provenance={"identity": body["identity"], "identity_sha256": body["identity_sha256"],
                                        **(body.get("provenance") or {}), "fleet": True})


def _drain(run_dir: Path, ledger: Ledger) -> int | None:
    """Write the outbox's pending records when no evald serves the run (holding its lock meanwhile)."""
    try:
        lock = Lock(run_dir / LOCK_FILE, f"run directory {run_dir}", "wait for it")
    except InUse:
        return None
    try:
        sink = TensorBoardSink(run_dir, ledger)
        try:
            return sink.drain()
        finally:
            sink.close()
    finally:
        lock.release()
