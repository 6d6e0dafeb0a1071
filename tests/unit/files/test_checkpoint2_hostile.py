"""Issue 35: Checkpoint 2.0 directories as a hostile (or merely wrong) writer leaves them.

* A FIFO at the tracker, an iteration's ``common.json`` or ``metadata.json``, or a model file never blocks:
  every file is opened without waiting for a writer (evald.contracts.safe_open), and judged (rejected,
  or not yet) at once. So is the full checkpoint a MindFormers weights-only file takes its step from,
  and a foreign file swapped for a FIFO before MindSpore reads it.
* The tracker is never followed through a link (out of the directory or not): refused, said once.
* A tracker that names an iteration that does not exist (10**15) commits nothing that is incomplete:
  a half-written iteration below it is not judged until it is complete, then it is evaluated.
* A file evald's user may not read keeps the iteration pending, never rejected (the permission path).

Each call that once blocked runs on a thread that must finish within the issue's bound (2 s).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from evald.config import EvaldConfig
from evald.files import checkpoint2 as c2
from evald.files.errors import CheckpointError
from evald.files.recognise import CHECKPOINT2, Found, Pending, Rejected, recognise
from evald.intake.intake import Intake
from evald.ledger.ledger import FAILED, REJECTED, Ledger
from tests.checkpoint2_layout import save
from tests.bounded import within
from tests.hostile import OTHER_UID, as_other_user, is_root

BOUND_S = 2.0
TRACKER = "latest_checkpointed_iteration.txt"
NAME = "checkpoint/iteration_00000010"


def _within(fn, fifos=()):
    """``fn()`` must finish within BOUND_S (a FIFO opened blocking never would)."""
    return within(BOUND_S, fn, release=fifos, what="blocked (a FIFO opened without O_NONBLOCK?)")


def _fifo(path: Path) -> Path:
    if path.exists():
        path.chmod(0o600)
        path.unlink()
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("where,world,expect", [
    (TRACKER, 2, None),                                           # not a tracker: nothing committed
    ("iteration_00000010/common.json", 2, "FIFO"),
    ("iteration_00000010/metadata.json", 2, "FIFO"),
    ("iteration_00000010/llama-model-0000000-0000001.safetensors", 1, "FIFO"),   # single card: headers read
    ("iteration_00000010/llama-model-0000001-0000002.safetensors", 2, "FIFO"),   # named by metadata.json
])
def test_a_fifo_anywhere_in_an_iteration_is_judged_at_once_never_waited_on(tmp_path, where, world, expect):
    out = tmp_path / "output"
    save(out / "checkpoint", 10, world)
    fifo = _fifo(out / "checkpoint" / where)
    verdict = _within(lambda: recognise(out, NAME), [fifo])
    if expect is None:
        assert verdict is None
    else:
        assert isinstance(verdict, Rejected) and expect in verdict.reason, verdict


@pytest.mark.parametrize("world", [1, 2])
def test_a_model_file_swapped_for_a_fifo_after_it_was_judged_is_an_error_not_a_hang(tmp_path, world):
    iter_dir = save(tmp_path / "checkpoint", 10, world)
    params = c2.plan(iter_dir)
    fifo = _fifo(iter_dir / f"llama-model-0000000-{world:07d}.safetensors")
    with pytest.raises(CheckpointError, match="FIFO"):
        _within(lambda: c2.read_whole(iter_dir, params), [fifo])


@pytest.fixture
def mindspore_imported():
    """MindSpore imported before a bounded call: load_foreign imports it first thing (seconds, once)."""
    import mindspore  # noqa: F401


def test_the_full_checkpoint_a_weights_only_file_takes_its_step_from_may_be_a_fifo(tmp_path, mindspore_imported):
    out = tmp_path / "output"
    weights = out / "checkpoint_network" / "rank_0" / "llama_rank_0-network-2_5.ckpt"
    weights.parent.mkdir(parents=True)
    weights.write_bytes(b"not read: its step comes from the full checkpoint")
    full = out / "checkpoint" / "rank_0" / "llama_rank_0-2_5.ckpt"
    full.parent.mkdir(parents=True)
    _fifo(full)
    name = "checkpoint_network/rank_0/llama_rank_0-network-2_5.ckpt"
    verdict = _within(lambda: recognise(out, name), [full])
    assert isinstance(verdict, Rejected) and "FIFO" in verdict.reason, verdict


def test_a_foreign_file_swapped_for_a_fifo_before_mindspore_reads_it_is_an_error_not_a_hang(tmp_path,
                                                                                             mindspore_imported):
    from evald.files.foreign import load_foreign

    fifo = _fifo(tmp_path / "net-1_10.ckpt")
    with pytest.raises(CheckpointError, match="FIFO"):
        _within(lambda: load_foreign(fifo), [fifo])


@pytest.mark.parametrize("target", ["outside", "inside"])
def test_a_tracker_that_is_a_link_is_refused_and_said_once(tmp_path, caplog, target):
    out = tmp_path / "output"
    checkpoint = out / "checkpoint"
    save(checkpoint, 10, tracker=False)
    aim = tmp_path / "elsewhere.txt" if target == "outside" else checkpoint / "tracker-copy.txt"
    aim.write_text("99")
    (checkpoint / TRACKER).symlink_to(aim)
    with caplog.at_level(logging.ERROR):
        verdicts = [recognise(out, NAME) for _ in range(3)]
    assert verdicts == [None] * 3        # not committed: a link is not MindFormers' tracker
    said = [r for r in caplog.records if TRACKER in r.getMessage()]
    assert len(said) == 1 and "symbolic link" in said[0].getMessage(), caplog.text
    (checkpoint / TRACKER).unlink()
    (checkpoint / TRACKER).write_text("10")   # MindFormers' own tracker: committed
    assert isinstance(recognise(out, NAME), Found)


@pytest.mark.parametrize("content,step", [
    (b"10", 10), (b"10\n", 10), (b"1000000000000000", 10), (b"9" * 64, 10),
    (b"", None), (b"\xd9\xa1\xd9\xa0", None), ("١٠".encode(), None), (b"\x00\xff\x10", None), (b"-10", None),
    (b"1e3", None), (b"9" * 65, None),
])
def test_a_tracker_commits_only_when_it_holds_an_ascii_number(tmp_path, content, step):
    out = tmp_path / "output"
    save(out / "checkpoint", 10)
    (out / "checkpoint" / TRACKER).write_bytes(content)
    verdict = recognise(out, NAME)
    assert (verdict.step if verdict else None) == step


def test_a_tracker_that_is_a_directory_commits_nothing(tmp_path):
    out = tmp_path / "output"
    save(out / "checkpoint", 10, tracker=False)
    (out / "checkpoint" / TRACKER).mkdir()
    assert recognise(out, NAME) is None


def _half_written(checkpoint: Path, stage: str) -> Path:
    """Iteration 20 as MindFormers leaves it part way through a save (sync or async), the tracker not yet
    rewritten: ``shards``: one rank's model file; ``common``: every shard and common.json, no metadata.json
    yet; ``async``: common.json and metadata.json, the last model file still being written (async_save)."""
    whole = save(checkpoint.parent / "whole", 20)
    iter_dir = checkpoint / whole.name
    keep = {"shards": ["llama-model-0000000-0000002.safetensors"],
            "common": [n.name for n in whole.iterdir() if n.name != "metadata.json"],
            "async": [n.name for n in whole.iterdir() if n.name != "llama-model-0000001-0000002.safetensors"]}[stage]
    iter_dir.mkdir()
    for name in keep:
        shutil.copy(whole / name, iter_dir / name)
    return whole


@pytest.mark.parametrize("stage", ["shards", "common", "async"])
def test_a_tracker_naming_a_huge_iteration_does_not_get_a_half_written_one_rejected(tmp_path, stage):
    out = tmp_path / "output"
    checkpoint = out / "checkpoint"
    save(checkpoint, 10)
    (checkpoint / TRACKER).write_text(str(10**15))   # no such iteration: a wrong (or hostile) tracker
    whole = _half_written(checkpoint, stage)
    ledger = Ledger(tmp_path / "ledger.sqlite")
    intake = Intake(out, ledger, EvaldConfig(lag_policy="all"))
    name = "checkpoint/iteration_00000020"
    intake.found(name, "rescan")
    assert ledger.file_status(name) is None and ledger.step(20) is None   # not judged: still being written
    for rest in whole.iterdir():                     # the save completes (the tracker is not rewritten)
        if not (checkpoint / whole.name / rest.name).exists():
            shutil.copy(rest, checkpoint / whole.name / rest.name)
    intake.found(name, "rescan")
    assert ledger.step(20) is not None and ledger.step(20).kind == CHECKPOINT2
    ledger.close()


def test_what_waiting_cannot_change_is_rejected_for_good(tmp_path):
    out = tmp_path / "output"
    checkpoint = out / "checkpoint"
    save(checkpoint, 10)
    (checkpoint / TRACKER).write_text(str(10**15))
    common = checkpoint / "iteration_00000010" / "common.json"
    common.write_text(json.dumps({**json.loads(common.read_text()), "ckpt_status": 1}))
    assert "abnormal" in recognise(out, NAME).reason
    common.write_text("[1, 2")
    assert "not valid JSON" in recognise(out, NAME).reason
    common.write_text('"a string"')
    assert "JSON object" in recognise(out, NAME).reason


def _world_readable_copy(tmp_path: Path) -> Path:
    """A Checkpoint 2.0 directory another user can reach (pytest's tmp_path is private to root), files 0400."""
    base = Path(tempfile.mkdtemp(prefix="evald-c2-perm-"))
    os.chmod(base, 0o755)
    out = base / "output"
    save(out / "checkpoint", 10)
    for directory, _, files in os.walk(out):
        os.chmod(directory, 0o755)
        for name in files:
            os.chmod(Path(directory) / name, 0o400)  # MindSpore's save_checkpoint and MindFormers' safe mode
    return out


def _verdict_as_other_user(out: Path, name: str) -> tuple[str, str]:
    read, write = os.pipe()

    def judge() -> None:
        os.close(read)
        verdict = recognise(out, name)
        os.write(write, json.dumps([type(verdict).__name__, getattr(verdict, "reason", "")]).encode()[:60000])

    code = as_other_user(judge)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        data = pipe.read()
    assert code == 0, code
    kind, reason = json.loads(data)
    return kind, reason


@pytest.mark.skipif(not is_root(), reason="another user is simulated with setuid (root only)")
@pytest.mark.parametrize("unreadable", [TRACKER, "iteration_00000010/common.json",
                                        "iteration_00000010/metadata.json"])
def test_a_file_evald_may_not_read_keeps_the_iteration_pending_never_rejected(unreadable):
    out = _world_readable_copy(Path())
    try:
        for directory, _, files in os.walk(out):
            for name in files:
                os.chmod(Path(directory) / name, 0o444)
        os.chmod(out / "checkpoint" / unreadable, 0o400)
        kind, reason = _verdict_as_other_user(out, NAME)
        assert kind == Pending.__name__ and "permission denied" in reason and f"uid {OTHER_UID}" in reason, reason
        assert "mode 0400" in reason and Path(unreadable).name in reason
        os.chmod(out / "checkpoint" / unreadable, 0o444)
        assert _verdict_as_other_user(out, NAME)[0] == Found.__name__
    finally:
        shutil.rmtree(out.parent, ignore_errors=True)


def test_a_rejected_iteration_is_recorded_once_with_its_reason(tmp_path):
    out = tmp_path / "output"
    save(out / "checkpoint", 10)
    fifo = _fifo(out / "checkpoint" / "iteration_00000010" / "common.json")

    def intake_twice():
        ledger = Ledger(tmp_path / "ledger.sqlite")   # sqlite: made and used on the bounded thread
        intake = Intake(out, ledger, EvaldConfig(lag_policy="all"))
        intake.found(NAME, "rescan")
        intake.found(NAME, "watchdog")
        try:
            return ledger.files(), ledger.steps()
        finally:
            ledger.close()

    files, steps = _within(intake_twice, [fifo])
    [(name, step, status, reason)] = files
    assert (name, step, status) == (NAME, 10, REJECTED)
    assert reason == "iteration_00000010/common.json is a FIFO, not a regular file: not what MindFormers writes; not read"
    assert [(row.step, row.state, row.reason) for row in steps] == [(10, FAILED, reason)]


def test_an_incomplete_iteration_judged_again_does_not_check_its_metadata_again(tmp_path, monkeypatch):
    """A dead save under a wrong tracker is looked at again at every rescan: its metadata.json (thousands of
    chunks, seconds to check when it is large) is checked once while it stays the same file."""
    from tests.checkpoint2_layout import many_chunks

    checkpoint = tmp_path / "output" / "checkpoint"
    iter_dir = many_chunks(checkpoint, 10, (40, 50))
    (iter_dir / "llama-model-0000003-0000008.safetensors").unlink()        # never written: the save died
    checked = []
    real = c2._params
    monkeypatch.setattr(c2, "_params", lambda *a: checked.append(1) or real(*a))
    assert [recognise(tmp_path / "output", NAME) for _ in range(5)] == [None] * 5
    assert len(checked) == 1
    metadata = iter_dir / "metadata.json"
    text = metadata.read_text()
    metadata.unlink()
    metadata.write_text(text)                                              # saved again: checked again
    (iter_dir / "llama-model-0000003-0000008.safetensors").write_bytes(b"")
    assert recognise(tmp_path / "output", NAME).step == 10 and len(checked) == 2
