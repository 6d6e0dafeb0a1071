"""Checkpoint 2.0 judged and read in-process (evald.files.checkpoint2, recognise, the swap).

The directories here are written by tests/checkpoint2_layout.py in the layout ``mindformers.checkpoint.save_checkpoint``
(2.0.0) writes (file names, metadata.json, common.json, tracker), so the rules can be exercised in
milliseconds; tests/e2e/test_checkpoint2_e2e.py runs a real evald on files written by MindFormers'
own writer, and the first test here checks this layout against one MindFormers wrote when the
MindFormers venv is there.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from evald.files import checkpoint2 as c2
from evald.files import mindformers as mf
from evald.files.errors import CheckpointError
from evald.files.recognise import CHECKPOINT2, Found, Rejected, recognise
from evald.files.slices import tp_region

from tests.checkpoint2_layout import WEIGHTS, save as _save


def _name(step: int) -> str:
    return f"checkpoint/iteration_{step:08d}"


@pytest.mark.parametrize("world", [1, 2])
def test_a_committed_iteration_is_found_at_its_step_and_read_whole_from_model_files_only(tmp_path, world,
                                                                                           monkeypatch):
    out = tmp_path / "output"
    _save(out / "checkpoint", 20, world)
    assert recognise(out, _name(20)) == Found(_name(20), 20, CHECKPOINT2, None,
                                              (out / _name(20)).stat().st_mtime)
    opened = []
    real_open = os.open
    monkeypatch.setattr(c2.os, "open", lambda p, *a, **k: opened.append(Path(p).name) or real_open(p, *a, **k))
    params = c2.plan(out / _name(20))
    arrays = c2.read_whole(out / _name(20), params)
    assert set(arrays) == set(WEIGHTS) and all(np.array_equal(arrays[n], WEIGHTS[n]) for n in WEIGHTS)
    assert opened and not [f for f in opened if "-opt-" in f]          # never an optimizer file
    assert c2.model_bytes(params) == sum(a.nbytes for a in WEIGHTS.values())


def test_an_iteration_the_tracker_does_not_commit_is_not_a_checkpoint_yet(tmp_path):
    checkpoint = tmp_path / "output" / "checkpoint"
    _save(checkpoint, 10)
    _save(checkpoint, 20, tracker=False)                           # written, the barrier not passed yet
    assert recognise(tmp_path / "output", _name(20)) is None
    assert isinstance(recognise(tmp_path / "output", _name(10)), Found)
    (checkpoint / "latest_checkpointed_iteration.txt").write_text("")  # rank 0 is writing it
    assert recognise(tmp_path / "output", _name(10)) is None
    (checkpoint / "latest_checkpointed_iteration.txt").write_text("20")
    assert recognise(tmp_path / "output", _name(20)).step == 20
    (checkpoint / "latest_checkpointed_iteration.txt").unlink()
    assert recognise(tmp_path / "output", _name(20)) is None


def test_a_committed_iteration_missing_a_shard_or_common_json_is_not_judged_until_it_is_complete(tmp_path):
    """MindFormers writes every file whole under its final name, shards first (later still with async_save):
    a missing one may yet come (tests/unit/files/test_checkpoint2_hostile.py has the tracker that says so)."""
    checkpoint = tmp_path / "output" / "checkpoint"
    _save(checkpoint, 10)
    shard = checkpoint / "iteration_00000010" / "llama-model-0000001-0000002.safetensors"
    data = shard.read_bytes()
    shard.unlink()
    assert recognise(tmp_path / "output", _name(10)) is None
    with pytest.raises(CheckpointError, match="llama-model-0000001-0000002.safetensors"):
        c2.plan(checkpoint / "iteration_00000010")      # being read: it is an error
    shard.write_bytes(data)
    assert recognise(tmp_path / "output", _name(10)).step == 10
    _save(checkpoint, 20)
    (checkpoint / "iteration_00000020" / "common.json").unlink()
    assert recognise(tmp_path / "output", _name(20)) is None


def test_an_iteration_mindformers_marked_abnormal_is_rejected(tmp_path):
    checkpoint = tmp_path / "output" / "checkpoint"
    _save(checkpoint, 10)
    common = checkpoint / "iteration_00000010" / "common.json"
    common.write_text(json.dumps({**json.loads(common.read_text()), "ckpt_status": 1}))
    verdict = recognise(tmp_path / "output", _name(10))
    assert isinstance(verdict, Rejected) and "abnormal" in verdict.reason


def test_chunks_that_leave_a_gap_or_overlap_are_refused(tmp_path):
    iter_dir = _save(tmp_path / "checkpoint", 10)
    meta = json.loads((iter_dir / "metadata.json").read_text())
    meta["state_dict_metadata"]["emb.weight"]["chunk"].pop()
    (iter_dir / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="cover 24 of its 48 elements"):
        c2.plan(iter_dir)
    meta["state_dict_metadata"]["emb.weight"]["chunk"] = [{"global_offset": [0, 0], "local_shape": [4, 6]}] * 2
    (iter_dir / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="overlap"):
        c2.plan(iter_dir)


def test_a_shard_that_does_not_match_its_header_or_the_metadata_is_an_error_not_a_number(tmp_path):
    iter_dir = _save(tmp_path / "checkpoint", 10)
    model = iter_dir / "llama-model-0000000-0000002.safetensors"
    data = model.read_bytes()
    model.write_bytes(data[:-8])                                   # truncated
    with pytest.raises(CheckpointError, match="truncated"):
        c2.read_whole(iter_dir, c2.plan(iter_dir))
    model.write_bytes(data)
    meta = json.loads((iter_dir / "metadata.json").read_text())
    meta["state_dict_metadata"]["proj.weight"]["chunk"] = [{"global_offset": [0, 0], "local_shape": [3, 4]},
                                                           {"global_offset": [3, 0], "local_shape": [3, 4]}]
    for rank, off in enumerate([(0, 0), (3, 0)]):
        meta["storage_data"][str(("proj.weight", off))] = [
            {"file_name": f"llama-model-{rank:07d}-0000002.safetensors", "storage_rank": rank, "rank_group": [rank]}]
    (iter_dir / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match=r"'proj.weight' is float32\[6, 2\] there, float32\[3, 4\]"):
        c2.read_whole(iter_dir, c2.plan(iter_dir))


def test_metadata_naming_a_file_outside_the_iteration_is_refused(tmp_path):
    iter_dir = _save(tmp_path / "checkpoint", 10)
    meta = json.loads((iter_dir / "metadata.json").read_text())
    key = str(("norm.gamma", (0,)))
    meta["storage_data"][key][0]["file_name"] = "../x-model-0000000-0000002.safetensors"
    (iter_dir / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError):
        c2.plan(iter_dir)


def test_entry_names_of_iterations_and_the_tracker(tmp_path):
    out = tmp_path / "output"
    assert mf.entry_name(out, out / "checkpoint" / "iteration_00000020") == "checkpoint/iteration_00000020"
    assert mf.entry_name(out, out / "checkpoint" / "latest_checkpointed_iteration.txt") is None
    assert mf.entry_name(out, out / "checkpoint" / "rank_0") is None
    assert mf.is_entry_name("checkpoint/iteration_00000020") and mf.is_entry_name("iteration_00000020")
    assert not mf.is_entry_name("checkpoint/iteration_x") and not mf.is_entry_name("checkpoint/other")
    assert mf.is_tracker(out, out / "checkpoint" / "latest_checkpointed_iteration.txt")
    assert mf.is_tracker(out / "checkpoint", out / "checkpoint" / "latest_checkpointed_iteration.txt")
    assert out / "checkpoint" in mf.served_dirs(out)


def test_ckpt_dir_may_be_the_checkpoint_directory_itself(tmp_path):
    checkpoint = tmp_path / "output" / "checkpoint"
    _save(checkpoint, 30)
    assert recognise(checkpoint, "iteration_00000030").step == 30


def test_the_swap_puts_the_assembled_weights_into_the_network_and_checks_the_fit_before_reading(tmp_path):
    from evald.pipeline.swap.weights import load_checkpoint2

    iter_dir = _save(tmp_path / "checkpoint", 10)

    class FakeWeights:  # the NetworkWeights seam: specs, assign, valid
        specs = {n: (a.shape, a.dtype) for n, a in WEIGHTS.items()}
        valid = True
        got: dict = {}

        def assign(self, arrays):
            self.got = dict(arrays)

    weights = FakeWeights()
    loaded = load_checkpoint2(weights, iter_dir)
    assert set(weights.got) == set(WEIGHTS) and all(np.array_equal(weights.got[n], WEIGHTS[n]) for n in WEIGHTS)
    assert loaded.keys() == weights.got.keys() and weights.valid
    weights.specs = {**FakeWeights.specs, "extra.weight": ((2,), np.dtype(np.float32))}
    (iter_dir / "llama-model-0000000-0000002.safetensors").write_bytes(b"")  # would fail if it were read
    with pytest.raises(CheckpointError, match=r"missing parameters \[extra.weight\]"):
        load_checkpoint2(weights, iter_dir)


@pytest.mark.parametrize("world,degree", [(2, 1), (2, 2), (2, 4), (1, 2)])
def test_a_tensor_parallel_rank_reads_only_its_slice_of_a_checkpoint2_iteration(tmp_path, world, degree):
    iter_dir = _save(tmp_path / "checkpoint", 10, world)
    params = c2.plan(iter_dir)
    cuts = {"emb.weight": 0, "proj.weight": 1, "norm.gamma": None}
    for rank in range(degree):
        arrays, nbytes = c2.read_slices(iter_dir, params, cuts, degree, rank)
        for name, array in WEIGHTS.items():
            want = tp_region(array.shape, cuts[name], degree, rank)
            assert np.array_equal(arrays[name], array[tuple(slice(a, b) for a, b in want)])
        assert nbytes == sum(a.nbytes for a in arrays.values())    # its share only; no optimizer byte
