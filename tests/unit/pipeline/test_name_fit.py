"""Names that differ by a prefix on one side: a wrapper Cell in the model factory (``net.``), a train
cell or loss cell in the checkpoint (``model.``), optimizer moments beside the weights; and the
hint that says what differs when nothing fits. Real networks and real checkpoint files."""

from __future__ import annotations

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")
from mindspore import nn  # noqa: E402

from evald.pipeline.swap import name_fit# noqa: E402
from evald.files.recognise import CheckpointError  # noqa: E402
from evald.contracts import layout  # noqa: E402
from evald.pipeline.swap.hot_swap import NetworkMismatch, NetworkWeights  # noqa: E402
from evald.pipeline.swap.weights import match_names  # noqa: E402
from examples.tiny_lm import model  # noqa: E402

SIZE = {"seq_len": 16, "d_model": 32}


class Logits(nn.Cell):
    """The obvious model factory for a model that returns a tuple: wrap it, return the logits."""

    def __init__(self, net):
        super().__init__()
        self.net = net

    def construct(self, tokens):
        return self.net(tokens)


def _weights(net, seed=1):
    rng = np.random.default_rng(seed)
    return {n: (p.asnumpy() + 0.1 * rng.standard_normal(p.shape)).astype(np.float32)
            for n, p in net.parameters_and_names()}


def test_a_wrapper_in_the_model_factory_still_loads_evald_checkpoints(tmp_path):
    bare = model.build_model(**SIZE)
    saved = _weights(bare)  # what EvaldHook(network=bare model) writes: the bare names
    step_dir = layout.write_checkpoint(tmp_path, 10, saved, run_id="r")
    wrapped = Logits(model.build_model(**SIZE, seed=5))
    assert all(n.startswith("net.") for n, _ in wrapped.parameters_and_names())
    NetworkWeights(wrapped).load(step_dir, layout.read_manifest(step_dir), strict=True)
    assert all(np.array_equal(p.asnumpy(), saved[n.removeprefix("net.")]) for n, p in wrapped.parameters_and_names())


def test_a_wrapper_in_the_model_factory_and_a_foreign_file_with_optimizer_state():
    bare = model.build_model(**SIZE)
    weights = _weights(bare)
    saved = {**weights, **{f"adam_m.{n}": a * 0 for n, a in weights.items()},
             **{f"adam_v.{n}": a * 0 + 7 for n, a in weights.items()}, "global_step": np.array([3], np.int32)}
    expected = {n: (p.shape, np.float32) for n, p in Logits(model.build_model(**SIZE)).parameters_and_names()}
    matched = match_names(saved, expected, strict=False)
    assert set(matched) == set(expected)
    assert all(np.array_equal(matched[n], weights[n.removeprefix("net.")]) for n in matched)  # not the moments


def test_the_hint_says_what_differs():
    net = {"net.tok.w": 1, "net.head.w": 1, "net.head.b": 1}
    cases = {  # checkpoint names -> words the error must contain
        ("adam_m.tok.w", "adam_m.head.w", "adam_m.head.b", "adam_v.tok.w", "adam_v.head.w", "adam_v.head.b"):
            ["equally well", "'adam_m.'", "'adam_v.'"],
        ("tok.w", "head.w"): ["2 of 3 network parameters", "network prefix 'net.' added", "'net.head.b'"],
        ("model.embed.w", "model.out.w"): ["no name matches", "'model.embed.w'", "'net.head.b'",
                                           "every checkpoint name starts with 'model.'",
                                           "every network name starts with 'net.'"],
    }
    for names, words in cases.items():
        hint = name_fit.explain(names, net)
        assert all(w in hint for w in words), (names, hint)
    ambiguous = name_fit.fit(next(iter(cases)), net)
    assert ambiguous.mapping == {} and ambiguous.ambiguous  # never the moments as weights


def test_misfit_errors_carry_the_hint_not_a_guess(tmp_path):
    bare = model.build_model(**SIZE)
    saved = {f"other.{n}": a for n, a in _weights(bare).items() if "ln_f" not in n}
    expected = {n: (p.shape, np.float32) for n, p in bare.parameters_and_names()}
    with pytest.raises(CheckpointError) as foreign:
        match_names(saved, expected, strict=False)
    assert "of 30 network parameters are there (with checkpoint prefix 'other.' removed)" in str(foreign.value)
    step_dir = layout.write_checkpoint(tmp_path, 20, {n: a for n, a in _weights(bare).items() if "ln_f" not in n},
                                       run_id="r")
    with pytest.raises(NetworkMismatch) as evald_layout:
        NetworkWeights(bare).load(step_dir, layout.read_manifest(step_dir), strict=True)
    assert "missing parameters [ln_f" in str(evald_layout.value) and "28 of 30" in str(evald_layout.value)
    other_shape = {n: a for n, a in _weights(model.build_model(seq_len=16, d_model=64)).items()}
    with pytest.raises(CheckpointError, match="every network parameter is there; the shapes differ"):
        match_names(other_shape, expected, strict=False)
