"""The hot-swap check compares what was loaded, under the names it was loaded by (issue 35).

A model factory that wraps its model (``net.`` in front of every network name) loads evald's checkpoints
through the name fit (evald.pipeline.swap.name_fit); the check must fit the names the same way, compare
every parameter, and never say "verified" for a check that compared fewer parameters than it should.
It opens the checkpoint's files as every reader does: a FIFO put in place of a weights file after the
load is refused at once, never waited on. Real networks and files, PyNative (nothing is compiled).
"""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")
from mindspore import nn  # noqa: E402

from evald.contracts import layout  # noqa: E402
from evald.contracts.partition import PartInfo, group_name  # noqa: E402
from evald.files.errors import CheckpointError  # noqa: E402
from evald.pipeline.swap import swap_check  # noqa: E402
from evald.pipeline.swap.hot_swap import NetworkWeights  # noqa: E402
from evald.pipeline.swap.weights import load_parts  # noqa: E402
from examples.tiny_lm import model  # noqa: E402

SIZE = {"seq_len": 16, "d_model": 32}
HANG_S = 20


class Logits(nn.Cell):
    """The obvious model factory for a model that returns a tuple: wrap it (every name gains ``net.``)."""

    def __init__(self, net):
        super().__init__()
        self.net = net

    def construct(self, tokens):
        return self.net(tokens)


def _saved(seed=1):
    bare = model.build_model(**SIZE)
    rng = np.random.default_rng(seed)
    return {n: (p.asnumpy() + 0.1 * rng.standard_normal(p.shape)).astype(np.float32)
            for n, p in bare.parameters_and_names()}


@pytest.fixture
def wrapped_snapshot(tmp_path):
    """A snapshot of the bare model's names (what EvaldHook on the bare model writes) loaded into a wrapped
    network: the network's parameters, the step directory and its manifest."""
    saved = _saved()
    step_dir = layout.write_checkpoint(tmp_path, 10, saved, run_id="r", shard_bytes=20_000)
    manifest = layout.read_manifest(step_dir)
    net = Logits(model.build_model(**SIZE, seed=5))
    NetworkWeights(net).load(step_dir, manifest, strict=True)
    return dict(net.parameters_and_names()), step_dir, manifest


@pytest.mark.parametrize("mode", ["sampled", "full"])
def test_the_check_of_a_wrapped_network_compares_every_parameter(wrapped_snapshot, mode):
    params, step_dir, manifest = wrapped_snapshot
    assert all(name.startswith("net.") for name in params) and len(manifest.params) == len(params) == 30
    done = swap_check.check(params, mode=mode, step=10, step_dir=step_dir, manifest=manifest)
    assert done.parameters == 30 and not done.unchecked, done
    assert done.describe().startswith(f"verified ({mode}): 30 parameters")


def test_the_check_of_a_wrapped_network_catches_a_parameter_that_is_not_the_checkpoints(wrapped_snapshot):
    params, step_dir, manifest = wrapped_snapshot
    params["net.head.weight"].asnumpy()[0, 0] += 1.0    # something wrote into it after the read
    with pytest.raises(swap_check.SwapMismatch, match="net.head.weight"):
        swap_check.check(params, mode="sampled", step=10, step_dir=step_dir, manifest=manifest)


def test_a_check_that_cannot_compare_a_loaded_parameter_is_an_error_not_verified(wrapped_snapshot):
    params, step_dir, manifest = wrapped_snapshot
    del params["net.head.bias"]                         # the check would compare 29 of 30
    with pytest.raises(swap_check.SwapMismatch, match="head.bias"):
        swap_check.check(params, mode="sampled", step=10, step_dir=step_dir, manifest=manifest)


@pytest.mark.parametrize("mode", ["sampled", "full"])
def test_the_check_of_a_partitioned_step_in_a_wrapped_network_compares_every_parameter(tmp_path, mode):
    saved = _saved()
    names = list(saved)
    for index in range(2):   # two parts, each whole parameters (a replicated layout shared out)
        layout.write_checkpoint(tmp_path, 10, {n: saved[n] for n in names[index::2]}, run_id="r",
                                part=PartInfo(index, 2, (0, 1)))
    net = Logits(model.build_model(**SIZE, seed=5))
    read = load_parts(NetworkWeights(net), tmp_path, group_name(10, 2))
    done = swap_check.check_parts(dict(net.parameters_and_names()), mode=mode, step=10, parts=read)
    assert done.parameters == 30 and not done.unchecked, done
    assert done.describe().startswith(f"verified ({mode}): 30 parameters")


@pytest.mark.parametrize("mode", ["sampled", "full"])
def test_a_fifo_put_in_place_of_a_weights_file_after_the_load_is_refused_at_once(wrapped_snapshot, mode):
    params, step_dir, manifest = wrapped_snapshot
    victim = step_dir / manifest.files[0].name
    victim.unlink()
    os.mkfifo(victim)
    outcome: list = []

    def run():
        try:
            swap_check.check(params, mode=mode, step=10, step_dir=step_dir, manifest=manifest)
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - judged below
            outcome.append(exc)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(HANG_S)
    if thread.is_alive():
        os.close(os.open(victim, os.O_WRONLY | os.O_NONBLOCK))   # let the stuck reader go
        thread.join(HANG_S)
        pytest.fail(f"the swap check still waits on the FIFO after {HANG_S}s")
    assert isinstance(outcome[0], CheckpointError) and "is a FIFO, not a regular file" in str(outcome[0])
