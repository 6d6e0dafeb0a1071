"""Issue 35, acceptance: a property test over generated Checkpoint 2.0 directories fed to the intake.

Trackers (ASCII numbers below, at and far above the iterations, 64 nines, non-ASCII digits, empty, binary,
too long, a link out or in, a hard link, a FIFO, a directory) and iterations (one or two ranks; common.json
good, absent, a FIFO, a link, not JSON, 100,000 brackets deep, not an object, marked abnormal; metadata.json
good, absent, a FIFO, a link, not JSON, deep, random JSON, or MindFormers' with hostile edits: wrong types,
offsets and shapes of 10**30 or below zero, file names with ``../``, ``/``, ``\\``, NUL or 300 bytes, a
model file that is not there, thousands of chunks; model files good, absent, a FIFO, a link out, a hard
link; the iteration itself a link out, a file or a FIFO) go through evald.intake.intake as the main loop
feeds it. Then:

* no traceback (nothing logged with an exception), and no hang (each example on a thread, bounded);
* nothing opened outside the checkpoint directory (the audit of test_hostile_tree.py, openat included),
  neither by the intake nor by reading what it found;
* every iteration gets what the rule of evald.files.checkpoint2 says, computed here independently from what
  was generated: found at its step; rejected with a reason (what waiting cannot change); or left without a
  verdict (not committed by the tracker, or incomplete: no common.json, a named model file not there, two
  ranks' files without metadata.json).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from evald.config import EvaldConfig
from evald.files import checkpoint2 as c2
from evald.files.errors import CheckpointError
from evald.intake.intake import Intake
from evald.ledger.ledger import QUEUED, REJECTED, Ledger
from tests.checkpoint2_layout import save
from tests.unit.intake.test_hostile_tree import Audit
from tests.bounded import within

BOUND_S = 20.0          # one whole example (a few iterations, thousands of chunks): never near it
TRACKER = "latest_checkpointed_iteration.txt"
FOUND, REJECT, PENDING = "found", "rejected", "pending"
STEPS = (5, 10, 20)

TRACKERS = ("absent", "below", "middle", "equal", "huge", "nines64", "nines65", "newline", "arabic", "empty",
            "binary", "exponent", "link_out", "link_in", "hard_link", "fifo", "directory")
COMMONS = ("good", "absent", "fifo", "link_out", "invalid", "deep", "not_object", "abnormal")
METADATAS = ("good", "absent", "fifo", "link_out", "invalid", "deep", "shallow_deep", "random", "edited")
MODEL_FILES = ("good", "absent", "fifo", "link_out", "hard_link")
ENTRIES = ("directory", "link_out", "file", "fifo")

# Where a wrong type goes in MindFormers' metadata, and values that are wrong there (all of them: evald checks
# exactly these fields; a string file name that is not a model file's would only mean optimizer state).
WRONG = [1.5, 7, True, None, "x", {}, {"a": 1}, [1.5], [True], ["1"], [[1]]]
WRONG_AT = {"state_dict_metadata": WRONG, "storage_data": WRONG, "param": WRONG, "properties": WRONG,
            "dtype": WRONG, "global_shape": [*WRONG, []], "chunk": [*WRONG, []], "chunk0": [*WRONG, []],
            "global_offset": [*WRONG, []], "local_shape": [*WRONG, []], "storage": WRONG, "storage0": [*WRONG, []],
            "file_name": [v for v in WRONG if not isinstance(v, str)]}
BAD_NAMES = ["../llama-model-0000000-0000002.safetensors", "sub/llama-model-0000000-0000002.safetensors",
             "/abs/llama-model-0000000-0000002.safetensors", "x\\llama-model-0000000-0000002.safetensors",
             "a\x00-model-0000000-0000002.safetensors", "a" * 300 + "-model-0000000-0000002.safetensors"]
MISSING_FILE = "llama-model-0000007-0000008.safetensors"
JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                       max_size=4), max_leaves=20)


@dataclass(frozen=True)
class Edit:
    kind: str                       # wrong_type | huge | bad_name | missing_file | many_chunks
    where: str = ""
    value: object = None


EDITS = st.one_of(
    st.sampled_from(sorted(WRONG_AT)).flatmap(lambda at: st.sampled_from(WRONG_AT[at]).map(
        lambda v: Edit("wrong_type", at, v))),
    st.sampled_from([("global_shape", [10**30, 6]), ("global_shape", [-8, 6]), ("offset", [10**30, 0]),
                     ("offset", [-4, 0]), ("local_shape", [10**30 + 7, 6])]).map(lambda p: Edit("huge", p[0], p[1])),
    st.sampled_from(BAD_NAMES).map(lambda name: Edit("bad_name", value=name)),
    st.just(Edit("missing_file")),
    st.tuples(st.integers(1, 60), st.integers(1, 60)).map(lambda grid: Edit("many_chunks", value=grid)),
)


@dataclass(frozen=True)
class Iteration:
    step: int
    world: int
    entry: str
    common: str
    metadata: str
    models: tuple[str, ...]         # one per rank
    edits: tuple[Edit, ...] = ()
    random_json: object = None


ITERATIONS = st.integers(1, 2).flatmap(lambda world: st.builds(
    Iteration, step=st.sampled_from(STEPS), world=st.just(world),
    entry=st.sampled_from(("directory",) * 8 + ENTRIES[1:]),
    common=st.sampled_from(("good",) * len(COMMONS) + COMMONS), metadata=st.sampled_from(("good",) * 4 + METADATAS),
    models=st.tuples(*[st.sampled_from(("good",) * len(MODEL_FILES) + MODEL_FILES)] * world), edits=st.lists(EDITS, max_size=3).map(tuple),
    random_json=JSON_VALUES))


def _tracker_value(kind: str, steps: list[int]) -> int | None:
    """What the tracker commits up to, by the rule (a small regular file holding an ASCII number), or None."""
    return {"below": min(steps) - 1, "middle": sorted(steps)[len(steps) // 2], "equal": max(steps),
            "huge": 10**15, "nines64": int("9" * 64), "newline": max(steps)}.get(kind)


def _write_tracker(checkpoint: Path, kind: str, steps: list[int], bait: Path) -> None:
    path = checkpoint / TRACKER
    texts = {"below": str(min(steps) - 1), "middle": str(sorted(steps)[len(steps) // 2]), "equal": str(max(steps)),
             "huge": str(10**15), "nines64": "9" * 64, "nines65": "9" * 65, "newline": f"{max(steps)}\n",
             "arabic": "\u0662\u0660", "empty": "", "exponent": "1e3"}
    if kind in texts:
        path.write_text(texts[kind])
    elif kind == "binary":
        path.write_bytes(b"\x00\xff\x10\x80")
    elif kind == "link_out":
        path.symlink_to(bait / "tracker")
    elif kind == "link_in":
        (checkpoint / "tracker-copy").write_text("99")
        path.symlink_to(checkpoint / "tracker-copy")
    elif kind == "hard_link":
        os.link(bait / "tracker", path)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()


def _replace(path: Path, kind: str, bait: Path) -> None:
    """Put ``kind`` at ``path`` instead of what MindFormers wrote there."""
    if kind == "good":
        return
    if os.path.lexists(path):
        path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "link_out":
        path.symlink_to(bait / path.name)
    elif kind == "hard_link":
        os.link(bait / path.name, path)
    elif kind == "invalid":
        path.write_text('{"state_dict_metadata": ')
    elif kind == "deep":
        path.write_text("[" * 100_000 + "]" * 100_000)
    elif kind == "shallow_deep":
        path.write_text('{"state_dict_metadata": ' + "[" * 500 + "]" * 500 + ', "storage_data": {}}')
    elif kind == "not_object":
        path.write_text('"a string"')
    elif kind == "abnormal":
        path.write_text(json.dumps({"epoch_num": 1, "step_num": 1, "ckpt_status": 1}))
    else:
        assert kind == "absent", kind


def _edit(meta: dict, edit: Edit, files: list[str]) -> None:
    param = meta["state_dict_metadata"]["emb.weight"]
    first = param["chunk"][0]
    key = str(("emb.weight", tuple(first["global_offset"])))
    if edit.kind == "wrong_type":
        value = json.loads(json.dumps(edit.value))
        holders = {"state_dict_metadata": (meta, "state_dict_metadata"), "storage_data": (meta, "storage_data"),
                   "param": (meta["state_dict_metadata"], "emb.weight"), "properties": (param, "properties"),
                   "dtype": (param["properties"], "dtype"), "global_shape": (param, "global_shape"),
                   "chunk": (param, "chunk"), "chunk0": (param["chunk"], 0), "global_offset": (first, "global_offset"),
                   "local_shape": (first, "local_shape"), "storage": (meta["storage_data"], key),
                   "storage0": (meta["storage_data"][key], 0),
                   "file_name": (meta["storage_data"][key][0], "file_name")}
        holder, index = holders[edit.where]
        holder[index] = value
    elif edit.kind == "huge":
        if edit.where == "offset":   # its storage entry moves with it: only the tiling can refuse it
            meta["storage_data"][str(("emb.weight", tuple(edit.value)))] = meta["storage_data"].pop(key)
            first["global_offset"] = edit.value
        else:
            (param if edit.where == "global_shape" else first)[edit.where] = edit.value
    elif edit.kind == "bad_name":
        meta["storage_data"][key][0]["file_name"] = edit.value
    elif edit.kind == "missing_file":
        meta["storage_data"][key][0]["file_name"] = MISSING_FILE
    elif edit.kind == "many_chunks":
        rows, cols = edit.value
        chunks, storage = [], {}
        for index, (r, c) in enumerate((r, c) for r in range(rows) for c in range(cols)):
            chunks.append({"global_offset": [2 * r, 2 * c], "local_shape": [2, 2]})
            storage[str(("w", (2 * r, 2 * c)))] = [{"file_name": files[index % len(files)], "storage_rank": 0}]
        meta.clear()
        meta.update({"state_dict_metadata": {"w": {"properties": {"dtype": "Float32"}, "global_shape": [2 * rows, 2 * cols],
                                                   "chunk": chunks}}, "storage_data": storage})


def _build(checkpoint: Path, spec: Iteration, bait: Path) -> tuple[str, list[Edit]]:
    """Write ``spec``; the entry name the intake is given, and the edits of metadata.json that took effect
    (one that finds no place left to go, after an edit that removed it, stops the others)."""
    name = f"iteration_{spec.step:08d}"
    if spec.entry != "directory":
        path = checkpoint / name
        if spec.entry == "link_out":
            path.symlink_to(bait / "iteration")
        elif spec.entry == "file":
            path.write_text("not a directory")
        else:
            os.mkfifo(path)
        return f"checkpoint/{name}", []
    iter_dir = save(checkpoint, spec.step, spec.world, tracker=False, metadata=spec.metadata != "absent")
    files = [f"llama-model-{rank:07d}-{spec.world:07d}.safetensors" for rank in range(spec.world)]
    applied: list[Edit] = []
    if spec.metadata in ("edited", "random"):
        meta = json.loads((iter_dir / "metadata.json").read_text())
        if spec.metadata == "random":
            meta = spec.random_json
        for edit in spec.edits if spec.metadata == "edited" else ():
            try:
                _edit(meta, edit, files)
            except (KeyError, TypeError, IndexError, AttributeError):
                break
            applied.append(edit)
        (iter_dir / "metadata.json").write_text(json.dumps(meta))
    elif spec.metadata != "absent":
        _replace(iter_dir / "metadata.json", spec.metadata, bait)
    _replace(iter_dir / "common.json", spec.common, bait)
    for file, kind in zip(files, spec.models):
        _replace(iter_dir / file, kind, bait)
    return f"checkpoint/{name}", applied


def expected(spec: Iteration, edits: list[Edit], tracked: int | None) -> str:
    """The rule of evald.files.checkpoint2 (its module docstring), from what was generated."""
    if spec.entry != "directory":
        return REJECT                                  # a link, a file or a FIFO is never an iteration
    if tracked is None or spec.step > tracked:
        return PENDING                                 # not committed by the tracker
    if spec.common == "absent":
        return PENDING                                 # incomplete: common.json comes after the shards
    if spec.common != "good":
        return REJECT
    if spec.metadata == "absent":
        if spec.world == 2:
            return PENDING                             # several ranks' files wait for their metadata.json
        return {"good": FOUND, "absent": PENDING}.get(spec.models[0], REJECT)  # its header is read
    if spec.metadata not in ("edited", "good"):
        return REJECT
    named = set(range(spec.world))                     # emb and proj are cut across ranks (checkpoint2_layout)
    many = [i for i, e in enumerate(edits) if e.kind == "many_chunks"]
    if many:                                           # a new metadata.json: what came before is gone
        rows, cols = edits[many[-1]].value
        named = set(range(min(spec.world, rows * cols)))
        edits = edits[many[-1] + 1:]
    names = [e for e in edits if e.kind in ("bad_name", "missing_file") or e.where == "file_name"]
    edits = [e for e in edits if e not in names] + names[-1:]   # the file name the last of them wrote
    if any(e.kind in ("wrong_type", "huge", "bad_name") for e in edits):
        return REJECT
    kinds = [spec.models[rank] for rank in sorted(named)]
    if any(k in ("fifo", "link_out") for k in kinds):
        return REJECT                                  # a named file there that is not a regular file
    if any(e.kind == "missing_file" for e in edits) or "absent" in kinds:
        return PENDING                                 # a named model file not there (yet)
    return FOUND                                       # (a hard link is refused when its header is read)


def _bait(tmp: Path) -> Path:
    bait = tmp / "bait"
    (bait / "iteration").mkdir(parents=True)
    (bait / "tracker").write_text("99")
    for name in ("common.json", "metadata.json", "llama-model-0000000-0000001.safetensors",
                 "llama-model-0000000-0000002.safetensors", "llama-model-0000001-0000002.safetensors"):
        (bait / name).write_bytes(b"{}" if name.endswith(".json") else b"\x08" + b"\x00" * 7 + b"{}      ")
    return bait


def _bounded(fn, tree: Path):
    """``fn()`` must finish within BOUND_S; if it does not, every FIFO in ``tree`` is opened from the other
    side, which lets a reader stuck in open() (the defect) go."""
    return within(BOUND_S, fn, release=[tree], what="the intake still runs (a FIFO opened blocking?)")


@settings(max_examples=200, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(tracker=st.sampled_from(TRACKERS + ("equal", "huge", "nines64", "middle") * 3), iterations=st.lists(ITERATIONS, min_size=1, max_size=3,
                                                              unique_by=lambda i: i.step))
def test_the_intake_judges_any_generated_checkpoint2_directory_by_the_rule(tmp_path_factory, monkeypatch, caplog,
                                                                          tracker, iterations):
    tmp = tmp_path_factory.mktemp("c2")
    bait = _bait(tmp)
    ckpt = tmp / "output"
    checkpoint = ckpt / "checkpoint"
    checkpoint.mkdir(parents=True)
    built = {spec.step: _build(checkpoint, spec, bait) for spec in iterations}
    names = {step: name for step, (name, _) in built.items()}
    steps = [spec.step for spec in iterations]
    _write_tracker(checkpoint, tracker, steps, bait)
    tracked = _tracker_value(tracker, steps)
    config = dataclasses.replace(EvaldConfig(), lag_policy="all")
    caplog.clear()

    def intake_and_read() -> tuple[list, list, list[str]]:
        ledger = Ledger(tmp / "ledger.sqlite")
        try:
            intake = Intake(ckpt, ledger, config)
            for name in names.values():
                intake.found(name, "rescan")
                intake.found(name, "watchdog")      # judged once
            intake.recheck_settled()
            read = []
            for row in ledger.steps():               # what a read of each found iteration touches
                try:
                    c2.read_whole(ckpt / row.source, c2.plan(ckpt / row.source))
                    read.append(row.source)
                except CheckpointError:
                    pass
            return ledger.files(), ledger.steps(), read
        finally:
            ledger.close()

    with monkeypatch.context() as patched, caplog.at_level(logging.INFO):
        audit = Audit(patched)
        files, rows, _ = _bounded(intake_and_read, tmp)
    assert audit.outside(ckpt, [tmp / "ledger.sqlite"]) == [], "opened outside the checkpoint directory"
    tracebacks = [r.getMessage() for r in caplog.records if r.exc_info]
    assert tracebacks == [], tracebacks
    verdicts = {name: (status, reason) for name, _, status, reason in files}
    found = {row.source: row for row in rows}
    for spec in iterations:
        name, edits = built[spec.step]
        want = expected(spec, edits, tracked)
        event(f"an iteration {want}")
        if want == FOUND:
            assert any(f"{name}/" in opened for opened in audit.opened), "the audit saw nothing read"
            assert name in found and found[name].step == spec.step and found[name].state == QUEUED, (spec, found)
        elif want == REJECT:
            status, reason = verdicts.get(name, (None, None))
            assert status == REJECTED and reason, (spec, tracked, verdicts, found)
        else:
            assert name not in verdicts and name not in found, (spec, tracked, verdicts, found)


@pytest.mark.parametrize("kind", ["link_out", "link_in", "fifo", "directory", "nines65", "binary"])
def test_a_tracker_evald_refuses_is_said_once_per_problem(tmp_path, caplog, kind):
    bait = _bait(tmp_path)
    checkpoint = tmp_path / "output" / "checkpoint"
    save(checkpoint, 10, tracker=False)
    _write_tracker(checkpoint, kind, [10], bait)
    with caplog.at_level(logging.ERROR, logger="evald.files.checkpoint2"):
        for _ in range(3):
            assert _bounded(lambda: c2.committed(checkpoint / "iteration_00000010"), tmp_path) is None
    assert len([r for r in caplog.records if r.name == "evald.files.checkpoint2"]) == 1, caplog.text
