"""The trainer's snapshot writer: one reusable set of host buffers that is safe by construction
(never filled while written, never written while filled), and its own orphan cleanup at start.
Real MindSpore parameters, real files, the real writer thread."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")
from mindspore import nn  # noqa: E402

from evald.contracts import layout  # noqa: E402
from trainer_hooks.snapshot_writer import SnapshotWriter  # noqa: E402


class GatedCommits:
    """Wraps layout.write_checkpoint: records the arrays each commit got; holds commits until released."""

    def __init__(self, monkeypatch):
        self.real = layout.write_checkpoint
        self.release = threading.Event()
        self.started = threading.Event()
        self.pointers: list[dict[str, int]] = []
        monkeypatch.setattr(layout, "write_checkpoint", self)

    def __call__(self, ckpt_dir, step, weights, **kwargs):
        self.pointers.append({name: a.ctypes.data for name, a in weights.items()})
        self.started.set()
        assert self.release.wait(30), "test never released the commit"
        return self.real(ckpt_dir, step, weights, **kwargs)


def wait_idle(writer, timeout=30.0):
    deadline = time.time() + timeout
    while writer.busy and time.time() < deadline:
        time.sleep(0.005)
    assert not writer.busy


def saved(ckpt, step):
    path = ckpt / layout.step_dir_name(step)
    return layout.read_checkpoint(path, layout.read_manifest(path))


def set_weight(net, value):
    np.copyto(net.weight.asnumpy(), np.full(net.weight.shape, value, np.float32))  # as an optimizer step does


def test_buffers_are_reused_and_never_refilled_while_being_written(tmp_path, monkeypatch):
    gate = GatedCommits(monkeypatch)
    net = nn.Dense(4, 3)
    writer = SnapshotWriter(tmp_path, "r", on_committed=lambda *a: None)
    set_weight(net, 1.0)
    assert writer.try_snapshot(1, net)
    assert gate.started.wait(30)            # the commit of step 1 has its arrays and is held open
    set_weight(net, 2.0)                    # training goes on and changes the weights in place
    assert writer.try_snapshot(2, net) is False and writer.skipped_busy == 1
    gate.release.set()
    wait_idle(writer)
    assert np.all(saved(tmp_path, 1)["weight"] == 1.0)   # the copy, not the live memory, and not step 2's
    set_weight(net, 3.0)
    assert writer.try_snapshot(3, net)
    wait_idle(writer)
    writer.close()
    assert np.all(saved(tmp_path, 3)["weight"] == 3.0)
    assert gate.pointers[0] == gate.pointers[1]          # the same host memory for both snapshots
    assert gate.pointers[0]["weight"] != net.weight.data_ptr()
    assert writer.written == 2


def test_a_failed_copy_raises_and_leaves_the_writer_idle(tmp_path):
    class Broken:
        def parameters_and_names(self):
            raise RuntimeError("device lost")

    writer = SnapshotWriter(tmp_path, "r", on_committed=lambda *a: None)
    with pytest.raises(RuntimeError, match="device lost"):
        writer.try_snapshot(1, Broken())
    assert not writer.busy
    assert writer.try_snapshot(2, nn.Dense(2, 2))
    writer.close()
    assert [s for s, _ in layout.list_committed(tmp_path)] == [2]


def test_a_large_snapshot_is_written_in_several_files(tmp_path):
    writer = SnapshotWriter(tmp_path, "r", on_committed=lambda *a: None, shard_bytes=1000, threads=2)
    net = nn.SequentialCell([nn.Dense(16, 16), nn.Dense(16, 16), nn.Dense(16, 4)])
    assert writer.try_snapshot(5, net)
    writer.close()
    manifest = layout.read_manifest(tmp_path / layout.step_dir_name(5))
    assert len(manifest.files) >= 3
    got = saved(tmp_path, 5)
    assert all(np.array_equal(got[name], p.asnumpy()) for name, p in net.parameters_and_names())


def test_the_writer_removes_its_own_old_orphans_when_it_starts(tmp_path):
    old = tmp_path / ".step_000000010.tmp-0a1b2c"
    old.mkdir()
    (old / "weights-00001-of-00002.safetensors").write_bytes(b"half")
    for path in (old / "weights-00001-of-00002.safetensors", old):
        os.utime(path, (1, 1))
    young = tmp_path / ".step_000000020.tmp-3d4e5f"   # maybe another writer, still running
    young.mkdir()
    foreign = tmp_path / ".hidden-by-someone-else"
    foreign.mkdir()
    os.utime(foreign, (1, 1))
    writer = SnapshotWriter(tmp_path, "r", on_committed=lambda *a: None, orphan_temp_age_s=60)
    writer.close()
    assert not old.exists() and young.exists() and foreign.exists()
    assert writer.orphans_removed == 1


def test_prepared_buffers_are_the_ones_the_first_snapshot_fills(tmp_path, monkeypatch):
    gate = GatedCommits(monkeypatch)
    gate.release.set()
    net = nn.Dense(64, 32)
    writer = SnapshotWriter(tmp_path, "r", on_committed=lambda *a: None)
    assert writer.prepare(net)
    deadline = time.time() + 30
    while not writer.buffers.arrays and time.time() < deadline:
        time.sleep(0.005)
    prepared = {n: a.ctypes.data for n, a in writer.buffers.arrays.items()}
    assert set(prepared) == {"weight", "bias"}
    assert writer.try_snapshot(1, net)
    writer.close()
    assert gate.pointers == [prepared]
    assert np.array_equal(saved(tmp_path, 1)["weight"], net.weight.asnumpy())


def test_a_snapshot_right_after_prepare_is_taken_not_skipped(tmp_path):
    net = nn.Dense(512, 512)
    for _ in range(5):  # whichever comes first, the preparation or the snapshot
        writer = SnapshotWriter(tmp_path / str(_), "r", on_committed=lambda *a: None)
        writer.prepare(net)
        assert writer.try_snapshot(1, net) and writer.skipped_busy == 0
        writer.close()
        assert np.array_equal(saved(tmp_path / str(_), 1)["weight"], net.weight.asnumpy())
