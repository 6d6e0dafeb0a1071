"""``evald backfill --merge``: a backfill fleet's cell files taken into the run's ledger, each exactly once.

The fleet directory is input: its files are read under the one rule, their seals checked with the
run's fleet key (evald.daemon.fleet_key: a file written without the key is refused), and each cell checked
(evald.daemon.fleet_cells, evald.daemon.fleet_check) against the fleet's plan, the suite's identity and
the run's ledger (the step must be a retained checkpoint of the run; the cell's identity the run's
current identity of its suite) before anything of it is written. A bad entry or cell is reported (the
file, what it is or which field), counted, and skipped; the merge goes on with the others.

For each good cell: its per-sample files are written into the run directory (deterministic and atomic,
so writing them again changes no byte), then ONE ledger transaction (``Ledger.take_cell``) records the
cell with its TensorBoard record at the checkpoint's own step, unless the ledger already has it: a merge
run twice, a duplicated worker, or a file copied back all count a cell once. What it commits is
evald.daemon.cell_commit's, as for a cell the live loop evaluates (its samples' text made from its checked
tasks, not taken from the file), with ``fleet`` in its provenance. The records go out through
the ledger's outbox: the evald that serves the run writes them at its next tick; with none serving it,
the merge holds the run's lock and writes them itself (evald.sinks.tensorboard), one point per tag and step.

May import: ledger, sinks, contracts, and the daemon's cell_commit, fleet_cells, fleet_check, fleet_key, locks, run_dir.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from evald.daemon.fleet_cells import FleetFileError, printable, read_cell, read_plan, scan_cells
from evald.daemon.cell_commit import EvaluatedCell, TaskFilesRefused, cell_commit, write_cell_samples, write_layout
from evald.daemon.fleet_check import CellError, CheckedCell, check_cell
from evald.daemon.fleet_key import FleetKey
from evald.daemon.locks import InUse, Lock
from evald.daemon.run_dir import LEDGER_FILE, LOCK_FILE
from evald.ledger.ledger import DELETED, EVALUATED, FAILED, Ledger, Record
from evald.sinks import tensorboard_layout
from evald.sinks.tensorboard import TensorBoardSink

log = logging.getLogger("evald.fleet")
SHOWN = 20     # bad entries and conflicts listed by describe()


@dataclass
class MergeReport:
    taken: list[tuple[str, int]] = field(default_factory=list)
    already: int = 0
    conflicts: list[str] = field(default_factory=list)
    bad: list[str] = field(default_factory=list)       # each: the file (or entry) and what is wrong with it
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
            parts.append(f"{len(self.bad)} bad file(s) or entries, not taken")
        if self.written is not None:
            parts.append(f"{self.written} TensorBoard record(s) written")
        else:
            parts.append("the evald serving the run writes their TensorBoard points at its next tick")
        return "; ".join(parts)

    def details(self) -> list[str]:
        """What is wrong with each bad entry and conflict (at most SHOWN of each), one line each."""
        lines = [f"not taken: {line}" for line in self.bad[:SHOWN]]
        if len(self.bad) > SHOWN:
            lines.append(f"... and {len(self.bad) - SHOWN} more bad file(s)")
        lines += [f"conflict: {line}" for line in self.conflicts[:SHOWN]]
        if len(self.conflicts) > SHOWN:
            lines.append(f"... and {len(self.conflicts) - SHOWN} more conflict(s)")
        return lines


@dataclass
class _Run:
    """What the merge checks a cell against in the run's ledger: its steps, and each suite's current cell
    identities (a merge of cells of another identity would mix results of two suites in one curve)."""

    steps: set[int]
    identities: dict[str, set[str]]

    @classmethod
    def of(cls, ledger: Ledger) -> "_Run":
        identities: dict[str, set[str]] = {}
        for cell in ledger.cells():
            if cell.suite is not None:
                identities.setdefault(cell.suite, set()).add(cell.identity)
        return cls(set(ledger.step_numbers()), identities)


def merge(fleet_dir: Path, run_dir: Path, key: FleetKey) -> MergeReport:
    """Take the fleet's good cells, sealed with ``key``, into the run's ledger (module docstring). FleetFileError
    when the fleet directory has no usable plan (nothing can be checked without it: nothing is taken)."""
    plan = read_plan(fleet_dir, key)
    report = MergeReport()
    ledger = Ledger(run_dir / LEDGER_FILE)
    try:
        scan = scan_cells(fleet_dir)
        report.bad += scan.bad
        run = _Run.of(ledger)
        for relative in scan.cells:
            where = printable(str(Path(fleet_dir) / relative))
            try:
                cell = check_cell(read_cell(fleet_dir, relative, key), where, plan)
                outcome = _take(ledger, run_dir, cell, where, run)
            except FleetFileError as exc:
                report.bad.append(printable(str(exc)))
                log.error("%s", report.bad[-1])
                continue
            if outcome == "taken":
                report.taken.append((cell.suite, cell.step))
                run.identities.setdefault(cell.suite, set()).add(cell.cell_identity)
            elif outcome == "already":
                report.already += 1
            else:
                report.conflicts.append(outcome)
                log.error("%s", outcome)
        have = {(c.suite, c.step) for c in ledger.cells() if c.state != "queued" and c.state != "evaluating"}
        report.missing = [cell for cell in plan.cells() if cell not in have]
        report.written = _drain(run_dir, ledger)
    finally:
        ledger.close()
    return report


def _take(ledger: Ledger, run_dir: Path, cell: CheckedCell, where: str, run: _Run) -> str:
    """``taken``, ``already``, or the conflict's text; CellError when the run has no such checkpoint.
    Everything is checked before the first file is written."""
    suite, step, identity = cell.suite, cell.step, cell.cell_identity
    if step not in run.steps:
        raise CellError(f"{where}: 'step' {step} has no checkpoint in the run's ledger (not a retained checkpoint of "
                        f"this run); not taken")
    current = ledger.cell(step, suite)
    if current is not None and current.identity != identity:
        return (f"{where}: the run's current {suite} cell of step {step} has another identity ({current.identity}, "
                f"this file {identity}: the suite or the network changed since the fleet ran)")
    known = run.identities.get(suite, set())
    if known and identity not in known:
        return (f"{where}: the run's current {suite} cells have identity {', '.join(sorted(known))}, this file "
                f"{identity} (the suite or the network changed since the fleet ran)")
    if current is not None and (current.state == EVALUATED or (cell.state != EVALUATED
                                                                and current.state in (FAILED, DELETED))):
        return "already"
    wall_time = cell.commit_time or time.time()
    if cell.state != EVALUATED:
        return ledger.take_cell(step, suite, identity, cell.state, reason=cell.reason, record=Record(
            "eval", step, wall_time, {}, {f"evald/suites/{suite}/failed": cell.reason or ""}))
    assert cell.identity is not None and cell.identity_sha256 is not None and cell.scalars is not None
    evaluated = EvaluatedCell(suite, cell.identity, cell.identity_sha256, cell.scalars,
                              {task.name: task for task in cell.tasks}, cell.timing or {},
                              {**(cell.provenance or {}), "fleet": True})
    try:   # before the transaction: a crash here writes the same bytes again
        write_cell_samples(run_dir, evaluated, step=step, cell_identity=identity)
    except TaskFilesRefused as exc:
        raise CellError(f"{where}: tasks[{exc.task!r}]: its per-sample files are refused ({exc.cause})") from None
    commit = cell_commit(evaluated, step=step, cell_identity=identity, wall_time=wall_time,
                         layout_state=ledger.get_state(tensorboard_layout.LAYOUT_STATE))
    write_layout(ledger, commit.layout)
    return ledger.take_cell(step, suite, identity, EVALUATED, metrics=commit.metrics, record=commit.record,
                            provenance=commit.provenance)


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
