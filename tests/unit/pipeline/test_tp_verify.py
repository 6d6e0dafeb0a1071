"""A tensor-parallel eval group refuses exactly what one device refuses (issue 35).

One device reads every weights file of an evald snapshot whole and checks it against the manifest's
digest (evald.contracts.layout.read_checkpoint). A tensor-parallel rank reads only the byte ranges of
its slices (evald.pipeline.swap.tp_load), so the group shares the whole-file check out: every file is
verified by exactly one rank, and a file found bad by any rank fails the checkpoint with the reason one
device gives. A lone reader (no group) verifies every file itself. Weights files that are not regular
files (a FIFO) are refused at once, never waited on.

The group runs in threads with a thread-barrier SUM standing in for AllReduce
(tests/unit/pipeline/test_eval_group_protocol.py), and each rank's "network" is a stand-in whose load is
the real tensor-parallel load (``Evaluator._load_shard``) and whose forward is one collective of its own,
as a tensor-parallel model's is, so no model is compiled: a rank that found a bad file must not leave the
others waiting in the model's collective while it answers.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pytest

from bench.reshard_read import llama_weights, write_tp
from evald.contracts import layout
from evald.contracts.partition import group_name, part_dir_name
from evald.contracts.wire import FactorySpec
from evald.files import checkpoint2
from evald.files.errors import CheckpointError
from evald.files.recognise import CHECKPOINT2, EVALD, PARTS
from evald.files.slices import tp_region
from evald.pipeline.swap.tp_load import read_rank
from tests.checkpoint2_layout import CUT, WEIGHTS as CKPT2_WEIGHTS, save as save_checkpoint2
from tests.unit.pipeline.test_eval_group_protocol import run_ranks

WEIGHTS, CUTS = llama_weights(hidden=16, layers=1, vocab=32)
HANG_S = 20   # far above what a refused FIFO takes (milliseconds): a read that takes this long is waiting forever


def _specs(weights, cuts, degree, rank):
    """The shapes a rank's network built for this degree holds (by the network's own names)."""
    return {n: (tuple(b - a for a, b in tp_region(a.shape, cuts.get(n), degree, rank)), a.dtype)
            for n, a in weights.items()}


def _snapshot(ckpt: Path, written: int, step: int = 10) -> tuple[Path, str, list[Path]]:
    """The step written at training TP ``written`` (1: a whole snapshot): its path, kind and step dirs."""
    if written == 1:
        step_dir = layout.write_checkpoint(ckpt, step, WEIGHTS, run_id="r")
        return step_dir, EVALD, [step_dir]
    write_tp(ckpt, step, WEIGHTS, CUTS, written)
    return ckpt / group_name(step, written), PARTS, [ckpt / part_dir_name(step, i, written) for i in range(written)]


def _positions(path: Path) -> dict[str, int]:
    """Where to change one byte: the header's length, its JSON, the first and the last byte of the data."""
    data = path.read_bytes()
    start = 8 + int.from_bytes(data[:8], "little")
    return {"length prefix": 1, "header": start // 2, "first data byte": start, "last byte": len(data) - 1}


def _flip(path: Path, at: int) -> None:
    """Change one bit of the byte at ``at`` in place (same inode, same size); calling it again undoes it."""
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ 0x10]))


def _one_device_reason(step_dir: Path) -> str:
    """What one device records for the snapshot: its read of every file, verified (evald's layout)."""
    with pytest.raises(layout.LayoutError) as refused:
        layout.read_checkpoint(step_dir, layout.read_manifest(step_dir))
    return str(refused.value)


def _weights_files(step_dirs: list[Path]) -> list[Path]:
    return [d / f.name for d in step_dirs for f in layout.read_manifest(d).files]


@pytest.mark.parametrize("written,degree", [(1, 2), (2, 2), (4, 2)])
def test_a_lone_reader_refuses_a_changed_byte_anywhere_with_one_devices_reason(tmp_path, written, degree):
    path, kind, step_dirs = _snapshot(tmp_path, written)
    for file in _weights_files(step_dirs):
        for where, at in _positions(file).items():
            _flip(file, at)
            reason = _one_device_reason(file.parent)
            with pytest.raises(CheckpointError) as refused:
                read_rank(path, kind, _specs(WEIGHTS, CUTS, degree, 0), degree, 0)
            assert str(refused.value) == reason, (file.name, where)
            _flip(file, at)
    got = read_rank(path, kind, _specs(WEIGHTS, CUTS, degree, 1), degree, 1)   # unchanged again: read
    assert set(got.arrays) == set(WEIGHTS)


# --- the group ----------------------------------------------------------------------------------

class _Weights:
    """A rank network's weights as the tensor-parallel load sees them (evald.pipeline.swap.hot_swap)."""

    def __init__(self, specs):
        self.specs, self.valid, self.held = specs, True, {}

    def destinations(self):
        return None

    def assign(self, arrays):
        self.held.update(arrays)


class _Rank:
    """A rank's Evaluator, but for the network: loading is the real tensor-parallel load, and its forward is
    one collective of the model's own (a tensor-parallel model's AllReduce), which every rank must join."""

    def __init__(self, rank: int, size: int, refusals: dict, model_sum) -> None:
        self.tensor_parallel, self.rank, self.model_sum = (size, rank), rank, model_sum
        self.weights = _Weights(_specs(WEIGHTS, CUTS, size, rank))
        self.layout, self.subset, self.batches, self.refusals = {}, None, [], refusals

    def _load(self, path: Path, kind: str) -> None:
        from evald.pipeline.network import Evaluator

        try:
            Evaluator._load_shard(self, path, kind)   # type: ignore[arg-type]
        except Exception as exc:
            self.refusals.setdefault(path, {})[self.rank] = exc
            raise

    def evaluate_part(self, path, kind, should_abort, after_swap=lambda: None):
        from evald.pipeline.network import PartResult

        self._load(path, kind)
        after_swap()
        self.model_sum(np.ones(3, np.float32))   # the model's own collective: a vector of another length
        return PartResult({}, 0.0, 0.0, {"weights_sha256": "x"})

    def load_only(self, path, kind, step=None):
        self._load(path, kind)
        return {"weights_sha256": "x"}

    def metrics_of(self, arrays):
        return {"loss": 1.0}, {}


def _group(monkeypatch, size: int, rank0, refusals: dict | None = None) -> tuple[object, dict]:
    """Run ``rank0(group_evaluator)`` on rank 0 of a ``size``-rank group while the others follow; its result,
    and what each rank refused (``refusals``: {path: {rank: exception}})."""
    from evald.pipeline.group import evaluator as group_evaluator

    refusals = {} if refusals is None else refusals
    sums = {}
    monkeypatch.setattr(group_evaluator, "build_local",
                        lambda spec, part: _Rank(part[0], part[1], refusals, sums[part[0]]))
    factory = FactorySpec("examples.tiny_lm.model:build_model")

    def body(group):
        sums[group.rank] = group._sum
        if group.rank:
            return group_evaluator.follow(group)
        evaluator = group_evaluator.GroupEvaluator(group, task="lm", model=factory, data=factory, subset_size=8,
                                                   subset_seed=0, batch_size=8, generation=None,
                                                   tensor_parallel=size)
        try:
            return rank0(evaluator)
        finally:
            group.close()
    return run_ranks(size, body)[0], refusals


@pytest.mark.parametrize("written,size", [(4, 2), (1, 2), (2, 4)])
def test_the_group_verifies_every_file_once_and_refuses_a_changed_byte_with_one_devices_reason(
        tmp_path, monkeypatch, written, size):
    path, kind, step_dirs = _snapshot(tmp_path, written)
    files = _weights_files(step_dirs)
    cases = [(file, where, at) for file in files for where, at in _positions(file).items()]
    refusals: dict = {}

    def rank0(evaluator):
        outcomes = []
        for file, _where, at in cases:
            _flip(file, at)
            reason = _one_device_reason(file.parent)
            with pytest.raises(CheckpointError) as evaluated:   # a fact about the file: recorded as failed
                evaluator.evaluate(path, kind)
            found_evaluating = set(refusals.pop(path, {}))
            with pytest.raises(CheckpointError) as swapped:      # a suite's or serving's swap (SWAP) alike
                evaluator.load_only(path, kind)
            found_swapping = set(refusals.pop(path, {}))
            outcomes.append((str(evaluated.value), str(swapped.value), reason, found_evaluating, found_swapping))
            _flip(file, at)
        return outcomes, evaluator.evaluate(path, kind).metrics

    (outcomes, metrics), _ = _group(monkeypatch, size, rank0, refusals)
    assert metrics == {"loss": 1.0} and not refusals      # the good snapshot: evaluated, the group in step
    finders: dict[Path, set[int]] = {}
    for (file, where, _), (evaluated, swapped, reason, found_evaluating, found_swapping) in zip(cases, outcomes):
        assert evaluated == swapped == reason, (file.name, where)
        # found by exactly one rank, the one whose share holds the file (not by every rank: no double cost)
        assert len(found_evaluating) == 1 and found_swapping == found_evaluating, (file.name, where)
        finders.setdefault(file, set()).update(found_evaluating)
    assert all(len(ranks) == 1 for ranks in finders.values()), finders
    assert len(set().union(*finders.values())) == min(size, len(files))   # the work is shared out


# --- files that are not regular files ---------------------------------------------------------------

def _finishes(fn, unblock: Path) -> BaseException | None:
    """Run ``fn`` in a thread; what it raised. Fails if it is still waiting after HANG_S (then a writer opens
    the FIFO ``unblock`` so that the stuck thread ends)."""
    outcome: list = []

    def run():
        try:
            fn()
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - reported below
            outcome.append(exc)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(HANG_S)
    if thread.is_alive():
        fd = os.open(unblock, os.O_WRONLY | os.O_NONBLOCK)  # the reader waits in open: this lets it go
        os.close(fd)
        thread.join(HANG_S)
        pytest.fail(f"still waiting on the FIFO {unblock.name} after {HANG_S}s")
    return outcome[0]


def test_a_fifo_in_place_of_a_weights_file_is_refused_at_once_by_a_tp_rank(tmp_path):
    path, kind, step_dirs = _snapshot(tmp_path, 2)
    victim = _weights_files(step_dirs)[1]
    victim.unlink()
    os.mkfifo(victim)
    for rank in range(2):
        raised = _finishes(lambda: read_rank(path, kind, _specs(WEIGHTS, CUTS, 2, rank), 2, rank), victim)
        assert isinstance(raised, CheckpointError) and f"{victim.name} is a FIFO, not a regular file" in str(raised)


def test_a_fifo_seen_by_the_group_fails_the_step_once_without_waiting(tmp_path, monkeypatch):
    path, kind, step_dirs = _snapshot(tmp_path, 2)
    victim = _weights_files(step_dirs)[0]
    victim.unlink()
    os.mkfifo(victim)

    def rank0(evaluator):
        return _finishes(lambda: evaluator.evaluate(path, kind), victim)

    raised, _ = _group(monkeypatch, 2, rank0)
    assert isinstance(raised, CheckpointError) and "is a FIFO, not a regular file" in str(raised)


# --- MindFormers' Checkpoint 2.0: no digest, the same headers checked --------------------------------

def test_checkpoint2_has_no_digest_so_one_device_and_every_rank_check_the_same_headers(tmp_path):
    iter_dir = save_checkpoint2(tmp_path / "checkpoint", 10, 2)
    model = sorted(iter_dir.glob("*-model-*"))[1]
    header = 8 + int.from_bytes(model.read_bytes()[:8], "little")
    with open(model, "r+b") as f:   # the header says the file is longer than it is
        f.truncate(header + 4)
    params = checkpoint2.plan(iter_dir)
    with pytest.raises(CheckpointError) as one_device:
        checkpoint2.read_whole(iter_dir, params)
    for rank in range(2):
        with pytest.raises(CheckpointError) as on_rank:
            read_rank(iter_dir, CHECKPOINT2, _specs(CKPT2_WEIGHTS, CUT, 2, rank), 2, rank)
        assert str(on_rank.value) == str(one_device.value)
