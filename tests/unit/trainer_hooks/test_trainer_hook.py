"""The trainer hook's promises, in-process with real MindSpore parameters and real files:
it never waits for a write, never raises into the loop, and copies (not views) the weights."""

from __future__ import annotations

import logging
import time

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")
from mindspore import nn  # noqa: E402

from evald.contracts import layout  # noqa: E402
from tests.harness import wait_for  # noqa: E402
from trainer_hooks import EvaldHook  # noqa: E402
from trainer_hooks.host_copy import host_copy_of_weights  # noqa: E402


class Big(nn.Cell):
    """~200 MB of weights: committing it (safetensors + fsync + sha256) takes far longer than a call."""

    def __init__(self):
        super().__init__()
        self.w = ms.Parameter(ms.Tensor(np.ones((50_000_000,), np.float32)), name="w")

    def construct(self, x):
        return x


@pytest.fixture
def hook_env(monkeypatch, tmp_path):
    monkeypatch.setenv("EVALD_SOCKET_DIR", str(tmp_path / "sockets"))  # nobody listens there


def test_snapshot_due_while_writing_is_skipped_and_counted(tmp_path, hook_env):
    net = Big()
    hook = EvaldHook(tmp_path / "ckpt", every_n_steps=1, network=net)
    hook.step_end(1)
    assert hook.writer.busy  # step_end returned while the write is still going on
    hook.step_end(2)
    hook.step_end(3)
    hook.train_end(3)
    stats = hook.stats()
    assert stats["snapshots_written"] >= 1 and stats["snapshots_skipped_busy"] >= 1
    assert stats["hook_errors"] == 0
    assert [s for s, _ in layout.list_committed(tmp_path / "ckpt")][0] == 1


def test_nothing_raises_into_the_training_loop(tmp_path, hook_env):
    class Broken:
        def parameters_and_names(self):
            raise RuntimeError("device lost")

    hook = EvaldHook(tmp_path / "ckpt", every_n_steps=1, network=Broken())
    assert hook.step_end(1, loss="not a number", lr=object()) is False
    assert hook.errors == 1
    hook.train_end(1)


def test_unwritable_checkpoint_dir_is_recorded_not_raised(tmp_path, hook_env, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the checkpoint directory should be")
    with caplog.at_level(logging.ERROR, logger="trainer_hooks"):
        hook = EvaldHook(blocker / "ckpt", every_n_steps=1, network=nn.Dense(2, 2))
    # the failure is counted and said, with the cause, and the hook then stays out of the way
    assert hook.errors == 1 and hook.writer is None
    assert "evald hook set-up failed; training continues without evald" in caplog.text
    assert "NotADirectoryError" in caplog.text or "FileExistsError" in caplog.text
    assert [hook.step_end(step) for step in (1, 2, 3)] == [False, False, False]
    hook.train_end(3)  # must not raise either
    stats = hook.stats()
    assert stats["hook_errors"] == 1 and stats["snapshots_written"] == 0 and not blocker.is_dir()


def test_repeated_step_keeps_the_first_checkpoint(tmp_path, hook_env):
    net = nn.Dense(2, 2)
    hook = EvaldHook(tmp_path / "ckpt", every_n_steps=1, network=net)
    hook.step_end(1)
    hook.writer.close()
    first = layout.read_manifest(tmp_path / "ckpt" / layout.step_dir_name(1))
    resumed = EvaldHook(tmp_path / "ckpt", every_n_steps=1, network=net)
    resumed.step_end(1)
    resumed.writer.close()
    assert resumed.writer.failed == 0
    assert layout.read_manifest(tmp_path / "ckpt" / layout.step_dir_name(1)) == first


def test_disk_error_during_commit_is_counted_and_training_goes_on(tmp_path, hook_env):
    net = nn.Dense(2, 2)
    hook = EvaldHook(tmp_path / "ckpt", every_n_steps=1, network=net)
    (tmp_path / "ckpt" / layout.RUN_FILE).unlink()
    (tmp_path / "ckpt").rmdir()
    (tmp_path / "ckpt").write_text("the directory was replaced by a file: every write fails")
    hook.step_end(1)
    hook.writer.close()
    assert hook.writer.failed == 1 and "step 1" in hook.writer.last_error
    assert hook.step_end(2) is False  # a closed writer: the next step is simply not snapshotted


def test_host_copy_is_a_copy_not_a_view():
    net = nn.Dense(2, 2)
    copied = host_copy_of_weights(net)
    before = copied["weight"].copy()
    net.weight.set_data(ms.Tensor(np.full((2, 2), 7.0, np.float32)))
    assert np.array_equal(copied["weight"], before)


def test_optimizer_state_is_not_in_the_snapshot():
    net = nn.Dense(2, 2)
    optimizer = nn.Adam(net.trainable_params())
    train = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), optimizer)
    # weights only (no adam moments, step counter or learning rate), named as in the bare network
    assert set(host_copy_of_weights(train, optimizer)) == set(host_copy_of_weights(net)) == {"weight", "bias"}
    assert len(list(train.get_parameters())) > 2


def test_callback_without_network_snapshots_weights_that_fit_the_bare_network(tmp_path, hook_env):
    from mindspore.train import Model

    from evald.pipeline.swap.weights import match_names
    from examples.tiny_lm import data, model
    from trainer_hooks import EvaldCallback, TrainStepWithGradNorm

    net = model.build_model(seq_len=16, d_model=32)
    optimizer = nn.AdamWeightDecay(net.trainable_params(), 1e-3)
    windows = data.training_windows(8, seq_len=16)
    dataset = ms.dataset.NumpySlicesDataset({"window": windows}, shuffle=False).batch(4)
    callback = EvaldCallback(str(tmp_path / "ckpt"), every_n_steps=2)  # no network=: the train cell
    Model(TrainStepWithGradNorm(model.LMLoss(net), optimizer)).train(1, dataset, callbacks=[callback])

    [(step, path)] = layout.list_committed(tmp_path / "ckpt")
    from safetensors.numpy import load_file

    weights = load_file(str(path / layout.WEIGHTS_FILE))
    bare = model.build_model(seq_len=16, d_model=32)
    expected = {name: (tuple(p.shape), str(p.dtype)) for name, p in bare.parameters_and_names()}
    assert set(match_names(weights, expected, strict=True)) == set(expected)  # no optimizer state


def test_cleanup_keeps_the_newest_and_never_the_best(tmp_path, hook_env):
    """keep_last 2 with evald reachable (its real control publisher) naming step 1 the best and having
    released every step: the newest two are kept, and the best beside them."""
    from evald.contracts.wire import ControlState
    from tests.unit.sinks.test_retention import Publisher

    net = nn.Dense(2, 2)
    ckpt = tmp_path / "ckpt"
    endpoint = f"ipc://{tmp_path}/control.sock"
    publisher = Publisher(endpoint)
    publisher.state = ControlState(run_id="r", seq=0, best_step=1, released=(1, 2, 3, 4, 5), lease_s=60.0)
    try:
        hook = EvaldHook(ckpt, every_n_steps=1, network=net, keep_last=2, run_id="r", control_endpoint=endpoint)
        # A PUB drops what it sends before a SUB joins: wait until the writer's subscriber has evald's state.
        # The writer thread is idle until the first step_end, so its socket is used by one thread at a time.
        wait_for(lambda: hook.writer.retention.current() is not None, 10, "evald's state at the writer")
        for step in range(1, 6):
            hook.step_end(step)
            _wait_idle(hook)  # one write at a time: a snapshot due while writing would be skipped
        hook.writer.close(timeout_s=30)
    finally:
        publisher.stop()
    assert [s for s, _ in layout.list_committed(ckpt)] == [1, 4, 5]
    assert hook.stats()["snapshots_deleted"] == 2 and hook.stats()["snapshots_skipped_budget"] == 0


def _wait_idle(hook):
    deadline = time.time() + 30
    while hook.writer.busy and time.time() < deadline:
        time.sleep(0.01)


def test_learning_rate_advice_is_applied_once_and_only_to_a_fixed_rate():
    from trainer_hooks import ScaleLearningRate

    net = nn.Dense(2, 2)
    optimizer = nn.AdamWeightDecay(net.trainable_params(), learning_rate=1e-3)
    apply = ScaleLearningRate(optimizer, min_lr=3e-4)
    apply({"id": 1, "kind": "overfitting", "scale": 0.5, "reason": "test"})
    assert float(optimizer.learning_rate.asnumpy()) == pytest.approx(5e-4)
    apply({"id": 2, "kind": "overfitting", "scale": 0.5, "reason": "test"})
    assert float(optimizer.learning_rate.asnumpy()) == pytest.approx(3e-4)  # clipped at min_lr
    schedule = nn.CosineDecayLR(1e-5, 1e-3, 100)
    scheduled = nn.AdamWeightDecay(nn.Dense(2, 2).trainable_params(), learning_rate=schedule)
    ScaleLearningRate(scheduled)({"id": 1, "scale": 0.5})  # logged, not applied, no error


def test_telemetry_reaches_a_real_socket_with_loss_scale_and_overflow(tmp_path, hook_env):
    import zmq

    from evald.contracts import wire

    endpoint = f"ipc://{tmp_path}/n.sock"
    pull = zmq.Context.instance().socket(zmq.PULL)
    pull.setsockopt(zmq.LINGER, 0)
    pull.bind(endpoint)
    hook = EvaldHook(tmp_path / "ckpt", every_n_steps=100, endpoint=endpoint, telemetry_every=2,
                     total_steps=10)
    for step in (1, 2):
        hook.step_end(step, loss=ms.Tensor(2.5), grad_norm=np.float32(0.7), loss_scale=ms.Tensor(1024.0),
                      overflow=ms.Tensor(step == 2), lr=1e-3, samples=8, tokens=512)
    messages = []
    while pull.poll(5000):
        messages.append(wire.decode(pull.recv()))
        if isinstance(messages[-1], wire.TrainMetrics):
            break
    hook.train_end(2)
    pull.close()
    [metrics] = [m for m in messages if isinstance(m, wire.TrainMetrics)]
    first, second = (r["scalars"] for r in metrics.records)
    assert first == {"loss": 2.5, "grad_norm": pytest.approx(0.7), "loss_scale": 1024.0, "overflow": 0.0,
                     "learning_rate": 1e-3}
    assert second["overflow"] == 1.0 and second["tokens_per_s"] > 0 and second["eta_s"] >= 0
