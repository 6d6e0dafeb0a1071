"""Hot swap into a network compiled once in Graph mode: reading a checkpoint straight into the
live parameter memory (``Parameter.asnumpy()`` views on CPU) must give bit for bit what
``load_param_into_net`` of the same arrays gives, across swaps A, B, A; and the set_data
fallback, dtype conversion, misfits and corrupt files behave. Real networks, real files."""

from __future__ import annotations

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")

from evald.contracts import layout  # noqa: E402
from evald.pipeline.swap.hot_swap import NetworkMismatch, NetworkWeights  # noqa: E402
from examples.tiny_lm import model  # noqa: E402

SIZE = {"seq_len": 16, "d_model": 32}


pytestmark = pytest.mark.usefixtures("graph_mode")  # tests/unit/conftest.py


@pytest.fixture(scope="module")
def tokens():
    return ms.Tensor(np.random.default_rng(0).integers(0, 256, (2, 16)).astype(np.int32))


def compiled(tokens, seed=0):
    net = model.build_model(**SIZE, seed=seed)
    net.set_train(False)
    net(tokens)  # compile now, as evald does before the first checkpoint
    return net


def variants(net, count=2):
    rng = np.random.default_rng(1)
    base = {name: p.asnumpy().copy() for name, p in net.parameters_and_names()}
    return [{n: (a + 0.1 * rng.standard_normal(a.shape)).astype(a.dtype) for n, a in base.items()}
            for _ in range(count)]


def reference_output(reference, weights, tokens):
    """The established path: load_param_into_net of fresh Parameters, its lists checked."""
    params = {p.name: ms.Parameter(ms.Tensor(np.array(weights[n], np.float32)), name=p.name)
              for n, p in reference.parameters_and_names()}
    assert ms.load_param_into_net(reference, params, strict_load=True) == ([], [])
    return reference(tokens).asnumpy()


def test_reading_into_live_memory_is_what_the_compiled_graph_computes_with(tmp_path, tokens):
    net, fallback, reference = compiled(tokens), compiled(tokens, seed=3), compiled(tokens, seed=4)
    in_place, by_set_data = NetworkWeights(net), NetworkWeights(fallback, in_place=False)
    assert in_place.in_place and by_set_data.destinations() is None
    memory = {name: p.data_ptr() for name, p in net.parameters_and_names()}
    a, b = variants(net)
    outputs = []
    for step, weights in enumerate((a, b, a)):
        path = layout.write_checkpoint(tmp_path, step, weights, run_id="r", shard_bytes=20_000)
        manifest = layout.read_manifest(path)
        assert len(manifest.files) > 1
        assert set(in_place.load(path, manifest).values()) == {"in place"}
        assert set(by_set_data.load(path, manifest).values()) == {"set_data"}
        out = net(tokens).asnumpy()
        assert out.tobytes() == reference_output(reference, weights, tokens).tobytes()
        assert out.tobytes() == fallback(tokens).asnumpy().tobytes()
        # no new memory: the bytes went where the graph already reads them
        assert {name: p.data_ptr() for name, p in net.parameters_and_names()} == memory
        outputs.append(out)
    assert outputs[0].tobytes() != outputs[1].tobytes()   # the swap changed the result...
    assert outputs[0].tobytes() == outputs[2].tobytes()   # ...and A again gives A's result


def test_after_set_data_elsewhere_the_fresh_views_are_still_live(tmp_path, tokens):
    net, reference = compiled(tokens), compiled(tokens, seed=4)
    a, b = variants(net)
    reference_output(net, b, tokens)  # someone swapped with load_param_into_net: new memory
    weights = NetworkWeights(net)
    path = layout.write_checkpoint(tmp_path, 1, a, run_id="r")
    weights.load(path, layout.read_manifest(path))
    assert net(tokens).asnumpy().tobytes() == reference_output(reference, a, tokens).tobytes()


def test_a_dtype_conversion_goes_through_set_data(tmp_path, tokens):
    net, reference = compiled(tokens), compiled(tokens, seed=4)
    half = {n: a.astype(np.float16) for n, a in variants(net, 1)[0].items()}
    path = layout.write_checkpoint(tmp_path, 1, half, run_id="r")
    how = NetworkWeights(net).load(path, layout.read_manifest(path))
    assert set(how.values()) == {"set_data"}
    assert net(tokens).asnumpy().tobytes() == reference_output(reference, half, tokens).tobytes()


@pytest.mark.parametrize("edit, words", [
    (lambda w: w.pop("ln_f.gamma"), "missing parameters [ln_f.gamma]"),
    (lambda w: w.update({"extra.weight": np.ones(3, np.float32)}), "unexpected parameters [extra.weight]"),
    (lambda w: w.update({"head.weight": w["head.weight"][:, :-1].copy()}), "shape mismatch [head.weight"),
])
def test_a_checkpoint_that_does_not_fit_leaves_the_network_untouched(tmp_path, tokens, edit, words):
    net = compiled(tokens)
    before = net(tokens).asnumpy()
    weights = variants(net, 1)[0]
    edit(weights)
    path = layout.write_checkpoint(tmp_path, 1, weights, run_id="r")
    swap = NetworkWeights(net)
    with pytest.raises(NetworkMismatch, match=words.replace("[", r"\[")):
        swap.load(path, layout.read_manifest(path))
    assert swap.valid and net(tokens).asnumpy().tobytes() == before.tobytes()


def test_a_corrupt_file_marks_the_network_invalid_until_a_good_load(tmp_path, tokens):
    net, reference = compiled(tokens), compiled(tokens, seed=4)
    a, b = variants(net)
    swap = NetworkWeights(net)
    bad = layout.write_checkpoint(tmp_path, 1, a, run_id="r", shard_bytes=20_000)
    manifest = layout.read_manifest(bad)
    target = bad / manifest.files[-1].name
    data = bytearray(target.read_bytes())
    data[-1] ^= 0x40
    target.write_bytes(bytes(data))
    with pytest.raises(layout.LayoutError, match=f"{target.name}: xxh3-128"):
        swap.load(bad, manifest)
    assert not swap.valid
    good = layout.write_checkpoint(tmp_path, 2, b, run_id="r", shard_bytes=20_000)
    swap.load(good, layout.read_manifest(good))
    assert swap.valid
    assert net(tokens).asnumpy().tobytes() == reference_output(reference, b, tokens).tobytes()


def test_assign_copies_into_live_memory_and_converts_the_rest(tokens):
    net, reference = compiled(tokens), compiled(tokens, seed=4)
    a = variants(net, 1)[0]
    given = dict(a, **{"head.bias": a["head.bias"].astype(np.float64)})
    swap = NetworkWeights(net)
    memory = net.head.weight.data_ptr()
    swap.assign(given)
    assert net.head.weight.data_ptr() == memory
    assert net(tokens).asnumpy().tobytes() == reference_output(reference, given, tokens).tobytes()
    with pytest.raises(NetworkMismatch, match="unexpected parameters"):
        swap.assign({"nope": np.zeros(1, np.float32)})
