"""A fleet's hand-over files: the plan's shares, sealed cell files, and the merge's exactly-once take-in."""

from __future__ import annotations

import json

import pytest

from evald.daemon.fleet_cells import (FleetFileError, Plan, Snapshot, cell_done, cell_files, cell_path, publish_plan,
                                      read_cell, read_plan, write_cell)
from evald.daemon.fleet_key import FleetKey
from evald.ledger.ledger import EVALUATED, FAILED, Ledger, Record

KEY = FleetKey(b"0123456789abcdef" * 4, "a test key")


def _plan(steps=range(10, 110, 10), suites=("a", "b")) -> Plan:
    return Plan(tuple(suites), tuple(Snapshot(s, f"step_{s:09d}", "evald", 1.0 * s, tuple(suites)) for s in steps))


@pytest.mark.parametrize("count", [1, 2, 3, 4, 11])
def test_the_shares_are_disjoint_cover_the_plan_and_keep_a_snapshot_whole(count):
    plan = _plan()
    shares = [plan.share(i, count) for i in range(count)]
    steps = [s.step for share in shares for s in share]
    assert sorted(steps) == [s.step for s in plan.snapshots] and len(set(steps)) == len(steps)
    assert all(s.suites == ("a", "b") for share in shares for s in share)     # all its cells with it
    assert shares == [plan.share(i, count) for i in range(count)]             # deterministic


def test_the_first_plan_published_is_the_fleets_plan(tmp_path):
    first = publish_plan(tmp_path, _plan(range(10, 40, 10)), KEY)
    second = publish_plan(tmp_path, _plan(range(10, 90, 10)), KEY)   # a later worker saw more checkpoints
    assert first == second == read_plan(tmp_path, KEY) and len(second.snapshots) == 3
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]


def _body(step=10, suite="a", identity="c" * 64):
    return {"suite": suite, "step": step, "cell_identity": identity, "state": EVALUATED, "commit_time": 5.0,
            "scalars": {f"{suite}/t/acc": 0.5}, "tasks": {}}


def test_a_cell_file_is_sealed_and_a_torn_or_altered_one_is_refused(tmp_path):
    path = write_cell(tmp_path, _body(), KEY)
    relative = path.relative_to(tmp_path).as_posix()
    assert path == cell_path(tmp_path, "a", 10, "c" * 64) and read_cell(tmp_path, relative, KEY)["scalars"] == {"a/t/acc": 0.5}
    assert cell_done(tmp_path, "a", 10, "c" * 64, KEY) and not cell_done(tmp_path, "a", 20, "c" * 64, KEY)
    data = json.loads(path.read_text())
    data["body"]["scalars"]["a/t/acc"] = 0.9
    path.write_text(json.dumps(data))
    with pytest.raises(FleetFileError, match="seal does not match the fleet's key"):
        read_cell(tmp_path, relative, KEY)
    assert not cell_done(tmp_path, "a", 10, "c" * 64, KEY)              # evaluated again by a rerun
    path.write_text(path.read_text()[:40])
    with pytest.raises(FleetFileError, match="not JSON"):
        read_cell(tmp_path, relative, KEY)
    moved = write_cell(tmp_path, _body(step=20), KEY)
    moved.rename(moved.with_name("step_30." + "c" * 12 + ".json"))
    with pytest.raises(FleetFileError, match="name does not match"):
        read_cell(tmp_path, "cells/a/step_30." + "c" * 12 + ".json", KEY)
    assert len(cell_files(tmp_path)) == 2


def test_the_ledger_takes_a_cell_in_once(tmp_path):
    ledger = Ledger(tmp_path / "ledger.sqlite")
    record = Record("eval", 10, 1.0, {"a/t/acc": 0.5}, {})
    assert ledger.take_cell(10, "a", "id1", EVALUATED, metrics={"a/t/acc": 0.5}, record=record) == "taken"
    assert ledger.take_cell(10, "a", "id1", EVALUATED, metrics={"a/t/acc": 0.5}, record=record) == "already"
    assert ledger.take_cell(10, "a", "id1", FAILED, reason="x") == "already"
    assert ledger.take_cell(10, "a", "id2", EVALUATED, metrics={"a/t/acc": 0.1}, record=record) == "conflict"
    assert len(ledger.pending_records()) == 1
    cell = ledger.cell(10, "a")
    assert (cell.state, cell.identity, cell.metrics) == (EVALUATED, "id1", {"a/t/acc": 0.5})
    ledger.queue_cells("a", "id1", [20])          # queued by evald's own backfill: the fleet's result finishes it
    assert ledger.take_cell(20, "a", "id1", EVALUATED, metrics={"a/t/acc": 0.7}) == "taken"
    assert ledger.cell(20, "a").state == EVALUATED and len(ledger.cells(suite="a")) == 2
    ledger.close()


def test_the_plan_covers_a_step_the_lag_policy_skipped(tmp_path):
    """make_plan looked each covered step up among the evaluated ones only: a retained step the lag policy had
    skipped (which plan_backfill covers) ended `evald backfill --fleet-dir ... --plan` in a KeyError."""
    from evald.daemon.fleet import make_plan

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    ledger = Ledger(tmp_path / "ledger.sqlite")
    for step in (10, 20):
        (ckpt / f"step_{step}").mkdir()
        ledger.admit(name=f"step_{step}", step=step, kind="evald", found_via="scan", run_id="r", commit_time=1.0)
    ledger.start(20, [(10, "superseded by step 20 (lag policy latest)")])
    ledger.finish(20, EVALUATED, metrics={"eval/loss": 1.0}, identity="v" * 64, record=Record("eval", 20, 1.0, {}, {}))
    plan = make_plan(ledger, ckpt, ["mc"], None, None)
    ledger.close()
    assert [(s.step, s.source, s.suites) for s in plan.snapshots] == [(10, "step_10", ("mc",)), (20, "step_20", ("mc",))]
