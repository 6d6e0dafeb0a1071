"""Issue 36 item 3: one suite cell commits the same records whichever process evaluated it. The same result
goes once through the live loop (suite_turn.evaluate_cells) and once through a backfill fleet (its worker's
cell file, then ``evald backfill --merge``); both ledgers then hold the same records (the scalars with the
bookkeeping points, tokens_per_s among them; the texts; the Custom Scalars layout) and both run directories
the same TensorBoard tags. Before, the fleet's copy of the commit lacked tokens_per_s and the layout update,
and wrote other texts."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("mindspore")   # the suite runner's result types come with the scoring engine

from evald.daemon import fleet, suite_turn
from evald.daemon.fleet_cells import Plan, Snapshot, publish_plan
from evald.daemon.fleet_merge import merge
from evald.ledger.ledger import EVALUATED, Ledger
from evald.ledger.samples import identity_digest
from evald.pipeline.pipeline import SuiteEvaluated
from evald.pipeline.suites.runner import SuiteResult, TaskResult
from evald.sinks import tensorboard_layout
from evald.sinks.tensorboard import TensorBoardSink
from tests.harness import event_files
from tests.unit.daemon.fleet_files import make_run, run_key

STEP = 20
NETWORK = "0123456789abcdef"      # the cell identity's network half


def _result() -> SuiteResult:
    identity = {"suite": "mc", "lm_eval": "0.4.13", "tasks": {"t": {"documents": 3}, "u": {"documents": 3}},
                "num_fewshot": 0}
    samples = [{"doc_id": i, "target": str(i % 2), "resps": [[-1.5 - i, True], [-2.0, False]],
                "metrics": {"acc": float(i % 2)}} for i in range(3)]
    tasks = {name: TaskResult(name, {"acc": acc, "acc_stderr": 0.1}, samples, len(samples))
             for name, acc in (("t", 1 / 3), ("u", 2 / 3))}
    return SuiteResult("mc", identity, identity_digest(identity), tasks, evaluate_s=2.5, compiled_graphs=4,
                       tokens=1000)


class OneSuite:
    """Stands in for the pipeline of both processes: suite ``mc`` built, every cell evaluated as ``result``."""

    def __init__(self, result: SuiteResult) -> None:
        self.result, self.loaded_step = result, None
        self.suites = {"mc": SimpleNamespace(cell_identity=f"{result.identity_sha256}.{NETWORK}",
                                             options=SimpleNamespace(every_k=1), identity={"tokenizer": "t" * 64})}
        self.suite_errors: dict[str, str] = {}
        self.suites_pending: tuple[str, ...] = ()

    def evaluate_suite(self, name, ckpt_dir, row):
        self.loaded_step = row.step
        return SuiteEvaluated(self.result, 0.25, {"weights_sha256": "ab" * 32})


def _records(run: Path) -> list[tuple]:
    """The cell's records in the run's ledger (not the validation's, which make_run wrote), then the cell's
    metrics and provenance (but the fleet's mark)."""
    ledger = Ledger(run / "ledger.sqlite")
    try:
        records = ledger.records(["eval", tensorboard_layout.LAYOUT_STREAM])
        [cell] = [c for c in ledger.cells(suite="mc") if c.step == STEP]
        assert cell.state == EVALUATED
    finally:
        ledger.close()
    with sqlite3.connect(f"file:{run / 'ledger.sqlite'}?mode=ro", uri=True) as db:
        [(stored,)] = db.execute("SELECT provenance FROM cells WHERE step=? AND evaluation LIKE '%mc'", (STEP,))
    provenance = {k: v for k, v in json.loads(stored).items() if k != "fleet"}
    return [(r.stream, r.step, r.wall_time, dict(r.scalars), dict(r.texts)) for r in records
            if "eval/loss" not in r.scalars] + [("cell", cell.metrics, provenance)]


def _tags(run: Path) -> set[tuple[str, str]]:
    """Every (sub-run, tag) of the run directory's event files, read raw."""
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto import event_pb2

    return {(sub_run, value.tag) for sub_run, path in event_files(run) for raw in RawEventFileLoader(str(path)).Load()
            for value in event_pb2.Event.FromString(raw).summary.value}


def test_the_live_cell_and_the_fleet_merge_commit_the_same_records_and_tags(tmp_path, monkeypatch):
    result = _result()
    pipeline = OneSuite(result)
    cell_identity = pipeline.suites["mc"].cell_identity
    (tmp_path / "live").mkdir()
    (tmp_path / "fleet").mkdir()

    live = make_run(tmp_path / "live")
    ledger = Ledger(live / "ledger.sqlite")
    try:
        ledger.queue_cells("mc", cell_identity, [STEP])
        assert suite_turn.evaluate_cells(ledger, pipeline, tmp_path / "ckpt", live, max_attempts=3, step=STEP)
        TensorBoardSink(live, ledger).drain()    # what the serving evald's sink writes at its next tick
    finally:
        ledger.close()

    merged = make_run(tmp_path / "fleet")
    key = run_key(merged)
    fleet_dir = tmp_path / "fleet" / "cells"
    plan = publish_plan(fleet_dir, Plan(("mc",), (Snapshot(STEP, f"step_{STEP}", "evald", 1.0, ("mc",)),)), key)
    monkeypatch.setattr(fleet, "_built", lambda config, plan: pipeline)   # the worker's network: the stand-in
    assert fleet.run_worker(None, tmp_path / "ckpt", fleet_dir, plan, 0, 1, key).evaluated == [("mc", STEP)]
    assert merge(fleet_dir, merged, key).taken == [("mc", STEP)]        # the merge writes TensorBoard itself

    live_records, fleet_records = _records(live), _records(merged)
    scalars = live_records[1][3]
    assert "evald/suites/mc/tokens_per_s" in scalars and scalars["evald/suites/mc/tokens_per_s"] == 1000 / 2.5
    assert [r[0] for r in live_records] == ["layout", "eval", "cell"]
    assert fleet_records == live_records
    tags = _tags(live)
    assert ("eval", "evald/suites/mc/tokens_per_s") in tags
    assert any(tag == tensorboard_layout.LAYOUT_TAG for _, tag in tags)
    assert _tags(merged) == tags
