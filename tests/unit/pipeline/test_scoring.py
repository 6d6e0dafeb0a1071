"""TokenScorer on the demo model: bucketed log-probabilities equal an independent MindSpore float32
computation, padding and batch composition change no bit, generation is greedy, nothing recompiles."""

from __future__ import annotations

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")

from evald.pipeline.suites.scoring import GenerateRequest, ScoreRequest, TokenScorer  # noqa: E402

NETWORK_SEED = 3   # the network fixture's (tests/unit/conftest.py)


@pytest.fixture(scope="module")
def scorer(network):
    s = TokenScorer(network, batch_size=4, top_k=3)
    s.warm_up()
    return s


def _tokens(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(1, 256, n).tolist()


def _reference(network, context: list[int], continuation: list[int]) -> np.ndarray:
    """Independent: PyNative, the exact unpadded sequence, batch of one, MindSpore float32 log_softmax."""
    whole = (context + continuation)[-65:]
    mode = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    try:
        logits = network(ms.Tensor(np.asarray([whole[:-1]], np.int32)))
        logp = ms.ops.log_softmax(logits.astype(ms.float32), -1).asnumpy()[0]
    finally:
        ms.set_context(mode=mode)
    targets = np.asarray(whole[1:])
    picked = logp[np.arange(len(targets)), targets]
    return picked[-len(continuation):]


def test_logprobs_equal_an_independent_float32_computation(network, scorer):
    requests = [ScoreRequest(_tokens(i, 5 + 7 * i), _tokens(100 + i, 1 + i)) for i in range(9)]
    requests.append(ScoreRequest(_tokens(50, 90), _tokens(51, 4)))  # longer than max_length: left-truncated
    scores = scorer.score(requests)
    assert scores[-1].truncated == 90 + 4 - 65
    for request, got in zip(requests, scores):
        want = _reference(network, list(request.context), list(request.continuation))
        assert got.logprobs.shape == want.shape
        np.testing.assert_allclose(got.logprobs, want, rtol=1e-6, atol=0)
        assert abs(got.total - float(np.sum(want, dtype=np.float64))) <= 1e-6 * abs(got.total)


def test_padding_and_batch_composition_change_no_bit(scorer):
    target = ScoreRequest(_tokens(1, 11), _tokens(2, 6))
    alone = scorer.score([target])[0]
    crowded = scorer.score([ScoreRequest(_tokens(9, 13), _tokens(8, 3)), ScoreRequest(_tokens(7, 2), [5]),
                            ScoreRequest(_tokens(6, 12), _tokens(5, 4)), target])[-1]
    assert alone.logprobs.tobytes() == crowded.logprobs.tobytes()
    assert alone.greedy.tolist() == crowded.greedy.tolist()
    assert alone.top_ids.tolist() == crowded.top_ids.tolist()


def test_greedy_flags_and_top_k_are_consistent(scorer):
    got = scorer.score([ScoreRequest(_tokens(3, 20), _tokens(4, 10))])[0]
    assert got.top_ids.shape == (10, 3) and got.top_logprobs.shape == (10, 3)
    assert np.all(np.diff(got.top_logprobs, axis=1) <= 0)
    cont = np.asarray(_tokens(4, 10))
    assert got.greedy.tolist() == (got.top_ids[:, 0] == cont).tolist()
    # the continuation made of each position's argmax is greedy everywhere
    context = _tokens(3, 20)
    best = []
    for _ in range(5):
        s = scorer.score([ScoreRequest(context + best, [0])])[0]
        best.append(int(s.top_ids[0, 0]))
    assert scorer.score([ScoreRequest(context, best)])[0].is_greedy


def test_generate_is_greedy_stops_and_never_recompiles(scorer):
    compiled = scorer.compiled_graphs
    assert scorer.decoding == "cached"
    assert compiled == 4 * len(scorer.lengths)  # score, prefill chunk, fork and decode step per bucket, at warm-up
    context = _tokens(12, 9)
    out = scorer.generate([GenerateRequest(context, 6)])[0]
    assert len(out) == 6
    for i, token in enumerate(out):  # each token is the argmax given the ones before
        s = scorer.score([ScoreRequest(context + out[:i], [token])])[0]
        assert s.is_greedy
    first_new = next((j for j in range(1, 6) if out[j] not in out[:j]), 0)  # EOS ends a row before it
    unused = next(t for t in range(256) if t not in out)
    stopped = scorer.generate([GenerateRequest(context, 6, stop=lambda ids: len(ids) >= 2),
                               GenerateRequest(context, 6)], eos_id=out[first_new])
    assert stopped == [out[:min(2, first_new)], out[:first_new]]
    assert scorer.generate([GenerateRequest(context, 6)], eos_id=unused) == [out]
    long = scorer.generate([GenerateRequest(_tokens(13, 200), 10)])[0]
    assert len(long) == 10
    assert scorer.compiled_graphs == compiled


def test_hot_swap_keeps_the_graphs(network, scorer):
    compiled = scorer.compiled_graphs
    before = scorer.score([ScoreRequest(_tokens(1, 11), _tokens(2, 6))])[0].logprobs
    params = {n: p for n, p in network.parameters_and_names()}
    old = params["head.bias"].asnumpy().copy()
    params["head.bias"].set_data(ms.Tensor(old + 1.0 * (np.arange(old.size) % 2)))
    try:
        after = scorer.score([ScoreRequest(_tokens(1, 11), _tokens(2, 6))])[0].logprobs
    finally:
        params["head.bias"].set_data(ms.Tensor(old))
    assert not np.array_equal(before, after)
    assert scorer.compiled_graphs == compiled


def test_bad_requests_are_refused_with_a_reason(scorer):
    with pytest.raises(ValueError, match="continuation of 70 tokens"):
        scorer.score([ScoreRequest([1], _tokens(1, 70))])
    with pytest.raises(ValueError, match="at least one token"):
        scorer.score([ScoreRequest([1], [])])
