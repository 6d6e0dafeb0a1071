"""Property test (issue 35): generated fleet directories fed to `evald backfill --merge` (fleet_merge.merge on a
real small run): cell files sealed with the run's key whose fields are replaced by hostile values (NaN,
Infinity, 400-digit integers, strings, lists, deep nesting, ``../`` and ``/`` in suite and task names, lone
surrogates), files sealed without the key, raw bytes (not UTF-8, 100,000 brackets, number tokens), and
links, FIFOs, hard links and directories where files belong; plans likewise. The merge returns a report
or refuses the fleet with a FleetFileError; never another exception (so never a traceback), never a hang;
nothing outside the run directory changes (the whole tree around it compared before and after), and
nothing in the ledger or the per-sample files is invalid."""

from __future__ import annotations

import json
import math
import os
import re
import sqlite3
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from evald.daemon.fleet_cells import (PLAN_FORMAT, SUITE_NAME, FleetFileError, Plan, Snapshot, cell_relative,
                                      journal_events, publish_plan, sealed, write_cell)
from evald.daemon.fleet_check import task_name_problem
from evald.daemon.fleet_key import FleetKey
from evald.daemon.fleet_merge import MergeReport, merge
from evald.ledger.ledger import DELETED, EVALUATED, FAILED, Ledger
from evald.ledger.samples import identity_digest
from tests.unit.daemon.fleet_files import NETWORK, SUITE, body, make_run, run_key, tree, within_bound

PROPERTY = settings(max_examples=150, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
LEDGER_STEPS = (10, 20, 30)
CELL_IDENTITY = re.compile(r"[0-9a-f]{64}\.[0-9a-f]{16}")

HOSTILE_NAMES = ["../../escape", "../escape", "..", ".", "/etc/x", "a/b", "a\\b", "\x00", "t\n", ".hidden",
                 "\udcff", "x\ud800", "é" * 250, "", " ", "mc/../../x"]
HOSTILE_VALUES = [math.nan, math.inf, -math.inf, 10**400, -(10**30), 2**63, True, False, None, "high", "0.5",
                  [], {}, [1.0, math.nan], {"a": math.inf}, "\udcff", "x" * 5000, -1, 1e308]
NUMBER_TOKENS = [b"NaN", b"-Infinity", b"1e999", b"1" + b"0" * 400, b"9" * 5000, b"-0", b"01", b"0x10"]
PATHS = [("suite",), ("step",), ("cell_identity",), ("state",), ("commit_time",), ("source",), ("identity",),
         ("identity", "suite"), ("identity", "tasks"), ("identity", "lm_eval"), ("identity_sha256",), ("tasks",),
         ("tasks", "t"), ("tasks", "t", "metrics"), ("tasks", "t", "metrics", "acc"), ("tasks", "t", "samples"),
         ("tasks", "t", "samples", 0), ("tasks", "t", "samples", 0, "doc_id"), ("tasks", "t", "samples", 0, "metrics"),
         ("tasks", "t", "samples", 0, "metrics", "acc"), ("tasks", "t", "samples", 0, "resps"), ("scalars",),
         ("scalars", "mc/t/acc"), ("timing",), ("timing", "evaluate_s"), ("samples_text",), ("provenance",),
         ("provenance", "weights_sha256"), ("reason",), ("format",)]


def _nested(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


hostile_value = st.one_of(st.sampled_from(HOSTILE_VALUES), st.sampled_from(HOSTILE_NAMES), st.integers(),
                          st.floats(), st.text(max_size=12), st.sampled_from([1, 60, 80, 300]).map(_nested))


@st.composite
def cell_body(draw) -> dict:
    """A worker's cell, as written or then changed: a field replaced or dropped, a task renamed (the hashes
    recomputed, as a worker holding the key would, or not), a failed cell."""
    step = draw(st.sampled_from([10, 20, 30, 40]))
    cell = body(step, draw(st.floats(0, 1)), network=draw(st.sampled_from([NETWORK, NETWORK, "f" * 16])))
    if draw(st.integers(0, 3)) == 0:
        cell = {k: v for k, v in cell.items() if k in ("suite", "step", "cell_identity", "source", "commit_time")}
        cell.update(state=draw(st.sampled_from([FAILED, DELETED, "evaluating"])),
                    reason=draw(st.one_of(st.text(max_size=20), hostile_value)))
    for _ in range(draw(st.sampled_from([0, 0, 1, 1, 2]))):
        how = draw(st.sampled_from(["replace", "replace", "rename-task", "rename-task-rehash", "drop"]))
        if how == "replace" or how == "drop":
            path = draw(st.sampled_from(PATHS))
            _set(cell, path, None if how == "drop" else draw(hostile_value), drop=how == "drop")
        elif isinstance(cell.get("tasks"), dict) and isinstance(cell.get("identity"), dict) \
                and isinstance(cell["identity"].get("tasks"), dict) and "t" in cell["tasks"]:
            name = draw(st.sampled_from(HOSTILE_NAMES + ["u", "t2"]))
            cell["tasks"][name] = cell["tasks"].pop("t")
            cell["identity"]["tasks"][name] = cell["identity"]["tasks"].pop("t", {})
            cell["scalars"] = {f"{SUITE}/{name}/{m}": v for m, v in cell["tasks"][name]["metrics"].items()} \
                if isinstance(cell["tasks"][name], dict) and isinstance(cell["tasks"][name].get("metrics"), dict) \
                else cell.get("scalars")
            if how == "rename-task-rehash":     # as a worker with the key would write it: it reaches the name check
                cell["identity_sha256"] = identity_digest(cell["identity"])
                cell["cell_identity"] = f"{cell['identity_sha256']}.{NETWORK}"
    return cell


def _set(tree_: dict, path: tuple, value, *, drop: bool) -> None:
    here = tree_
    for key in path[:-1]:
        if isinstance(here, dict) and key in here:
            here = here[key]
        elif isinstance(here, list) and isinstance(key, int) and key < len(here):
            here = here[key]
        else:
            return
    last = path[-1]
    if isinstance(here, dict):
        if drop:
            here.pop(last, None)
        else:
            here[last] = value
    elif isinstance(here, list) and isinstance(last, int) and last < len(here):
        here[last] = value


def _raw(draw) -> bytes:
    kind = draw(st.sampled_from(["deep", "token", "bytes", "truncated", "odd-seal"]))
    if kind == "deep":
        depth = draw(st.sampled_from([70, 80, 1000, 100_000]))
        return b'{"hmac_sha256": "0", "body": ' + b"[" * depth + b"]" * depth + b"}"
    if kind == "token":
        return b'{"hmac_sha256": "0", "body": {"step": ' + draw(st.sampled_from(NUMBER_TOKENS)) + b"}}"
    if kind == "odd-seal":
        return draw(st.sampled_from([b'{"hmac_sha256": "\xff\xfe", "body": {}}', b'{"hmac_sha256": "\xc3\xa9", "body": {}}',
                                     b'{"hmac_sha256": "\\ud800", "body": {}}']))
    if kind == "truncated":
        return json.dumps({"hmac_sha256": "0" * 64, "body": body(10)}).encode()[:draw(st.integers(0, 300))]
    return draw(st.binary(max_size=64))


ENTRY_KINDS = ["sealed"] * 8 + ["wrong-key", "raw", "fifo", "link-file", "link-dir", "hardlink", "directory"]


@st.composite
def fleet_entry(draw) -> tuple[str, str, str, object]:
    """(suite directory name, file name, kind, content) of one entry under cells/: mostly a sealed cell at the
    name its content gives (so the checks of what it says are reached), else anything."""
    kind = draw(st.sampled_from(ENTRY_KINDS))
    cell = draw(cell_body())
    folder = cell["suite"] if isinstance(cell.get("suite"), str) and SUITE_NAME.fullmatch(cell["suite"]) else SUITE
    if draw(st.integers(0, 9)) == 0:
        folder = draw(st.sampled_from(["other", "\udcffx", ".hidden"]))
    step, identity = cell.get("step"), cell.get("cell_identity")
    if type(step) is int and 0 <= step < 10**19 and isinstance(identity, str) and len(identity) >= 12:
        name = cell_relative("x", step, identity).rpartition("/")[2]
    else:
        name = f"step_10.{body(10)['cell_identity'][:12]}.json"
    if draw(st.integers(0, 9)) == 0:
        name = draw(st.sampled_from(["notes.txt", "step_10.json", "\udcfe.json"]))
    return folder, name, kind, cell if kind in ("sealed", "wrong-key") else _raw(draw)


@st.composite
def plan_entry(draw) -> tuple[str, object]:
    kind = draw(st.sampled_from(["valid"] * 10 + ["mutated", "mutated", "raw", "fifo", "link", "directory",
                                                  "missing"]))
    steps = draw(st.one_of(st.just({10, 20, 30}), st.just({10, 20, 30, 40}),
                           st.sets(st.sampled_from([10, 20, 30, 40]), min_size=1)))
    if kind != "mutated":
        return kind, tuple(sorted(steps))
    plan = {"format": PLAN_FORMAT, "suites": [SUITE], "created_at": 1.0,
            "snapshots": [{"step": s, "source": f"step_{s}", "kind": "evald", "commit_time": None, "suites": [SUITE]}
                          for s in sorted(steps)]}
    where = draw(st.sampled_from([("suites",), ("suites", 0), ("snapshots",), ("snapshots", 0),
                                  ("snapshots", 0, "step"), ("snapshots", 0, "suites"), ("snapshots", 0, "suites", 0),
                                  ("snapshots", 0, "commit_time"), ("snapshots", 0, "source"), ("format",)]))
    _set(plan, where, draw(hostile_value), drop=False)
    return kind, plan


def _write_plan(fleet: Path, key: FleetKey, outside: Path, kind: str, content) -> list[Path]:
    fleet.mkdir(parents=True, exist_ok=True)
    target = fleet / "plan.json"
    if kind == "valid":
        publish_plan(fleet, Plan((SUITE,), tuple(Snapshot(s, f"step_{s}", "evald", None, (SUITE,)) for s in content)),
                     key)
    elif kind == "mutated":
        target.write_bytes(sealed(content, key))
    elif kind == "raw":
        target.write_bytes(b"[" * 100_000 + b"]" * 100_000)
    elif kind == "fifo":
        os.mkfifo(target)
        return [target]
    elif kind == "link":
        publish_plan(outside, Plan((SUITE,), (Snapshot(10, "step_10", "evald", None, (SUITE,)),)), key)
        os.symlink(outside / "plan.json", target)
    elif kind == "directory":
        target.mkdir()
    return []


def _write_entry(fleet: Path, key: FleetKey, outside: Path, folder: str, name: str, kind: str, content) -> list[Path]:
    directory = Path(os.fsdecode(os.path.join(os.fsencode(fleet), b"cells", os.fsencode(folder))))
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / name
    if os.path.lexists(target):
        return []
    if kind == "sealed":
        target.write_bytes(sealed({"format": "evald-fleet-cell/2", **content}, key))
    elif kind == "wrong-key":
        target.write_bytes(sealed({"format": "evald-fleet-cell/2", **content}, FleetKey(b"g" * 64, "a guess")))
    elif kind == "raw":
        target.write_bytes(content)
    elif kind == "fifo":
        os.mkfifo(target)
        return [target]
    elif kind in ("link-file", "hardlink"):
        genuine = write_cell(outside, body(10), key)     # a genuine cell of the run, outside the fleet directory
        (os.symlink if kind == "link-file" else os.link)(genuine, target)
    elif kind == "link-dir":
        write_cell(outside, body(20), key)
        os.symlink(outside / "cells" / SUITE, target)
    elif kind == "directory":
        target.mkdir()
    return []


@st.composite
def journal_entry(draw) -> tuple[str, str, bytes]:
    """(kind, name, content) of one entry under workers/: a journal of lines, hostile or not, or no file."""
    name = draw(st.sampled_from(["worker-0.host.1.jsonl", "worker-1.h\udcff.2.jsonl", "worker-x.h.3.jsonl"]))
    kind = draw(st.sampled_from(["lines", "lines", "lines", "fifo", "link", "directory"]))
    lines = draw(st.lists(st.one_of(st.just(b'{"event": "load", "worker": 0, "step": 10}'), st.binary(max_size=40),
                                    st.sampled_from([b"[" * 100_000, b'{"event": NaN}', b"\xff\xfe", b'"\\ud800"'])),
                          max_size=4))
    return kind, name, b"\n".join(lines)


def _write_journal(fleet: Path, outside: Path, kind: str, name: str, content: bytes) -> list[Path]:
    folder = fleet / "workers"
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / name
    if os.path.lexists(target):
        return []
    if kind == "lines":
        target.write_bytes(content)
    elif kind == "fifo":
        os.mkfifo(target)
        return [target]
    elif kind == "link":
        outside.mkdir(parents=True, exist_ok=True)
        (outside / "journal.jsonl").write_bytes(b'{"event": "secret"}\n')
        os.symlink(outside / "journal.jsonl", target)
    else:
        target.mkdir()
    return []


def _strict(text: str):
    def refuse(name):
        raise AssertionError(f"{name} in the ledger")
    return json.loads(text, parse_constant=refuse)


def _finite(value) -> bool:
    return type(value) in (int, float) and math.isfinite(value)


def _check_ledger(run: Path, planned: set[int]) -> None:
    """Nothing invalid: each suite cell is the plan's suite at a retained checkpoint, its identity a cell
    identity, its metrics finite numbers named SUITE/TASK/METRIC with a plain task; every stored JSON strict."""
    ledger = Ledger(run / "ledger.sqlite")
    try:
        assert ledger.step_numbers() == list(LEDGER_STEPS)
        for cell in ledger.cells():
            assert cell.suite == SUITE and cell.step in planned and cell.step in LEDGER_STEPS, cell
            assert CELL_IDENTITY.fullmatch(cell.identity) and cell.state in (EVALUATED, FAILED, DELETED), cell
            for name, value in (cell.metrics or {}).items():
                suite, task, _metric = name.split("/", 2)
                assert suite == SUITE and task_name_problem(task) is None and _finite(value), (name, value)
    finally:
        ledger.close()
    db = sqlite3.connect(run / "ledger.sqlite")
    try:
        for (payload,) in db.execute("SELECT payload FROM records"):
            record = _strict(payload)
            assert all(_finite(v) for v in record["scalars"].values()), record
            for text in record["texts"].values():
                text.encode("utf-8")
        for table, column in (("cells", "metrics"), ("cells", "provenance"), ("provenance", "value"), ("kv", "value")):
            for (value,) in db.execute(f"SELECT {column} FROM {table} WHERE {column} IS NOT NULL"):
                _strict(value)
    finally:
        db.close()
    samples = run / "samples"
    for here, _dirs, files in os.walk(samples):
        for name in files:
            parts = (Path(here) / name).relative_to(samples).parts
            assert len(parts) == 3 and parts[0] == SUITE and task_name_problem(parts[1]) is None, parts


@PROPERTY
@given(plan=plan_entry(), entries=st.lists(fleet_entry(), min_size=1, max_size=4), conflict=st.booleans(),
       journals=st.lists(journal_entry(), max_size=2))
def test_a_generated_fleet_directory_is_merged_or_refused_cleanly(plan, entries, conflict, journals):
    with tempfile.TemporaryDirectory(prefix="evald-fleet-prop-") as tmp:
        root = Path(tmp)
        run, fleet, outside = make_run(root, LEDGER_STEPS), root / "fleet", root / "outside"
        key = run_key(run)
        if conflict:     # the run's current mc cell of step 20 is of another network
            ledger = Ledger(run / "ledger.sqlite")
            ledger.take_cell(20, SUITE, f"{body(20)['identity_sha256']}.{'e' * 16}", EVALUATED,
                             metrics={"mc/t/acc": 0.5})
            ledger.close()
        fifos = _write_plan(fleet, key, outside, *plan)
        for entry in entries:
            fifos += _write_entry(fleet, key, outside, *entry)
        for journal in journals:
            fifos += _write_journal(fleet, outside, *journal)
        before = tree(root, skip=run)
        events = within_bound(lambda: journal_events(fleet), *fifos)      # what bench.fleet and the e2e test read
        assert all(isinstance(e, dict) and e.get("event") != "secret" for e in events), events
        try:
            report = within_bound(lambda: merge(fleet, run, key), *fifos)
        except FleetFileError:
            report = None           # no usable plan: the command says why and exits 2
        event("no usable plan" if report is None else f"{len(report.taken)} taken, {len(report.bad)} bad, "
              f"{len(report.conflicts)} conflicts")
        for line in (report.bad if report is not None else []):
            event("bad: " + re.sub(r"^\S*: |\S*/fleet/\S*|[0-9]+", "", line)[:60])
        assert tree(root, skip=run) == before, "the merge changed something outside the run directory"
        planned = set(plan[1]) if plan[0] in ("valid",) else {10} if plan[0] == "link" else set(LEDGER_STEPS)
        _check_ledger(run, planned | ({20} if conflict else set()))
        if report is not None:
            assert isinstance(report, MergeReport)
            assert all(suite == SUITE and step in planned and step in LEDGER_STEPS for suite, step in report.taken)
            for line in report.bad + report.conflicts + report.details() + [report.describe()]:
                line.encode("utf-8")      # printable as it is
