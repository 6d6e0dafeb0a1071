"""Issue 18 item 1: a foreign checkpoint whose parameters are not all in the network fails the step.

The one exemption is recognisable optimizer or loss-scale state (docs/mindformers.md, "Which
entries of a foreign file may be left out"); a MindFormers weights-only file is always strict.
Real networks, real files written by MindSpore's own ``save_checkpoint``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")

from evald.files.errors import CheckpointError  # noqa: E402
from evald.files.recognise import FOREIGN, FOREIGN_WEIGHTS  # noqa: E402
from evald.pipeline.swap import training_state# noqa: E402
from evald.pipeline.swap.hot_swap import NetworkWeights  # noqa: E402
from evald.pipeline.swap.weights import load_into, match_names  # noqa: E402
from examples.tiny_lm import model  # noqa: E402

SIZE = {"d_model": 16, "seq_len": 8, "n_heads": 2, "vocab_size": 32}


def _weights(n_layers: int) -> dict[str, np.ndarray]:
    net = model.build_model(n_layers=n_layers, **SIZE, seed=3)
    return {n: p.asnumpy() + 0.5 for n, p in net.parameters_and_names()}


def _save(path: Path, arrays: dict[str, np.ndarray]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    ms.save_checkpoint([{"name": n, "data": ms.Tensor(a)} for n, a in arrays.items()], str(path))
    return path


def _train_state(weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """What MindFormers' full checkpoint holds beside the weights (mindformers 2.0, docs/mindformers.md)."""
    state = {f"{moment}.{n}": np.zeros_like(a) for n, a in weights.items() for moment in ("adam_m", "adam_v")}
    state.update({"global_step": np.array([10], np.int32), "scale_sense": np.array(1024.0, np.float32),
                  "loss_scale": np.array(1024.0, np.float32), "epoch_num": np.array(1, np.int32),
                  "step_num": np.array(10, np.int32), "learning_rate": np.array(1e-3, np.float32),
                  "current_iterator_step": np.array(10, np.int32),
                  "last_overflow_iterator_step": np.array(0, np.int32),
                  "loss_scaling_manager.cur_iter": np.array([10], np.int32)})
    return state


def test_a_weights_only_file_with_more_layers_than_the_network_fails_naming_them(tmp_path):
    """The reported case: MindFormers' checkpoint_network file of 2 layers, a model factory for 1."""
    network = NetworkWeights(model.build_model(n_layers=1, **SIZE))
    path = _save(tmp_path / "checkpoint_network/rank_0/llama_rank_0-network-1_10.ckpt", _weights(2))
    with pytest.raises(CheckpointError) as failed:
        load_into(network, path, FOREIGN_WEIGHTS)
    assert "unexpected parameters [blocks.1." in str(failed.value) and "(12)" in str(failed.value)


def test_a_full_foreign_file_with_more_layers_fails_though_its_optimizer_state_is_exempt(tmp_path):
    network = NetworkWeights(model.build_model(n_layers=1, **SIZE))
    weights = _weights(2)
    path = _save(tmp_path / "checkpoint/rank_0/llama_rank_0-1_10.ckpt", {**weights, **_train_state(weights)})
    with pytest.raises(CheckpointError) as failed:
        load_into(network, path, FOREIGN)
    message = str(failed.value)
    assert "unexpected parameters [blocks.1." in message and "(12)" in message  # the weights, not their moments


def test_a_full_foreign_file_of_the_right_model_loads_and_drops_only_the_training_state(tmp_path):
    network = NetworkWeights(model.build_model(n_layers=2, **SIZE))
    weights = _weights(2)
    path = _save(tmp_path / "checkpoint/rank_0/llama_rank_0-1_10.ckpt", {**weights, **_train_state(weights)})
    loaded = load_into(network, path, FOREIGN)
    assert set(loaded) == set(weights)
    assert all(np.array_equal(loaded[n], weights[n]) for n in weights)  # the weights, never the moments


def test_training_state_in_a_weights_only_file_is_not_exempt(tmp_path):
    network = NetworkWeights(model.build_model(n_layers=1, **SIZE))
    path = _save(tmp_path / "checkpoint_network/rank_0/llama_rank_0-network-1_10.ckpt",
                 {**_weights(1), "global_step": np.array([10], np.int32)})
    with pytest.raises(CheckpointError, match=r"unexpected parameters \[global_step\]"):
        load_into(network, path, FOREIGN_WEIGHTS)


def test_what_is_not_recognisably_training_state_fails_a_foreign_file():
    weights = _weights(1)
    expected = {n: (a.shape, a.dtype) for n, a in weights.items()}
    for extra in ("head2.weight",              # another layer
                  "adam_m.not_a_weight",       # a moment of nothing the file holds
                  "global_step.weight",        # a bookkeeping name used as a prefix
                  "my_adam_m.head.weight"):    # a prefix that only looks like a moment's
        with pytest.raises(CheckpointError, match="unexpected parameters"):
            match_names({**weights, extra: np.zeros(3, np.float32)}, expected, strict=False)
    match_names({**weights, **_train_state(weights)}, expected, strict=False)


def test_the_rule_names_the_moments_of_mindsporess_own_optimizers():
    names = {"w", "b"}
    for moment in ("adam_m", "adam_v", "moment1", "moment2", "moments", "exp_avg", "exp_avg_sq",
                   "max_exp_avg_sq", "accum", "lamb_m", "lamb_v", "mean_square", "mean_grad"):
        assert training_state.is_training_state(f"{moment}.w", names), moment
    for scalar in ("global_step", "scale_sense", "learning_rate", "epoch_num", "step_num", "beta1_power"):
        assert training_state.is_training_state(scalar, names), scalar
    assert not training_state.is_training_state("adam_m.x", names)
    assert not training_state.is_training_state("layers.1.w", names)


def test_moments_named_without_the_train_cells_prefix_are_exempt():
    """MindSpore's ModelCheckpoint of Model.train: weights ``model.w``, their moments ``adam_m.w``."""
    weights = _weights(1)
    expected = {n: (a.shape, a.dtype) for n, a in weights.items()}
    saved = {f"model.{n}": a for n, a in weights.items()}
    saved.update({f"{m}.{n}": np.zeros_like(a) for n, a in weights.items() for m in ("adam_m", "adam_v")})
    saved.update({"global_step": np.array([3], np.int32), "learning_rate": np.array(1e-3, np.float32)})
    matched = match_names(saved, expected, strict=False)
    assert all(np.array_equal(matched[n], weights[n]) for n in expected)
