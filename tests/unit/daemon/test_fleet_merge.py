"""`evald backfill --merge` on hand-made cell files and a real ledger: each cell taken in once, its
per-sample files and its TensorBoard points at its own step; missing, torn and conflicting files said."""

from __future__ import annotations

from evald.daemon.fleet_cells import Plan, Snapshot, cell_path, publish_plan, write_cell
from evald.daemon.fleet_merge import merge
from evald.ledger.ledger import EVALUATED, Ledger
from tests.harness import raw_scalar_steps
from tests.unit.daemon.fleet_files import body, make_run, run_key


def _plan(fleet, key, steps=(10, 20, 30)):
    publish_plan(fleet, Plan(("mc",), tuple(Snapshot(s, f"step_{s}", "evald", None, ("mc",)) for s in steps)), key)


def test_each_cell_is_taken_in_once_with_its_points_at_its_step(tmp_path):
    run, fleet = make_run(tmp_path), tmp_path / "fleet"
    key = run_key(run)
    _plan(fleet, key, (30, 10, 20))
    for step in (30, 10):
        write_cell(fleet, body(step, step / 100), key)
    first = merge(fleet, run, key)
    assert sorted(first.taken) == [("mc", 10), ("mc", 30)] and first.missing == [("mc", 20)]
    assert first.written == 3          # the two cells' records and the Custom Scalars layout (issue 36 item 3)
    assert raw_scalar_steps(run, "eval/mc/t/acc") == [10, 30]
    write_cell(fleet, body(20, 0.2), key)            # the rerun worker's cell
    second = merge(fleet, run, key)
    assert second.taken == [("mc", 20)] and second.already == 2 and not second.missing
    assert merge(fleet, run, key).already == 3                                   # a merge again writes nothing
    assert raw_scalar_steps(run, "eval/mc/t/acc") == [10, 20, 30]          # one point per step
    ledger = Ledger(run / "ledger.sqlite")
    assert [(c.step, c.state, c.metrics["mc/t/acc"]) for c in ledger.cells(suite="mc")] == [
        (10, EVALUATED, 0.1), (20, EVALUATED, 0.2), (30, EVALUATED, 0.3)]
    ledger.close()
    assert len(list((run / "samples" / "mc" / "t").glob("step_*.jsonl.gz"))) == 3


def test_a_torn_file_and_another_identity_are_refused_not_merged(tmp_path):
    run, fleet = make_run(tmp_path), tmp_path / "fleet"
    key = run_key(run)
    _plan(fleet, key)
    write_cell(fleet, body(10, 0.1), key)
    merge(fleet, run, key)
    path = write_cell(fleet, body(20, 0.2), key)
    path.write_text(path.read_text()[:-30])
    write_cell(fleet, body(10, 0.9, network="9" * 16), key)
    report = merge(fleet, run, key)
    assert len(report.bad) == 1 and "step_20" in report.bad[0] and len(report.conflicts) == 1 and not report.taken
    assert any("step_20" in line and "not JSON" in line for line in report.details())
    ledger = Ledger(run / "ledger.sqlite")
    assert [(c.step, c.metrics["mc/t/acc"]) for c in ledger.cells(suite="mc")] == [(10, 0.1)]
    ledger.close()
    assert cell_path(fleet, "mc", 20, body(20)["cell_identity"]).exists()     # reported, left for the user
