"""One dtype rule for every loader (evald.pipeline.swap.dtypes, issue 35): int8 weights for a float32
network are refused, naming the parameter and both dtypes, whichever layout brings them (an evald snapshot,
its parts, a foreign .ckpt or .safetensors, MindFormers' Checkpoint 2.0, a tensor-parallel rank's read);
a float checkpoint of another width still loads, and the provenance's swap check says it was converted.
Real networks and files, PyNative (nothing is compiled)."""

from __future__ import annotations

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")

from bench.reshard_read import llama_weights, write_tp  # noqa: E402
from evald.contracts import layout  # noqa: E402
from evald.contracts import safetensors_io as sio  # noqa: E402
from evald.contracts.partition import PartInfo, group_name  # noqa: E402
from evald.files.errors import CheckpointError  # noqa: E402
from evald.files.recognise import CHECKPOINT2, EVALD, FOREIGN, FOREIGN_WEIGHTS, PARTS  # noqa: E402
from evald.pipeline.swap import dtypes, swap_check  # noqa: E402
from evald.pipeline.swap.hot_swap import NetworkWeights  # noqa: E402
from evald.pipeline.swap.tp_load import read_rank  # noqa: E402
from evald.pipeline.swap.weights import load_into  # noqa: E402
from examples.tiny_lm import model  # noqa: E402
from tests.checkpoint2_layout import save as save_checkpoint2  # noqa: E402

SIZE = {"seq_len": 16, "d_model": 32}
REFUSED = r"head\.weight: int8 in the checkpoint, float32 in the network"


def _network():
    return model.build_model(**SIZE, seed=5)


def _weights(**changed_dtypes):
    bare = model.build_model(**SIZE)
    rng = np.random.default_rng(1)
    out = {n: (p.asnumpy() + 0.1 * rng.standard_normal(p.shape)).astype(np.float32)
           for n, p in bare.parameters_and_names()}
    for name, dtype in changed_dtypes.items():
        out[name.replace("__", ".")] = (out[name.replace("__", ".")] * 100).astype(dtype)
    return out


def _evald(tmp_path, weights):
    return layout.write_checkpoint(tmp_path, 10, weights, run_id="r"), EVALD


def _parts(tmp_path, weights):
    names = list(weights)
    for index in range(2):
        layout.write_checkpoint(tmp_path, 10, {n: weights[n] for n in names[index::2]}, run_id="r",
                                part=PartInfo(index, 2, (0, 1)))
    return tmp_path / group_name(10, 2), PARTS


def _ckpt(tmp_path, weights):
    path = tmp_path / "net-1_10.ckpt"
    ms.save_checkpoint([{"name": n, "data": ms.Tensor(a)} for n, a in weights.items()], str(path))
    return path, FOREIGN


def _safetensors(tmp_path, weights):
    path = tmp_path / "net-1_10.safetensors"
    sio.write_file(path, list(weights.items()), "sha256")
    return path, FOREIGN_WEIGHTS


def _checkpoint2(tmp_path, weights):
    return save_checkpoint2(tmp_path / "checkpoint", 10, 1, weights=weights), CHECKPOINT2


LAYOUTS = [_evald, _parts, _ckpt, _safetensors, _checkpoint2]


@pytest.mark.parametrize("write", LAYOUTS, ids=lambda f: f.__name__.strip("_"))
def test_int8_weights_for_a_float32_network_are_refused_naming_the_parameter_and_dtypes(tmp_path, write):
    path, kind = write(tmp_path, _weights(head__weight=np.int8))
    net = _network()
    before = dict(net.parameters_and_names())["head.weight"].asnumpy().copy()
    with pytest.raises(CheckpointError, match=REFUSED):
        load_into(NetworkWeights(net), path, kind)
    assert dict(net.parameters_and_names())["head.weight"].asnumpy().tobytes() == before.tobytes()  # untouched


def test_a_tensor_parallel_rank_refuses_int8_weights_for_its_float32_slice_before_reading(tmp_path):
    weights, cuts = llama_weights(hidden=16, layers=1, vocab=32)
    weights["head.weight"] = (weights["head.weight"] * 10).astype(np.int8)
    write_tp(tmp_path, 10, weights, cuts, 2)
    specs = {n: ((a.shape[0] // 2, *a.shape[1:]) if cuts[n] == 0 else (*a.shape[:-1], a.shape[-1] // 2)
                 if cuts[n] == 1 else a.shape, np.dtype(np.float32)) for n, a in weights.items()}
    with pytest.raises(CheckpointError, match=REFUSED):
        read_rank(tmp_path / group_name(10, 2), PARTS, specs, 2, 0)


@pytest.mark.parametrize("write", LAYOUTS, ids=lambda f: f.__name__.strip("_"))
def test_a_float16_checkpoint_still_loads_into_a_float32_network_and_the_provenance_says_so(tmp_path, write):
    weights = {n: a.astype(np.float16) for n, a in _weights().items()}
    path, kind = write(tmp_path, weights)
    net = _network()
    source = load_into(NetworkWeights(net), path, kind)
    params = dict(net.parameters_and_names())
    assert all(np.array_equal(params[n].asnumpy(), a.astype(np.float32)) for n, a in weights.items())
    if isinstance(source, layout.Manifest):
        done = swap_check.check(params, mode="sampled", step=10, step_dir=path, manifest=source)
    elif isinstance(source, swap_check.PartsRead):
        done = swap_check.check_parts(params, mode="sampled", step=10, parts=source)
    else:
        done = swap_check.check(params, mode="sampled", step=10, loaded=source)
    assert "30 parameters converted to the network's dtype (float16→float32 ×30)" in done.describe(), done


def test_a_narrowing_conversion_that_would_change_a_value_is_refused(tmp_path):
    weights = {n: a.astype(np.float64) for n, a in _weights().items()}
    weights["head.bias"][3] = 1e39                        # finite in float64, inf in float32
    path, kind = _evald(tmp_path, weights)
    with pytest.raises(CheckpointError, match=r"head\.bias: a finite float64 value of magnitude 1e\+39 overflows "
                                              r"float32"):
        load_into(NetworkWeights(_network()), path, kind)


def test_the_rule():
    assert dtypes.problem("bfloat16", "float32") is None and dtypes.problem("float32", "float16") is None
    assert dtypes.problem("int32", "int64") is None and dtypes.problem("int64", "int8") is None
    for stored, network in (("int8", "float32"), ("float32", "int32"), ("bool", "float32"), ("uint8", "int32"),
                            ("float32", "bool"), ("int32", "uint32")):
        assert dtypes.problem(stored, network) == f"{stored} in the checkpoint, {network} in the network"
    assert dtypes.value_problem("x", np.array([1, 300], np.int64), "int8") == "x: int64 values from 1 to 300 do not fit int8"
    assert dtypes.value_problem("x", np.array([1, -5], np.int64), "int8") is None


@pytest.mark.parametrize("network", ["Float32", "float32", np.float32, "BFloat16"])
def test_mindspore_dtype_names_are_numpy_names_to_the_rule(network):
    """A network's dtype given by MindSpore's name (``str(parameter.dtype)``: "Float32") is the same
    dtype as numpy's: float32 fits it, int8 does not (a name the rule did not know made every float32
    tensor "of another kind")."""
    assert dtypes.problem("float32", network) is None
    assert dtypes.problem("int8", network) == f"int8 in the checkpoint, {dtypes.name_of(network)} in the network"
