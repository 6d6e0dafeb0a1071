"""Suites through lm-eval on the demo model, in-process: the adapter's numbers against an independent
MindSpore float32 computation, lm-eval's aggregates against the per-sample output, the identity, and
the per-sample files."""

from __future__ import annotations

import math

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")
pytest.importorskip("lm_eval")

from evald.config.options import SuiteOptions  # noqa: E402
from evald.ledger.samples import read_step, write_samples  # noqa: E402
from evald.pipeline.suites.runner import SuiteRunner  # noqa: E402
from evald.pipeline.suites.scoring import TokenScorer  # noqa: E402
from evald.pipeline.suites.tokenizer import ByteTokenizer  # noqa: E402

NETWORK_SEED = 5       # the network fixture's (tests/unit/conftest.py)
BPB_DOCS_PER_SET = 2   # the include fixture's (conftest.py)


@pytest.fixture(scope="module")
def mc(include, network):
    runner = SuiteRunner("mc", SuiteOptions(tasks=("stdlib_next_line",), include_path=(include,), limit=24,
                                            seed=3, batch_size=4), network, ByteTokenizer())
    return runner, runner.run()


def _reference_loglikelihood(network, context: str, continuation: str) -> float:
    """lm-eval's conventions, by hand: trailing whitespace of the context moves to the continuation,
    the whole is left-truncated to max_length + 1; PyNative, batch of one, MindSpore float32."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    ctx, cont = list(context.encode()), list(continuation.encode())
    whole = (ctx + cont)[-65:]
    mode = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    try:
        logp = ms.ops.log_softmax(network(ms.Tensor(np.asarray([whole[:-1]], np.int32))), -1).asnumpy()[0]
    finally:
        ms.set_context(mode=mode)
    targets = np.asarray(whole[1:])
    return float(np.sum(logp[np.arange(len(targets)), targets][-len(cont):], dtype=np.float64))


def test_loglikelihoods_equal_an_independent_float32_computation(network, mc):
    runner, result = mc
    docs = {i: d for i, d in enumerate(runner.task_manager.load(["stdlib_next_line"])["tasks"]
                                       ["stdlib_next_line"].eval_docs)}
    task = result.tasks["stdlib_next_line"]
    assert [s["doc_id"] for s in task.samples] == runner.documents["stdlib_next_line"]
    for sample in task.samples:  # acc_norm: log-likelihood per character of the choice (lm-eval's rule)
        doc = docs[sample["doc_id"]]
        per_char = [ll / len(choice) for choice, (ll, _) in zip(doc["choices"], sample["resps"])]
        assert sample["metrics"]["acc_norm"] == float(int(np.argmax(per_char)) == doc["gold"])
    for sample in task.samples[:8]:
        doc = docs[sample["doc_id"]]
        for choice, (ll, _greedy) in zip(doc["choices"], sample["resps"]):
            want = _reference_loglikelihood(network, doc["context"], choice)
            assert abs(ll - want) <= 1e-6 * abs(want), (ll, want)


def test_forked_contexts_give_the_numbers_of_a_row_per_choice(include, network, mc):
    """Issue 28: the demo's multiple-choice suite, whose choices are diverging lines of text, forks each
    question's prefilled context; each sample's log-likelihoods equal those of the engine without forks (a
    full-forward row per choice, as before forks existed) within rel 1e-6, with identical greedy flags and
    metrics, and the forks ran fewer tokens."""
    runner, result = mc
    assert runner.scorer.forks
    rows = TokenScorer(network, batch_size=4, fork_contexts=False)
    plain = SuiteRunner("mc", SuiteOptions(tasks=("stdlib_next_line",), include_path=(include,), limit=24,
                                           seed=3, batch_size=4), network, ByteTokenizer(), scorer=rows).run()
    forked_samples = result.tasks["stdlib_next_line"].samples
    plain_samples = plain.tasks["stdlib_next_line"].samples
    assert [s["doc_id"] for s in forked_samples] == [s["doc_id"] for s in plain_samples]
    for forked, alone in zip(forked_samples, plain_samples):
        assert [g for _, g in forked["resps"]] == [g for _, g in alone["resps"]]
        for (a, _), (b, _) in zip(forked["resps"], alone["resps"]):
            assert abs(a - b) <= 1e-6 * abs(b), (a, b)
        assert forked["metrics"] == alone["metrics"]
    assert result.tokens < plain.tokens


def test_aggregates_equal_those_recomputed_from_the_samples(mc):
    _, result = mc
    task = result.tasks["stdlib_next_line"]
    for metric in ("acc", "acc_norm"):
        values = [s["metrics"][metric] for s in task.samples]
        assert task.metrics[metric] == pytest.approx(np.mean(values), abs=1e-12)
        assert task.metrics[f"{metric}_stderr"] == pytest.approx(np.std(values, ddof=1) / math.sqrt(len(values)),
                                                                 rel=1e-9)
    # acc from the responses themselves: the argmax log-likelihood is the gold choice
    for s in task.samples:
        best = int(np.argmax([ll for ll, _ in s["resps"]]))
        assert s["metrics"]["acc"] == float(best == int(s["target"]))
    assert result.scalars()["mc/stdlib_next_line/acc"] == task.metrics["acc"]


def test_the_subset_is_seeded_fixed_and_in_the_identity(include, network, mc):
    runner, result = mc
    again = SuiteRunner("mc", SuiteOptions(tasks=("stdlib_next_line",), include_path=(include,), limit=24, seed=3,
                                           batch_size=4), network, ByteTokenizer(), scorer=runner.scorer)
    assert again.documents == runner.documents and again.identity_sha256 == runner.identity_sha256
    assert len(runner.documents["stdlib_next_line"]) == 24 and runner.documents["stdlib_next_line"] != list(range(24))
    other_seed = SuiteRunner("mc", SuiteOptions(tasks=("stdlib_next_line",), include_path=(include,), limit=24,
                                                seed=4, batch_size=4), network, ByteTokenizer(), scorer=runner.scorer)
    other_tok = SuiteRunner("mc", SuiteOptions(tasks=("stdlib_next_line",), include_path=(include,), limit=24,
                                               seed=3, batch_size=4), network, ByteTokenizer(eos_id=10),
                            scorer=runner.scorer)
    assert len({runner.identity_sha256, other_seed.identity_sha256, other_tok.identity_sha256}) == 3
    assert runner.identity["subset"] == {"seed": 3, "size": 24} and runner.identity["lm_eval"] == "0.4.13"
    assert result.compiled_graphs == runner.scorer.compiled_graphs <= 4 * len(runner.scorer.lengths)


def test_bits_per_byte_over_many_held_out_sets(include, network, tmp_path):
    runner = SuiteRunner("bpb", SuiteOptions(tasks=("stdlib_bpb",), include_path=(include,), batch_size=8), network,
                         ByteTokenizer())
    result = runner.run()
    assert len(result.tasks) >= 10
    assert runner.scorer.forks and not runner.scorer._fork_ready   # rolling windows never fork: no fork graph
    assert runner.scorer.cached and result.compiled_graphs == len(runner.scorer.lengths)  # nor generate: scoring only
    for task in result.tasks.values():
        lls = [s["metrics"]["bits_per_byte"] for s in task.samples]   # per document: (loglikelihood, bytes)
        recomputed = -sum(ll for ll, _ in lls) / sum(n for _, n in lls) / math.log(2)
        assert task.metrics["bits_per_byte"] == pytest.approx(recomputed, rel=1e-12)
        assert 0 < task.metrics["bits_per_byte"] < 16


def test_per_sample_files_round_trip(mc, tmp_path):
    runner, result = mc
    task = result.tasks["stdlib_next_line"]
    path = write_samples(tmp_path, suite="mc", task="stdlib_next_line", step=40, identity=result.identity,
                         identity_sha256=result.identity_sha256, cell_identity=runner.cell_identity,
                         metrics=task.metrics, samples=task.samples)
    assert path.name == f"step_40.{result.identity_sha256[:12]}.jsonl.gz"
    head, samples = read_step(tmp_path, "mc", "stdlib_next_line", 40)
    assert samples == sorted(task.samples, key=lambda s: s["doc_id"])
    assert head.identity == result.identity and head.metrics == task.metrics
    # lm-eval's own per-sample hashes ride along, for `evald export` (its samples_*.jsonl)
    assert set(samples[0]) == {"doc_id", "target", "resps", "metrics", "doc_hash", "prompt_hash", "target_hash"}
    first = path.read_bytes()
    write_samples(tmp_path, suite="mc", task="stdlib_next_line", step=40, identity=result.identity,
                  identity_sha256=result.identity_sha256, cell_identity=runner.cell_identity,
                  metrics=task.metrics, samples=task.samples)
    assert path.read_bytes() == first  # deterministic: a re-evaluation after a crash writes the same bytes


def test_generate_until_is_greedy_stops_at_until_and_scores_exact_match(network, tmp_path):
    import json as _json

    from evald.pipeline.suites.scoring import GenerateRequest

    data = tmp_path / "gen.jsonl"
    docs = [{"prompt": f"def f{i}(x):\n    return", "answer": " x"} for i in range(6)]
    data.write_text("".join(_json.dumps(d) + "\n" for d in docs))
    (tmp_path / "gen.yaml").write_text(
        f"task: tiny_gen\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {_json.dumps(str(data))}\n"
        "test_split: test\noutput_type: generate_until\ndoc_to_text: \"{{prompt}}\"\ndoc_to_target: \"{{answer}}\"\n"
        "generation_kwargs:\n  until: [\"\\n\"]\n  max_gen_toks: 12\n  do_sample: false\n"
        "metric_list:\n  - metric: exact_match\n    aggregation: mean\n    higher_is_better: true\n"
        "metadata:\n  version: 1.0\n")
    runner = SuiteRunner("gen", SuiteOptions(tasks=("tiny_gen",), include_path=(str(tmp_path),), batch_size=4),
                         network, ByteTokenizer())
    result = runner.run()
    task = result.tasks["tiny_gen"]
    for sample in task.samples:
        doc = docs[sample["doc_id"]]
        ids = runner.scorer.generate([GenerateRequest(list(doc["prompt"].encode()), 12)], eos_id=0)[0]
        want = ByteTokenizer().decode(ids).split("\n")[0]
        assert sample["resps"] == [want]
        assert sample["metrics"]["exact_match"] == float(want == doc["answer"])
    assert task.metrics["exact_match"] == pytest.approx(np.mean([s["metrics"]["exact_match"] for s in task.samples]))
    assert result.compiled_graphs == runner.scorer.compiled_graphs  # generation compiled nothing new


def test_one_identity_string_for_a_suite_whatever_the_network(include, network, mc, tmp_path):
    """Issue 26 item 4 (seen): status showed the cell's hash, compare, the log and the file names the
    suite's. The cell identity now begins with the suite identity, so the 12 characters every place
    shows are one string, while another model still makes other cells."""
    runner, result = mc
    made = [SuiteRunner("mc", SuiteOptions(tasks=("stdlib_next_line",), include_path=(include,), limit=24, seed=3,
                                           batch_size=4), network, ByteTokenizer(), scorer=runner.scorer,
                        network_identity={"model": model}) for model in ("a:build", "b:build")]
    assert made[0].cell_identity != made[1].cell_identity
    shown = {r.cell_identity[:12] for r in made} | {runner.cell_identity[:12], result.identity_sha256[:12]}
    data = write_samples(tmp_path, suite="mc", task="stdlib_next_line", step=7, identity=result.identity,
                         identity_sha256=result.identity_sha256, cell_identity=made[0].cell_identity,
                         metrics={}, samples=[])
    assert shown == {data.name.split(".")[1]}
