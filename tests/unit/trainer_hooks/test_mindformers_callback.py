"""EvaldCallback in MindFormers' shoes: a loss-scale train wrapper shaped like MindFormers 2.0's
MFTrainOneStepCell, its 5-tuple outputs, the learning rate of the step that ran, a train cell whose
weights cannot be told apart, and where the announced factories are imported from.

MindFormers is not in the project's .venv (only in .venv-mindformers, for the recipe test,
tests/e2e/test_mindformers_recipe.py, which trains with the real one), so for these fast tests
``MindFormersLikeTrainStep`` reproduces its wrapper's shape with MindSpore's own
``TrainOneStepWithLossScaleCell``: it holds ``network``, ``optimizer``, ``scale_sense`` and a
``DynamicLossScaleUpdateCell``'s parameters, checks overflow the way MindFormers' CPU workaround
does (shared/notes/mindformers), and returns ``(loss, overflow, loss_scale, learning_rate,
global_norm)`` with the rate read from the schedule before the optimizer step, as
mindformers/wrapper/wrapper.py does.
"""

from __future__ import annotations

import logging
import os
import sys

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")
from mindspore import nn, ops  # noqa: E402
from mindspore.nn.wrap.loss_scale import _ascend_grad_overflow  # noqa: E402
from mindspore.train import Model  # noqa: E402

from evald.contracts import layout, wire  # noqa: E402
from evald.pipeline.swap.hot_swap import NetworkWeights  # noqa: E402
from examples.tiny_lm import data, model  # noqa: E402
from trainer_hooks import EvaldCallback  # noqa: E402
from trainer_hooks.train_cell import step_outputs  # noqa: E402

SEQ, STEPS, EVERY = 16, 8, 4
RATES = [1e-3 * (i + 1) for i in range(STEPS)]  # a different rate at every step

_unscale = ops.MultitypeFuncGraph("unscale")


@_unscale.register("Tensor", "Tensor")
def _unscale_grad(scale, grad):
    return grad * ops.cast(ops.reciprocal(scale), ops.dtype(grad))


class MindFormersLikeTrainStep(nn.TrainOneStepWithLossScaleCell):
    def construct(self, *inputs):
        scaling_sens = self.scale_sense
        loss = self.network(*inputs)
        sens = ops.ones_like(loss) * ops.cast(scaling_sens, ops.dtype(loss))
        grads = self.grad(self.network, self.weights)(*inputs, sens)
        grads = self.hyper_map(ops.partial(_unscale, scaling_sens), grads)
        cond = self._get_distributed_overflow_status_on_infnan_mode(_ascend_grad_overflow, grads)
        overflow = self.process_loss_scale(cond)
        global_norm = ops.sqrt(ops.addn([ops.reduce_sum(ops.square(g)) for g in grads]))
        learning_rate = self.optimizer.learning_rate(self.optimizer.global_step).reshape(())
        loss = ops.depend(loss, self.optimizer(grads))
        return loss, overflow, scaling_sens, learning_rate, global_norm


class OwnTrainStep(nn.Cell):
    """A hand-written train cell: the model under another name, and a counter of its own."""

    def __init__(self, loss_net, optimizer):
        super().__init__(auto_prefix=False)
        self.loss_net, self.optimizer, self.weights = loss_net, optimizer, optimizer.parameters
        self.steps_done = ms.Parameter(ms.Tensor(0, ms.int32), name="steps_done", requires_grad=False)
        self.grad = ops.GradOperation(get_by_list=True)

    def construct(self, *inputs):
        loss = self.loss_net(*inputs)
        grads = self.grad(self.loss_net, self.weights)(*inputs)
        loss = ops.depend(loss, ops.assign_add(self.steps_done, ops.ones((), ms.int32)))
        return ops.depend(loss, self.optimizer(grads))


@pytest.fixture
def pull(tmp_path, monkeypatch):
    import zmq

    monkeypatch.setenv("EVALD_SOCKET_DIR", str(tmp_path / "sockets"))
    endpoint = f"ipc://{tmp_path}/n.sock"
    socket = zmq.Context.instance().socket(zmq.PULL)
    socket.setsockopt(zmq.LINGER, 0)
    socket.bind(endpoint)
    yield endpoint, socket
    socket.close()


def _records(socket) -> dict[int, dict]:
    records = {}
    while socket.poll(2000):
        message = wire.decode(socket.recv())
        if isinstance(message, wire.TrainMetrics):
            records.update({r["step"]: r["scalars"] for r in message.records})
    return records


def _train(train_cell, callback) -> None:
    windows = data.training_windows(STEPS * 2, seq_len=SEQ)
    dataset = ms.dataset.NumpySlicesDataset({"window": windows}, shuffle=False).batch(2)
    Model(train_cell).train(1, dataset, callbacks=[callback], dataset_sink_mode=False)


def test_mindformers_wrapper_snapshots_hold_the_weights_and_telemetry_is_complete(tmp_path, pull):
    endpoint, socket = pull
    net = model.build_model(seq_len=SEQ, d_model=32)
    optimizer = nn.AdamWeightDecay(net.trainable_params(), learning_rate=RATES)
    manager = nn.DynamicLossScaleUpdateCell(loss_scale_value=2.0 ** 10, scale_factor=2, scale_window=1000)
    train_cell = MindFormersLikeTrainStep(model.LMLoss(net), optimizer, manager)
    assert {"scale_sense", "loss_scaling_manager.cur_iter"} <= {n for n, _ in train_cell.parameters_and_names()}
    callback = EvaldCallback(str(tmp_path / "ckpt"), every_n_steps=EVERY, endpoint=endpoint, telemetry_every=STEPS)
    _train(train_cell, callback)

    assert callback.hook.errors == 0 and callback.weights_warning is None
    committed = layout.list_committed(tmp_path / "ckpt")
    assert [step for step, _ in committed] == [EVERY, STEPS]
    step_dir = committed[-1][1]
    manifest = layout.read_manifest(step_dir)
    names = {p.name for p in manifest.params}
    assert not any(word in n for n in names for word in ("scale", "loss_scaling", "adam", "global_step")), names
    fresh = model.build_model(seq_len=SEQ, d_model=32)
    NetworkWeights(fresh).load(step_dir, manifest, strict=True)  # evald's own hot swap, all names fitted
    trained = {n: p.asnumpy() for n, p in net.parameters_and_names()}
    assert all(np.array_equal(p.asnumpy(), trained[n]) for n, p in fresh.parameters_and_names())

    records = _records(socket)
    assert sorted(records) == list(range(1, STEPS + 1))
    for step, scalars in records.items():
        assert scalars["learning_rate"] == pytest.approx(RATES[step - 1]), (step, scalars)
        assert scalars["grad_norm"] > 0 and scalars["loss_scale"] == 1024.0 and scalars["overflow"] == 0.0


def test_learning_rate_is_that_of_the_step_that_ran(tmp_path, pull):
    """A plain Model(loss_net, optimizer=...): the optimizer reads its schedule at global_step and then
    increments it, so after step N get_lr() is step N+1's rate; step N must carry RATES[N-1]."""
    endpoint, socket = pull
    net = model.build_model(seq_len=SEQ, d_model=32)
    optimizer = nn.Momentum(net.trainable_params(), learning_rate=RATES, momentum=0.9)
    callback = EvaldCallback(str(tmp_path / "ckpt"), every_n_steps=100, endpoint=endpoint, telemetry_every=STEPS)
    windows = data.training_windows(STEPS * 2, seq_len=SEQ)
    dataset = ms.dataset.NumpySlicesDataset({"window": windows}, shuffle=False).batch(2)
    Model(model.LMLoss(net), optimizer=optimizer).train(1, dataset, callbacks=[callback], dataset_sink_mode=False)
    records = _records(socket)
    assert {s: r["learning_rate"] for s, r in records.items()} == pytest.approx(
        {s: RATES[s - 1] for s in range(1, STEPS + 1)})


def test_a_train_cell_whose_weights_cannot_be_told_apart_is_said_at_the_first_step(tmp_path, pull, caplog):
    endpoint, _ = pull
    net = model.build_model(seq_len=SEQ, d_model=32)
    optimizer = nn.AdamWeightDecay(net.trainable_params(), learning_rate=1e-3)
    callback = EvaldCallback(str(tmp_path / "ckpt"), every_n_steps=EVERY, endpoint=endpoint)
    with caplog.at_level(logging.WARNING, logger="trainer_hooks"):
        _train(OwnTrainStep(model.LMLoss(net), optimizer), callback)
    warnings = [r.getMessage() for r in caplog.records if "cannot tell the model's weights" in r.getMessage()]
    assert len(warnings) == 1 and "steps_done" in warnings[0] and "pass network=" in warnings[0]
    assert callback.weights_warning == warnings[0]


def test_step_outputs_by_shape():
    assert step_outputs(1.5).loss == 1.5
    assert step_outputs((1.5, 0.3)).grad_norm == 0.3
    assert step_outputs((1.5, False, 8.0)) == step_outputs((1.5, False, 8.0))
    four, five, seven = (step_outputs((1.5, False, 8.0, 1e-4, 0.3, 9, 9)[:n]) for n in (4, 5, 7))
    assert (four.learning_rate, four.grad_norm, four.loss_scale, four.overflow) == (1e-4, None, 8.0, False)
    assert five.grad_norm == seven.grad_norm == 0.3 and five.learning_rate == seven.learning_rate == 1e-4


def test_factories_are_announced_with_the_directory_the_trainer_imports_them_from(tmp_path, monkeypatch):
    from trainer_hooks.factory_path import announced_factory as _factory

    source = tmp_path / "src"
    (source / "mfpkg").mkdir(parents=True)
    (source / "mfpkg" / "__init__.py").write_text("")
    (source / "mfpkg" / "factories.py").write_text("def build():\n    return None\n")
    monkeypatch.syspath_prepend(str(source))  # as PYTHONPATH would
    launcher = tmp_path / "launcher"
    launcher.mkdir()
    monkeypatch.chdir(launcher)  # MindFormers jobs start from a launcher's directory
    assert _factory("mfpkg.factories:build", "model_factory").search_path == str(source)
    assert _factory("mfpkg:build", "model_factory").search_path == str(source)
    assert _factory("numpy.random:default_rng", "data_factory").search_path is None  # installed
    assert _factory("not_importable_here.x:y", "data_factory").search_path == str(launcher)
    assert _factory({"target": "mfpkg.factories:build", "search_path": "/opt/x"}, "m").search_path == "/opt/x"
    sys.modules.pop("mfpkg.factories", None)
    sys.modules.pop("mfpkg", None)
    assert os.getcwd() == str(launcher)
