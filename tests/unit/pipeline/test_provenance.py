"""Provenance and proof of the hot swap, with the real Evaluator (MindSpore, Graph mode, real files).

* Hot-swapped evaluation equals a cold build-and-load (a fresh network, the checkpoint loaded with
  MindSpore's own ``load_param_into_net``) bit for bit, over swaps A, B, A, B, A and a foreign file.
* The swap check catches a swap that left a parameter behind, and a parameter whose live memory
  is not the checkpoint's, in both modes; with the check off the same fault goes unnoticed.
* Each evaluation's provenance names its weights (the same digest for the same checkpoint), the
  subset and the config; a config change between two points is said in TensorBoard.
"""

from __future__ import annotations

import dataclasses
import queue
from contextlib import contextmanager
from typing import Iterator

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")

from evald.pipeline.swap import provenance# noqa: E402
from evald.contracts import layout  # noqa: E402
from evald.contracts.wire import FactorySpec  # noqa: E402
from evald.pipeline.network import EvalResult, Evaluator  # noqa: E402
from evald.pipeline.swap.swap_check import SwapMismatch  # noqa: E402

MODEL = FactorySpec("examples.tiny_lm.model:build_model", {"seq_len": 16, "d_model": 32})
DATA = FactorySpec("examples.tiny_lm.data:validation_windows", {"seq_len": 16})
SPECS = ("lm", MODEL, DATA, 24, 3, 8, None, ())


pytestmark = pytest.mark.usefixtures("graph_mode")  # tests/unit/conftest.py


def evaluator(verify="sampled") -> Evaluator:
    return Evaluator(task="lm", model=MODEL, data=DATA, subset_size=24, subset_seed=3, batch_size=8,
                     verify_swap=verify, config_identity=provenance.EvaluationSpec(*SPECS).identity())


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Two trained-looking checkpoints A and B (the random init, moved two different ways), and B again
    as MindSpore's own .ckpt file."""
    ckpt = tmp_path_factory.mktemp("ckpt")
    from examples.tiny_lm import model

    base = {n: p.asnumpy().copy() for n, p in model.build_model(seq_len=16, d_model=32).parameters_and_names()}
    rng = np.random.default_rng(0)
    a, b = ({n: (w + 0.05 * rng.standard_normal(w.shape)).astype(np.float32) for n, w in base.items()}
            for _ in range(2))
    paths = {"A": layout.write_checkpoint(ckpt, 10, a, run_id="r", shard_bytes=40_000),
             "B": layout.write_checkpoint(ckpt, 20, b, run_id="r")}
    foreign = ckpt / "tiny-1_30.ckpt"
    ms.save_checkpoint([{"name": f"model.{n}", "data": ms.Tensor(w)} for n, w in b.items()], str(foreign))
    paths["B.ckpt"] = foreign
    return paths, {"A": a, "B": b, "B.ckpt": b}


def cold_metrics(weights: dict[str, np.ndarray]) -> dict[str, float]:
    """The established path: a freshly built and compiled network, load_param_into_net, its lists checked."""
    fresh = evaluator(verify="off")
    params = {p.name: ms.Parameter(ms.Tensor(weights[n].copy()), name=p.name)
              for n, p in fresh.network.parameters_and_names()}
    assert ms.load_param_into_net(fresh.network, params, strict_load=True) == ([], [])
    return fresh.task.evaluate(fresh.cell, fresh.batches)


def test_hot_swapped_evaluation_equals_a_cold_build_and_load_over_swaps_back_and_forth(checkpoints):
    paths, weights = checkpoints
    hot = evaluator()
    cold = {name: cold_metrics(weights[name]) for name in ("A", "B")}
    assert cold["A"]["eval/loss"] != cold["B"]["eval/loss"]
    digests = {}
    for name in ("A", "B", "A", "B.ckpt", "A", "B"):
        kind = "foreign" if name.endswith(".ckpt") else "evald"
        result = hot.evaluate(paths[name], kind)
        assert result.metrics == cold[name.removesuffix(".ckpt")], name   # bit for bit, every metric and SE
        assert result.provenance["swap_check"].startswith("verified (sampled)"), result.provenance
        digests.setdefault(name, set()).add(result.provenance["weights_sha256"])
    assert all(len(d) == 1 for d in digests.values()) and len({next(iter(d)) for d in digests.values()}) == 3
    assert result.provenance["subset_sha256"] == hot.subset.sha256
    assert provenance.sha256_of(result.provenance["config"]) == provenance.sha256_of(provenance.EvaluationSpec(*SPECS).identity())


@pytest.mark.parametrize("mode", ["sampled", "full"])
def test_the_swap_check_catches_a_parameter_left_behind(checkpoints, monkeypatch, mode):
    paths, _ = checkpoints
    hot = evaluator(mode)
    hot.evaluate(paths["A"], "evald")
    from evald.pipeline.swap import hot_swap

    real = hot_swap.layout.read_checkpoint

    def forgets_one(step_dir, manifest, *, into=None, threads=None):  # a swap bug: head.bias is never written
        arrays = real(step_dir, manifest, into={n: a for n, a in (into or {}).items() if n != "head.bias"},
                      threads=threads)
        return {n: a for n, a in arrays.items() if n != "head.bias"}

    monkeypatch.setattr(hot_swap.layout, "read_checkpoint", forgets_one)
    with pytest.raises(SwapMismatch, match="head.bias" if mode == "sampled" else "does not hash"):
        hot.evaluate(paths["B"], "evald")
    assert not hot.weights.valid      # nothing is evaluated on that network until a good swap
    off = evaluator("off")
    off.evaluate(paths["A"], "evald")
    assert off.evaluate(paths["B"], "evald").provenance["swap_check"].startswith("not checked")  # unnoticed


@pytest.mark.parametrize("mode", ["sampled", "full"])
def test_the_swap_check_names_a_parameter_whose_memory_is_not_the_checkpoints(checkpoints, monkeypatch, mode):
    from evald.pipeline import network as evaluator_module

    paths, weights = checkpoints
    hot = evaluator(mode)
    real = evaluator_module.load_into

    def then_corrupted(target, path, kind):  # something writes into a parameter after the read
        source = real(target, path, kind)
        view = dict(hot.network.parameters_and_names())["blocks.0.ln1.gamma"].asnumpy()
        view[0] += 1.0
        return source

    monkeypatch.setattr(evaluator_module, "load_into", then_corrupted)
    with pytest.raises(SwapMismatch, match="blocks.0.ln1.gamma" if mode == "sampled" else "does not hash"):
        hot.evaluate(paths["A"], "evald")


@contextmanager
def run_evaluating(tmp_path, configs: dict[int, dict]) -> Iterator:
    """A daemon Run over steps 10, 20 and 30 (checkpoints in ``tmp_path/ckpt``, its run directory ``tmp_path/run``)
    with a stand-in pipeline whose evaluations report their findings as the evaluator does, ``configs[step]`` as
    a step's config; started, each step evaluated, then yielded; closed on leaving."""
    from evald.config import EvaldConfig, ResolvedConfig
    from evald.daemon.run import Run
    from evald.pipeline.pipeline import Evaluated
    from evald.pipeline.subset import SubsetInfo

    ckpt = tmp_path / "ckpt"
    for step in (10, 20, 30):
        layout.write_checkpoint(ckpt, step, {"w": np.full(4, step, np.float32)}, run_id="r")

    class Pipeline:
        subset = SubsetInfo.of([0, 1], num_samples=2, requested=2, seed=0)
        blocked_reason = None
        validation_identity = None      # no identity: no results are superseded here
        suites: dict = {}
        suite_errors: dict = {}
        suites_pending: tuple = ()

        def ensure_built(self, config):
            return True

        def build_next_suite(self):
            return False

        def evaluate(self, ckpt_dir, row):
            found = {"weights_sha256": f"w{row.step}", "weights_digest_of": "test", "subset_sha256": "s",
                     "config": configs[row.step], "swap_check": "verified (sampled)"}
            return Evaluated(EvalResult({"eval/loss": 1.0}, {}, 0.0, 0.0, 0.0, found))

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    config = dataclasses.replace(EvaldConfig(), lag_policy="all")
    run = Run(ResolvedConfig(config, {}), ckpt, run_dir, control=None, receiver=None, events=queue.Queue(),
              pipeline=Pipeline())
    try:
        run.start()
        while run.work():
            pass
        yield run
    finally:
        run.close()


def test_provenance_is_in_the_ledger_and_tensorboard_and_a_config_change_is_said(tmp_path):
    from evald.ledger.ledger import Ledger
    from tests.harness import text_events

    run_dir = tmp_path / "run"
    configs = {10: {"subset_size": 24}, 20: {"subset_size": 24}, 30: {"subset_size": 48}}  # it changes at step 30
    with run_evaluating(tmp_path, configs):
        pass
    ledger = Ledger(run_dir / "ledger.sqlite")
    stored = ledger.provenance(20)
    ledger.close()
    assert stored["weights_sha256"] == "w20" and stored["step"] == 20 and stored["run_id"] == "r"
    assert stored["config_sha256"] == provenance.sha256_of({"subset_size": 24})
    shown = dict(text_events(run_dir, "evald/provenance/text_summary"))
    assert sorted(shown) == [10, 20, 30] and "`w30`" in shown[30] and "**config**" in shown[30]
    [(step, said)] = text_events(run_dir, "evald/comparability/text_summary")
    assert step == 30 and said.startswith("not comparable with step 20: the evaluation config (subset_size")


def test_a_re_evaluated_older_step_is_compared_with_its_neighbour_and_leaves_the_newest_as_reference(tmp_path):
    """Issue 26 item 9: after a re-evaluation (evald retry --step) the comparability check compared the
    old step with the newest one, and then the next new step with the re-evaluated old one: two
    "not comparable" warnings for points that compare well with their neighbours."""
    from evald.ledger.ledger import Ledger
    from evald.ledger.requeue import retry
    from tests.harness import text_events

    run_dir = tmp_path / "run"
    configs = {10: {"subset_size": 24}, 20: {"subset_size": 24}, 30: {"subset_size": 48}, 40: {"subset_size": 48}}
    with run_evaluating(tmp_path, configs) as run:   # the config changes at step 30; step 10 is then evaluated again
        ledger = Ledger(run_dir / "ledger.sqlite")
        retry(ledger, [10], "again", evaluated_too=True)
        ledger.close()
        while run.work():
            pass
        layout.write_checkpoint(tmp_path / "ckpt", 40, {"w": np.full(4, 40, np.float32)}, run_id="r")
        run.tick()
        run.intake.found(layout.step_dir_name(40), "rescan")
        while run.work():
            pass
    said = text_events(run_dir, "evald/comparability/text_summary")
    assert [step for step, _ in said] == [30], said    # only where the config really changed
