"""The fleet directory is untrusted input (issue 35): `evald backfill --merge` opens every file in it
without following a link, without blocking on a FIFO, regular files only and bounded; and it validates
every cell against the plan, the run's ledger and the suite's identity before it writes anything. A bad
entry is reported (the file, what it is or which field is wrong), counted, and skipped; the merge goes on.
Real files, a real ledger; the merge runs in a thread that must end within a generous bound."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from evald.daemon.fleet_cells import Plan, Snapshot, cell_path, journal_events, publish_plan, write_cell
from evald.daemon.fleet_merge import merge
from evald.ledger.ledger import EVALUATED, Ledger
from evald.ledger.samples import write_samples
from tests.unit.daemon.fleet_files import SUITE, body, cell_identity, make_run, run_key, tree
from tests.unit.daemon.fleet_files import within_bound as _within_bound

def _plan(fleet: Path, key, steps=(10, 20, 30)) -> None:
    publish_plan(fleet, Plan((SUITE,), tuple(Snapshot(s, f"step_{s}", "evald", None, (SUITE,)) for s in steps)), key)


def _cells(run: Path) -> list[tuple[int, str, dict | None]]:
    ledger = Ledger(run / "ledger.sqlite")
    try:
        return [(c.step, c.state, c.metrics) for c in ledger.cells(suite=SUITE)]
    finally:
        ledger.close()


# ---------------------------------------------------------------------- case 1: the files themselves

def test_a_fifo_or_a_link_in_place_of_a_cell_is_reported_and_the_merge_finishes(tmp_path):
    run, fleet, outside = make_run(tmp_path), tmp_path / "fleet", tmp_path / "outside"
    key = run_key(run)
    _plan(fleet, key)
    write_cell(fleet, body(10), key)
    fifo = cell_path(fleet, SUITE, 20, cell_identity())
    os.mkfifo(fifo)
    elsewhere = write_cell(outside, body(30), key)               # a genuine cell, reached only through a link
    os.symlink(elsewhere, cell_path(fleet, SUITE, 30, cell_identity()))
    os.symlink(outside / "cells" / SUITE, fleet / "cells" / "linked")   # a suite directory that is a link
    report = _within_bound(lambda: merge(fleet, run, key), fifo)
    assert report.taken == [(SUITE, 10)]
    said = "\n".join(report.bad)
    assert len(report.bad) == 3, said
    assert f"step_20.{cell_identity()[:12]}.json is a FIFO" in said
    assert f"step_30.{cell_identity()[:12]}.json is a symbolic link" in said
    assert "linked" in said and "symbolic link" in said
    assert [step for step, _, _ in _cells(run)] == [10]


def test_a_fifo_in_place_of_the_plan_is_a_clear_error_not_a_hang(tmp_path):
    from evald.daemon.fleet_cells import FleetFileError

    run, fleet = make_run(tmp_path), tmp_path / "fleet"
    key = run_key(run)
    fleet.mkdir()
    os.mkfifo(fleet / "plan.json")
    with pytest.raises(FleetFileError, match="plan.json is a FIFO"):
        _within_bound(lambda: merge(fleet, run, key), fleet / "plan.json")


def test_the_journals_are_read_without_following_links_or_blocking(tmp_path):
    fleet, outside = tmp_path / "fleet", tmp_path / "outside.jsonl"
    (fleet / "workers").mkdir(parents=True)
    (fleet / "workers" / "worker-0.host.1.jsonl").write_text('{"event": "start", "worker": 0}\n{"torn')
    os.mkfifo(fleet / "workers" / "worker-1.host.2.jsonl")
    outside.write_text('{"event": "secret", "worker": 9}\n')
    os.symlink(outside, fleet / "workers" / "worker-2.host.3.jsonl")
    events = _within_bound(lambda: journal_events(fleet), fleet / "workers" / "worker-1.host.2.jsonl")
    assert events == [{"event": "start", "worker": 0}]


def test_a_worker_never_writes_its_journal_through_a_link_or_into_a_fifo(tmp_path):
    import socket

    from evald.daemon.fleet import run_worker
    from evald.daemon.fleet_cells import FleetFileError

    run, fleet, outside = make_run(tmp_path), tmp_path / "fleet", tmp_path / "outside"
    key, empty = run_key(run), Plan((SUITE,), ())
    outside.mkdir()
    fleet.mkdir()
    os.symlink(outside, fleet / "workers")
    with pytest.raises(FleetFileError, match="symbolic link"):
        _within_bound(lambda: run_worker(None, tmp_path, fleet, empty, 0, 1, key))
    assert list(outside.iterdir()) == []
    (fleet / "workers").unlink()
    (fleet / "workers").mkdir()
    fifo = fleet / "workers" / f"worker-0.{socket.gethostname()}.{os.getpid()}.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(FleetFileError, match="journal cannot be written"):
        _within_bound(lambda: run_worker(None, tmp_path, fleet, empty, 0, 1, key), fifo)


# ---------------------------------------------------------------------- case 2: what a cell says

def _merge_one(tmp_path: Path, cell: dict | bytes, *, step: int = 10, plan_steps=(10, 20, 30)):
    """Merge a fleet holding one cell (a body, sealed as a worker seals it, or raw bytes at its name);
    the report, with the proof that nothing outside the run directory changed."""
    run, fleet = make_run(tmp_path), tmp_path / "fleet"
    key = run_key(run)
    _plan(fleet, key, plan_steps)
    if isinstance(cell, dict):
        path = write_cell(fleet, cell, key)
    else:
        path = cell_path(fleet, SUITE, step, cell_identity())
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(cell)
    before = tree(tmp_path, skip=run)
    report = _within_bound(lambda: merge(fleet, run, key))
    assert tree(tmp_path, skip=run) == before, "the merge wrote outside the run directory"
    return run, path, report


def _refused(report, path: Path, *words: str) -> None:
    assert not report.taken and len(report.bad) == 1, report.bad
    assert path.name in report.bad[0] and all(w in report.bad[0] for w in words), report.bad[0]


def test_a_task_name_that_climbs_out_of_the_run_directory_is_refused_and_nothing_is_written(tmp_path):
    cell = body(10)
    cell["tasks"]["../../../escape"] = cell["tasks"].pop("t")
    run, path, report = _merge_one(tmp_path, cell)
    _refused(report, path, "task", "../../../escape")
    assert not (run / "samples").exists() and _cells(run) == []


def test_a_cell_for_a_step_with_no_checkpoint_is_refused(tmp_path):
    run, path, report = _merge_one(tmp_path, body(40), step=40, plan_steps=(10, 20, 30, 40))
    _refused(report, path, "'step' 40", "no checkpoint")
    assert _cells(run) == []


def test_a_cell_for_a_step_the_plan_does_not_have_is_refused(tmp_path):
    run, path, report = _merge_one(tmp_path, body(20), step=20, plan_steps=(10, 30))
    _refused(report, path, "'step' 20", "plan")
    assert _cells(run) == []


@pytest.mark.parametrize("value, says", [(math.nan, "nan"), (math.inf, "inf"), ("high", "'high'"), (True, "True"),
                                         (10 ** 400, "integer")])
def test_a_metric_that_is_not_a_finite_number_is_refused(tmp_path, value, says):
    cell = body(10)
    cell["tasks"]["t"]["metrics"]["acc"] = value
    cell["scalars"]["mc/t/acc"] = value
    run, path, report = _merge_one(tmp_path, cell)
    _refused(report, path, "acc")
    assert says.lower() in report.bad[0].lower()
    assert _cells(run) == [] and not (run / "samples").exists()


@pytest.mark.parametrize("sample, says", [("../../escape", "a list of objects"), ({"doc_id": "1", "metrics": {}},
                                                                              "doc_id"),
                                          ({"doc_id": 0, "metrics": {"acc": "x"}}, "finite number")])
def test_a_per_sample_record_that_is_not_one_is_refused(tmp_path, sample, says):
    """Found by the property test: a string in place of a document ended the merge in an AttributeError."""
    cell = body(10)
    cell["tasks"]["t"]["samples"][0] = sample
    run, path, report = _merge_one(tmp_path, cell)
    _refused(report, path, "tasks['t'].samples", says)
    assert not (run / "samples").exists()


@pytest.mark.parametrize("scalars, says", [(7, "not an object"), ({"mc/t/acc": 0.5}, "names"),
                                            ({"mc/t/acc": 0.9, "mc/t/acc_stderr": 0.1}, "values differ")])
def test_scalars_that_are_not_the_tasks_metrics_are_refused(tmp_path, scalars, says):
    """Found by the property test: scalars that were a number ended the merge in a TypeError."""
    cell = body(10)
    cell["scalars"] = scalars
    run, path, report = _merge_one(tmp_path, cell)
    _refused(report, path, "'scalars'", says)


def test_a_cell_nested_100000_deep_is_refused_before_it_is_parsed(tmp_path):
    deep = b'{"sha256": "0", "body": {"provenance": ' + b"[" * 100_000 + b"]" * 100_000 + b"}}"
    run, path, report = _merge_one(tmp_path, deep)
    _refused(report, path, "nested")
    assert _cells(run) == []


def test_tasks_other_than_the_suites_identity_names_are_refused(tmp_path):
    cell = body(10)
    cell["tasks"]["u"] = cell["tasks"]["t"]
    run, path, report = _merge_one(tmp_path, cell)
    _refused(report, path, "tasks", "'u'")


def test_an_identity_that_does_not_hash_to_its_stated_hash_is_refused(tmp_path):
    cell = body(10)
    cell["identity"]["num_fewshot"] = 5
    run, path, report = _merge_one(tmp_path, cell)
    _refused(report, path, "identity")


def test_a_cell_of_another_identity_than_the_runs_current_one_is_a_conflict_and_writes_nothing(tmp_path):
    """The ledger has mc at step 10 under one network; a cell of step 10 and one of step 20 under another.
    Neither is taken, and the run's own per-sample files of step 10 are left as they were (the merge used to
    write the cell's files first, and the run's were renamed 'superseded' before the conflict was seen)."""
    run, fleet = make_run(tmp_path), tmp_path / "fleet"
    ours = body(10, 0.7)
    ledger = Ledger(run / "ledger.sqlite")
    assert ledger.take_cell(10, SUITE, ours["cell_identity"], EVALUATED, metrics={"mc/t/acc": 0.7}) == "taken"
    ledger.close()
    write_samples(run, suite=SUITE, task="t", step=10, identity=ours["identity"],
                  identity_sha256=ours["identity_sha256"], cell_identity=ours["cell_identity"],
                  metrics=ours["tasks"]["t"]["metrics"], samples=ours["tasks"]["t"]["samples"])
    samples_before = tree(run / "samples")
    key = run_key(run)
    _plan(fleet, key)
    write_cell(fleet, body(10, 0.1, network="f" * 16), key)
    write_cell(fleet, body(20, 0.2, network="f" * 16), key)
    report = _within_bound(lambda: merge(fleet, run, key))
    assert not report.taken and len(report.conflicts) == 2, report
    assert tree(run / "samples") == samples_before
    assert _cells(run) == [(10, EVALUATED, {"mc/t/acc": 0.7})]


def test_a_valid_cell_beside_bad_ones_is_taken(tmp_path):
    run, fleet = make_run(tmp_path), tmp_path / "fleet"
    key = run_key(run)
    _plan(fleet, key)
    write_cell(fleet, body(10, 0.4), key)
    bad = body(20)
    bad["tasks"]["t"]["metrics"]["acc"] = "x"
    write_cell(fleet, bad, key)
    cell_path(fleet, SUITE, 30, cell_identity()).write_bytes(b"\xff\xfe not json")
    report = _within_bound(lambda: merge(fleet, run, key))
    assert report.taken == [(SUITE, 10)] and len(report.bad) == 2
    assert _cells(run) == [(10, EVALUATED, {"mc/t/acc": 0.4, "mc/t/acc_stderr": 0.1})]
    assert json.loads((run / "samples" / SUITE / "t" / f"step_10.{cell_identity()[:12]}.json").read_text())["step"] == 10


def test_the_command_names_each_bad_file_and_exits_1_or_2_never_a_traceback(tmp_path, capsys):
    from evald.cli.main import main

    run, fleet = make_run(tmp_path), tmp_path / "fleet"
    key = run_key(run)
    _plan(fleet, key)
    cell = body(10)
    cell["tasks"]["t"]["metrics"]["acc"] = "high"
    path = write_cell(fleet, cell, key)
    argv = ["backfill", "--run-dir", str(run), "--ckpt-dir", str(tmp_path), "--fleet-dir", str(fleet), "--merge"]
    assert main(argv) == 1
    out, err = capsys.readouterr()
    assert "1 bad file(s) or entries, not taken" in out
    assert f"not taken: {path}: tasks['t'].metrics['acc'] is 'high', not a finite number" in err
    (fleet / "plan.json").unlink()
    os.mkfifo(fleet / "plan.json")
    assert _within_bound(lambda: main(argv), fleet / "plan.json") == 2
    assert "plan.json is a FIFO, not a regular file; not read; nothing was taken" in capsys.readouterr().err
