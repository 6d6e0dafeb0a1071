"""A backfill fleet's worker: its share of the plan's snapshots, each loaded once, all its cells run on it.

A fleet is N workers started by an engine the team already runs (a Slurm job array, a Kubernetes
Indexed Job), each with its index. The plan (evald.daemon.fleet_cells) lists the retained
checkpoints that lack a cell of the backfilled suites, fixed once by the first worker from the
ledger (or beforehand by ``evald backfill --plan``); worker I takes every N-th snapshot from
position I, so the shares are deterministic and disjoint whatever the order in which workers start
or restart. For each snapshot of its share that still lacks a cell file, the worker swaps the
weights in ONCE and runs every missing suite on them, writing each finished cell as a sealed file.
It never writes the ledger: ``evald backfill --merge`` (evald.daemon.fleet_merge) takes the files
in exactly once. Killed at any point, it loses at most the cell it was running: a rerun of its
index skips the cells whose files exist and finishes the share.

May import: ledger, pipeline, config, contracts, and the daemon's cell_commit, fleet_cells, fleet_key, suite_turn.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from evald.config import EvaldConfig
from evald.daemon.cell_commit import samples_text
from evald.daemon.fleet_cells import Journal, Plan, Snapshot, cell_done, publish_plan, write_cell
from evald.daemon.fleet_key import FleetKey
from evald.daemon.suite_turn import backfill_steps
from evald.ledger.ledger import EVALUATED, Ledger, Step
from evald.pipeline.pipeline import Failed, Pipeline, Retry, SuiteEvaluated

log = logging.getLogger("evald.fleet")


class FleetError(RuntimeError):
    """The worker cannot run (no network, a suite not configured, a plan of other suites); says why."""


def make_plan(ledger: Ledger, ckpt_dir: Path, suites: Sequence[str], span: tuple[int, int] | None,
              every: int | None) -> Plan:
    """The retained checkpoints that lack a current evaluated cell of any of ``suites`` (a step the lag policy
    skipped included: a suite's cell does not need the step's validation)."""
    rows = {row.step: row for row in ledger.steps()}
    snapshots = []
    for step in backfill_steps(ledger, ckpt_dir, span, every):
        missing = tuple(s for s in sorted(suites) if (cell := ledger.cell(step, s)) is None
                        or cell.state != EVALUATED)
        if missing:
            row = rows[step]
            snapshots.append(Snapshot(step, row.source, row.kind, row.commit_time, missing))
    return Plan(tuple(sorted(suites)), tuple(snapshots))


def fleet_plan(fleet_dir: Path, suites: Sequence[str], candidate: Plan | None, key: FleetKey) -> Plan:
    """The fleet's plan: the one in ``fleet_dir``, else ``candidate`` published as it (sealed with ``key``)."""
    from evald.daemon.fleet_cells import PLAN_FILE, plan_exists, read_plan

    if plan_exists(fleet_dir) or candidate is None:
        plan = read_plan(fleet_dir, key)
    else:
        plan = publish_plan(fleet_dir, candidate, key)
    if set(plan.suites) != set(suites):
        raise FleetError(f"{fleet_dir / PLAN_FILE} is the plan of suite(s) {', '.join(plan.suites)}, not "
                         f"{', '.join(sorted(suites))}: give each backfill its own --fleet-dir")
    return plan


@dataclass
class WorkerReport:
    index: int
    count: int
    snapshots: int = 0              # snapshots in the share
    loads: int = 0                  # snapshots this process swapped in
    evaluated: list[tuple[str, int]] = field(default_factory=list)
    failed: list[tuple[str, int, str]] = field(default_factory=list)
    already: int = 0                # cells whose file existed (an earlier run of this index, or a duplicate)
    retry: list[tuple[str, int, str]] = field(default_factory=list)   # raised unexpectedly: rerun the index

    def describe(self) -> str:
        return (f"worker {self.index} of {self.count}: {self.snapshots} snapshot(s) in its share, {self.loads} "
                f"loaded; {len(self.evaluated)} cell(s) evaluated, {len(self.failed)} failed, {self.already} "
                f"already done" + (f", {len(self.retry)} raised unexpectedly (rerun this index)" if self.retry
                                   else ""))


def run_worker(config: EvaldConfig, ckpt_dir: Path, fleet_dir: Path, plan: Plan, index: int,
               count: int, key: FleetKey) -> WorkerReport:
    """Evaluate worker ``index``'s share of ``plan``; each finished cell written as a file sealed with ``key``."""
    report = WorkerReport(index, count)
    share = plan.share(index, count)
    report.snapshots = len(share)
    journal = Journal(fleet_dir, index)
    journal.note("start", count=count, snapshots=[s.step for s in share])
    pipeline: Pipeline | None = None
    for snapshot in share:
        if pipeline is None:   # built only when some cell is left: a finished index exits in a second
            pipeline = _built(config, plan)
            todo = _todo(pipeline, fleet_dir, snapshot, key)
            if not todo:
                report.already += len(snapshot.suites)
                continue
        else:
            todo = _todo(pipeline, fleet_dir, snapshot, key)
        report.already += len(snapshot.suites) - len(todo)
        if not todo:
            continue
        row = Step(snapshot.step, EVALUATED, snapshot.source, snapshot.kind, None, snapshot.commit_time, "fleet",
                   None, 0, None)
        for suite in todo:
            if pipeline.loaded_step != snapshot.step:   # evaluate_suite swaps the weights in exactly then
                report.loads += 1
                journal.note("load", step=snapshot.step)
            _run_cell(pipeline, ckpt_dir, fleet_dir, row, suite, report, journal, key)
    journal.note("done", report=report.describe())
    return report


def _built(config: EvaldConfig, plan: Plan, pipeline: Pipeline | None = None) -> Pipeline:
    """The network and every suite of the plan, built before the first cell (a test passes its own Pipeline)."""
    pipeline = pipeline or Pipeline(should_abort=lambda: False)
    if not pipeline.ensure_built(config):
        raise FleetError(f"cannot build the evaluation network: {pipeline.blocked_reason}")
    while pipeline.build_next_suite():  # a worker validates nothing: its suites are built at once, not lazily
        pass
    for suite in plan.suites:
        if suite not in pipeline.suites:
            raise FleetError(pipeline.suite_errors.get(suite) or f"suite {suite} is not configured ([suites."
                             f"{suite}] in evald's configuration, given after --)")
    return pipeline


def _todo(pipeline: Pipeline, fleet_dir: Path, snapshot: Snapshot, key: FleetKey) -> list[str]:
    built = pipeline.suites
    return [s for s in snapshot.suites if not cell_done(fleet_dir, s, snapshot.step, built[s].cell_identity, key)]


def _run_cell(pipeline: Pipeline, ckpt_dir: Path, fleet_dir: Path, row: Step, suite: str, report: WorkerReport,
              journal: Journal, key: FleetKey) -> None:
    runner = pipeline.suites.get(suite)
    assert runner is not None, f"suite {suite} is built (_built checked the plan's suites)"
    started = time.time()
    outcome = pipeline.evaluate_suite(suite, ckpt_dir, row)
    base = {"suite": suite, "step": row.step, "cell_identity": runner.cell_identity, "source": row.source,
            "commit_time": row.commit_time}
    if isinstance(outcome, SuiteEvaluated):
        result = outcome.result
        write_cell(fleet_dir, {
            **base, "state": EVALUATED, "identity": result.identity, "identity_sha256": result.identity_sha256,
            "provenance": outcome.provenance, "scalars": result.scalars(),
            "tasks": {task: {"metrics": r.metrics, "samples": r.samples} for task, r in result.tasks.items()},
            "samples_text": samples_text(result.tasks),
            "timing": {"evaluate_s": result.evaluate_s, "load_s": outcome.load_s,
                       "compiled_graphs": result.compiled_graphs, "tokens": result.tokens}}, key)
        report.evaluated.append((suite, row.step))
        journal.note("cell", suite=suite, step=row.step, state=EVALUATED, seconds=time.time() - started)
        log.info("worker %d: step %d suite %s evaluated", report.index, row.step, suite)
    elif isinstance(outcome, Failed):
        write_cell(fleet_dir, {**base, "state": outcome.state, "reason": outcome.reason}, key)
        report.failed.append((suite, row.step, outcome.reason))
        journal.note("cell", suite=suite, step=row.step, state=outcome.state)
        log.error("worker %d: step %d suite %s not evaluated (%s): %s", report.index, row.step, suite,
                  outcome.state, outcome.reason)
    else:
        assert isinstance(outcome, Retry)
        report.retry.append((suite, row.step, outcome.reason))
        journal.note("cell", suite=suite, step=row.step, state="retry", reason=outcome.reason)
