"""Issue 36 item 5: a model's cached path is checked against its full forward at warm-up. A deliberately
wrong cached implementation (the demo model's ``extend``/``extend_all`` off by one position, as a real bug
would be) gives the full forward's numbers (a suite's log-likelihoods, greedy generation, serving's top k)
and one ERROR naming the method and the difference; a right one keeps its cached path and the log says a
decode step's time against a full forward's. Before, the wrong implementation's numbers were used, silently."""

from __future__ import annotations

import logging

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")
pytest.importorskip("lm_eval")

from evald.config.options import SuiteOptions  # noqa: E402
from evald.pipeline.engine import GenerateRequest, ScoreRequest, TokenScorer  # noqa: E402
from evald.pipeline.suites.runner import SuiteRunner  # noqa: E402
from evald.pipeline.suites.tokenizer import ByteTokenizer  # noqa: E402
from tests.networks import without_cached_decoding, wrongly_cached  # noqa: E402

NETWORK_SEED = 5       # the network fixture's (tests/unit/conftest.py)
BPB_DOCS_PER_SET = 1   # the include fixture's (conftest.py)
ENGINE = "evald.pipeline.engine"
ONE_BUCKET = (64,)     # the demo model's window: one bucket, fewer graphs to compile
FORK_BUCKETS = (32, 64)   # forks of 32-token pieces (the shortest bucket's): worth it after a long context


def _suite(include, network) -> SuiteRunner:
    return SuiteRunner("mc", SuiteOptions(tasks=("stdlib_next_line",), include_path=(include,), limit=8, seed=3,
                                          batch_size=4), network, ByteTokenizer())


def _errors(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR and r.name == ENGINE]


def test_a_suite_on_a_wrong_cached_implementation_gives_the_full_forwards_numbers(include, network, caplog):
    with caplog.at_level(logging.INFO, logger=ENGINE):
        wrong = _suite(include, wrongly_cached(network))
        result = wrong.run()
    full = _suite(include, without_cached_decoding(network)).run()      # the full forward only: the reference
    got, want = result.tasks["stdlib_next_line"].samples, full.tasks["stdlib_next_line"].samples
    assert [s["doc_id"] for s in got] == [s["doc_id"] for s in want]
    for mine, theirs in zip(got, want):
        for (ll, greedy), (ll_full, greedy_full) in zip(mine["resps"], theirs["resps"]):
            assert abs(ll - ll_full) <= 1e-6 * abs(ll_full) and greedy == greedy_full, (mine, theirs)
        assert mine["metrics"] == theirs["metrics"]
    [error] = _errors(caplog)
    assert "ShiftedCache.extend (cached decoding)" in error and "full forward" in error, error
    assert float(error.split(" apart")[0].split()[-1]) > 1e-5, error     # the difference, named
    assert not wrong.scorer.forks                                       # diverging choices: a row each


def _tokens(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(1, 256, n).tolist()


def test_generation_and_serving_on_a_wrong_cached_implementation_are_the_full_forwards(network, caplog):
    wrong, full = wrongly_cached(network), without_cached_decoding(network)
    requests = [GenerateRequest(_tokens(20 + i, 5 + 9 * i), 6 + 3 * i) for i in range(4)]
    with caplog.at_level(logging.INFO, logger=ENGINE):
        scorer = TokenScorer(wrong, batch_size=2, lengths=ONE_BUCKET)
        scorer.warm_up(forks=False)
    [error] = _errors(caplog)
    assert "ShiftedCache.extend" in error and scorer.decoding == "full-forward", error
    assert scorer.generate(requests) == TokenScorer(full, batch_size=2, lengths=ONE_BUCKET).generate(requests)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=ENGINE):   # serving's scorer: the top k with a cache
        serving = TokenScorer(wrong, batch_size=2, top_k=3, fork_contexts=False, lengths=ONE_BUCKET)
        serving.warm_up(generate=False, top_decoding=True)
    assert len(_errors(caplog)) == 1 and serving.decoding == "full-forward"
    with pytest.raises(ValueError, match="prefill_top needs a CachedDecoder"):
        serving.prefill_top([[1, 2, 3]], serving.lengths[0])
    request = ScoreRequest(_tokens(3, 20), _tokens(4, 5))
    reference = TokenScorer(full, batch_size=2, top_k=3, lengths=ONE_BUCKET).score([request])[0]
    np.testing.assert_allclose(serving.score([request])[0].top_logprobs, reference.top_logprobs, rtol=1e-6)


def test_wrong_forks_alone_turn_forks_off_and_keep_cached_decoding(network, caplog):
    wrong, full = wrongly_cached(network, forks_only=True), without_cached_decoding(network)
    with caplog.at_level(logging.INFO, logger=ENGINE):
        scorer = TokenScorer(wrong, batch_size=2, lengths=FORK_BUCKETS)
        scorer.warm_up(generate=False)
    [error] = _errors(caplog)
    assert "ShiftedCache.extend_all / cache_rows (context forks)" in error, error
    assert not scorer.forks and scorer.decoding == "cached"
    context = _tokens(7, 50)    # 4 diverging choices after 50 tokens: a fork of 32-token pieces runs fewer tokens
    requests = [ScoreRequest(context, _tokens(10 + c, 4)) for c in range(4)]
    reference = TokenScorer(full, batch_size=2, lengths=FORK_BUCKETS).score(requests)
    for got, want in zip(scorer.score(requests), reference):
        np.testing.assert_allclose(got.logprobs, want.logprobs, rtol=1e-6)


def test_a_right_cached_implementation_is_kept_and_its_decode_step_timed(network, caplog):
    with caplog.at_level(logging.INFO, logger=ENGINE):
        scorer = TokenScorer(network, batch_size=2, lengths=ONE_BUCKET)
        compiled = scorer.warm_up()
    assert not _errors(caplog) and scorer.decoding == "cached" and scorer.forks
    assert compiled == 4 * len(scorer.lengths)       # the check compiled no graph of its own
    [checked] = [r.getMessage() for r in caplog.records if "checked against its full forward" in r.getMessage()]
    assert "a decode step" in checked and "a full forward of the bucket" in checked, checked


def test_buckets_too_short_for_the_check_are_said_not_checked(network, caplog):
    with caplog.at_level(logging.INFO, logger=ENGINE):
        scorer = TokenScorer(wrongly_cached(network), max_length=8, batch_size=2)
        scorer.warm_up(forks=False)
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name == ENGINE]
    assert "ShiftedCache's cached path is not checked" in warning and "[8]" in warning, warning
    assert not _errors(caplog) and scorer.decoding == "cached"
