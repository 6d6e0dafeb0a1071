"""Issue 18 item 15: the hook's counters agree after a busy skip: the final snapshot at train_end is
counted as taken too, so every snapshot taken is written (or failed) and skips are counted apart.
A real MindSpore network, the real writer thread and files; commits held open to force the skip."""

from __future__ import annotations

import threading

import pytest

ms = pytest.importorskip("mindspore")
from mindspore import nn  # noqa: E402

from evald.contracts import layout  # noqa: E402
from trainer_hooks import EvaldHook  # noqa: E402


def test_taken_written_and_skipped_agree_after_a_busy_skip_and_the_final_snapshot(tmp_path, monkeypatch):
    monkeypatch.setenv("EVALD_SOCKET_DIR", str(tmp_path / "sockets"))  # nobody listens there
    real, started, release = layout.write_checkpoint, threading.Event(), threading.Event()

    def held(*args, **kwargs):  # the first commit is held open until the test lets it go
        started.set()
        assert release.wait(30), "the test never released the commit"
        return real(*args, **kwargs)

    monkeypatch.setattr(layout, "write_checkpoint", held)
    net = nn.Dense(4, 3)
    hook = EvaldHook(tmp_path / "ckpt", every_n_steps=2, network=net)
    hook.step_end(2)
    assert started.wait(30)
    hook.step_end(4)  # due while step 2 is still being written: skipped
    release.set()
    hook.step_end(5)
    hook.train_end(5)  # the final snapshot: step 5 was not a snapshot step
    stats = hook.stats()
    committed = [s for s, _ in layout.list_committed(tmp_path / "ckpt")]
    assert committed == [2, 5]
    assert stats["snapshots_skipped_busy"] == 1
    assert stats["snapshots_taken"] == stats["snapshots_written"] == 2, stats
    assert stats["hook_errors"] == 0
