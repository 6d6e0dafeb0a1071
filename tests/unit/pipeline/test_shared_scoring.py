"""Issue 28 on the demo model: requests that share a context run it once and score exactly as each pair
alone; cached greedy decoding gives the full-forward fallback's tokens; the fallback runs for a network
without the CachedDecoder interface; the graphs stay a fixed set, with none compiled on a hot swap."""

from __future__ import annotations

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")

from evald.pipeline.suites.scoring import (GenerateRequest, ScoreRequest, TokenScorer, auto_budget,  # noqa: E402
                                           length_ladder)
from tests.networks import without_cached_decoding  # noqa: E402
from evald.pipeline.tasks.generation import SampleGenerator, decodes_with_cache  # noqa: E402
from examples.tiny_lm.model import build_model  # noqa: E402

NETWORK_SEED = 5   # the network fixture's (tests/unit/conftest.py)


@pytest.fixture(scope="module")
def scorer(network):
    s = TokenScorer(network, batch_size=2)
    s.warm_up()
    return s


@pytest.fixture(scope="module")
def fallback(network):
    s = TokenScorer(without_cached_decoding(network), batch_size=2)
    s.warm_up()
    return s


def _tokens(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(1, 256, n).tolist()


def test_shared_contexts_score_as_each_pair_alone(scorer):
    requests = []
    for q in range(3):   # multiple choice: 4 single-token choices after each context
        context = _tokens(q, 20 + 9 * q)
        requests += [ScoreRequest(context, [c]) for c in _tokens(40 + q, 4)]
    context = _tokens(7, 15)   # multi-token continuations, one a prefix of another's row
    requests += [ScoreRequest(context, _tokens(8, 5)), ScoreRequest(context, _tokens(8, 3)),
                 ScoreRequest(context + _tokens(8, 2), _tokens(8, 5)[2:4]), ScoreRequest(_tokens(9, 70), [3, 4])]
    before = scorer.stats.real_tokens, scorer.stats.requested_tokens
    together = scorer.score(requests)
    real = scorer.stats.real_tokens - before[0]
    requested = scorer.stats.requested_tokens - before[1]
    assert real < requested / 2   # 4 rows for 12 choices; 1 row for 3 of the others
    for request, got in zip(requests, together):
        alone = scorer.score([request])[0]
        np.testing.assert_allclose(got.logprobs, alone.logprobs, rtol=1e-6, atol=0)
        assert abs(got.total - alone.total) <= 1e-6 * abs(alone.total)
        assert got.greedy.tolist() == alone.greedy.tolist() and got.truncated == alone.truncated


def test_cached_greedy_tokens_equal_the_full_forward_fallback(network, scorer, fallback):
    assert decodes_with_cache(network) and scorer.decoding == "cached"
    assert not decodes_with_cache(fallback.network) and fallback.decoding == "full-forward"
    requests = [GenerateRequest(_tokens(20 + i, 3 + 11 * i), 4 + 5 * i) for i in range(6)]
    requests.append(GenerateRequest(_tokens(30, 120), 12))   # left-truncated to fit the window
    cached = scorer.generate(requests)
    assert cached == fallback.generate(requests)
    assert [len(c) for c in cached] == [min(r.max_new_tokens, 63) for r in requests]
    eos = cached[3][2]
    stop = lambda ids: len(ids) >= 3  # noqa: E731
    asked = [GenerateRequest(r.context, r.max_new_tokens, stop) for r in requests[:4]]
    assert scorer.generate(asked, eos_id=eos) == fallback.generate(asked, eos_id=eos)


def test_sample_generator_cached_equals_full_forward(network):
    data = [np.asarray(_tokens(60 + i, 40)) for i in range(3)]
    results = []
    for net in (network, without_cached_decoding(network)):
        generator = SampleGenerator(prompts=3, prompt_len=16, new_tokens=12)
        generator.prepare(net, data, np.arange(3))
        assert (generator.extend is not None) == (net is network)
        results.append(generator.outputs())
    for mode in ("greedy", "sampled"):
        assert results[0][mode].tolist() == results[1][mode].tolist()


def test_graphs_are_a_fixed_set_and_a_hot_swap_compiles_none(network, scorer):
    compiled = scorer.compiled_graphs
    assert compiled == 4 * len(scorer.lengths)   # per bucket: scoring, a prefill chunk, a fork, a decode step
    lengths = {n for _, n in scorer.buckets}
    assert lengths == set(scorer.lengths)
    params = {n: p for n, p in network.parameters_and_names()}
    old = params["head.bias"].asnumpy().copy()
    request = ScoreRequest(_tokens(1, 30), _tokens(2, 3))
    before = scorer.score([request])[0].logprobs
    generated = scorer.generate([GenerateRequest(_tokens(1, 30), 8)])
    params["head.bias"].set_data(ms.Tensor(old + 1.0 * (np.arange(old.size) % 2)))
    try:
        for n in (2, 17, 33, 47, 63, 90):
            scorer.score([ScoreRequest(_tokens(n, n), [1, 2])])
            scorer.generate([GenerateRequest(_tokens(n, n), 5)])
            scorer.score([ScoreRequest(_tokens(n, n), _tokens(n + c, 2 + c)) for c in range(3)])   # forks
        assert not np.array_equal(before, scorer.score([request])[0].logprobs)
    finally:
        params["head.bias"].set_data(ms.Tensor(old))
    assert scorer.generate([GenerateRequest(_tokens(1, 30), 8)]) == generated
    assert scorer.compiled_graphs == compiled


def test_the_ladder_bounds_padding_and_auto_fits_memory():
    for top in (64, 1024, 2048, 4096):
        ladder = length_ladder(top)
        assert ladder[-1] == top and len(ladder) <= 10
        assert all(b / a <= 1.5 for a, b in zip(ladder, ladder[1:]))
    net = build_model(seq_len=64, seed=1)
    net.vocab_size = 256
    assert auto_budget(net, 64, available_bytes=10**6) == 122   # 0.25 MB / (2 x 256 x 4 bytes)
    assert auto_budget(net, 64, available_bytes=10**3) == 64          # never below one full row
    assert auto_budget(net, 64, available_bytes=10**12) == 64 * 64    # nor above 64 of them
    with pytest.raises(ValueError, match="vocabulary size"):
        auto_budget(build_model(seq_len=64, seed=1), 64)


def test_diverging_continuations_fork_one_prefilled_context(network, scorer):
    """Multi-token choices that share a context and diverge after it (no choice a prefix of another) run the
    context once: prefilled into a cache that each choice's row forks (CachedScorer); each scores as alone."""
    assert scorer.forks
    requests = []
    for q in range(3):       # a question: a 45-55 token context and 4 diverging 2-5 token choices
        context = _tokens(100 + q, 45 + 5 * q)
        requests += [ScoreRequest(context, _tokens(200 + 10 * q + c, 2 + c)) for c in range(4)]
    requests.append(ScoreRequest(_tokens(300, 30), _tokens(301, 3)))        # alone: a row of its own
    before = scorer.stats.real_tokens, scorer.stats.requested_tokens, scorer.compiled_graphs
    together = scorer.score(requests)
    real = scorer.stats.real_tokens - before[0]
    requested = scorer.stats.requested_tokens - before[1]
    shared = sum(45 + 5 * q - 1 for q in range(3))
    assert real <= requested - 3 * shared + 3 * 32   # each context ran once (and the chunks in pieces)
    assert scorer.compiled_graphs == before[2]       # forks run in graphs compiled at warm-up
    for request, got in zip(requests, together):
        alone = scorer.score([request])[0]           # one request: a full-forward row
        np.testing.assert_allclose(got.logprobs, alone.logprobs, rtol=1e-6, atol=0)
        assert got.greedy.tolist() == alone.greedy.tolist() and got.truncated == alone.truncated


def test_a_network_without_the_fork_interface_scores_each_row(network, fallback):
    assert not fallback.forks and fallback._fork_cell is None
    context = _tokens(100, 40)
    requests = [ScoreRequest(context, _tokens(200 + c, 2 + c)) for c in range(4)]
    before = fallback.stats.real_tokens
    fallback.score(requests)
    assert fallback.stats.real_tokens - before == sum(len(context) + 1 + c for c in range(4))


def test_forks_run_only_where_their_graphs_were_compiled(network):
    """A suite without multiple-choice tasks warms up without forks (forks=False): its scorer compiles no fork
    graph, and diverging choices sent to it anyway run as rows, compiling nothing at the request."""
    s = TokenScorer(network, batch_size=2)
    s.warm_up(generate=False, forks=False)
    compiled = s.compiled_graphs
    assert compiled == len(s.lengths)            # the scoring graphs alone
    context = _tokens(100, 50)
    requests = [ScoreRequest(context, _tokens(200 + c, 2 + c)) for c in range(4)]
    before = s.stats.real_tokens
    s.score(requests)
    assert s.stats.real_tokens - before == sum(len(context) + 1 + c for c in range(4))   # a row each
    assert s.compiled_graphs == compiled
