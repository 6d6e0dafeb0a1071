"""Issue 36 item 4: a network that splits its head (HeadSplit: ``hidden_states``, ``apply_head``, ``extend_hidden``)
runs the head, log_softmax and argmax only at the positions read, and its numbers are those of the full head:
every log-probability within 1e-6 relative, the same greedy flags and top k. The reads a forward gathers and the
fork piece are fitted to the rows a suite plans; a row with more reads than that runs again for the rest; a
network without the split runs its full forward as before."""

from __future__ import annotations

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")

from evald.pipeline.engine import ScoreRequest, TokenScorer  # noqa: E402
from evald.pipeline.tasks.generation import scores_with_cache, splits_head  # noqa: E402
from tests.networks import without_cached_decoding, without_head_split  # noqa: E402

NETWORK_SEED = 11   # the network fixture's (tests/unit/conftest.py)


def _tokens(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(1, 256, n).tolist()


def _requests() -> list[ScoreRequest]:
    """Single-token choices (one read position per row) and diverging 5-token choices (forks)."""
    requests = []
    for q in range(3):
        context = _tokens(q, 30 + 5 * q)
        requests += [ScoreRequest(context, [c]) for c in _tokens(40 + q, 4)]
    context = _tokens(7, 40)
    requests += [ScoreRequest(context, _tokens(50 + k, 5)) for k in range(4)]
    return requests


def _fitted(network, requests, top_k=0) -> TokenScorer:
    scorer = TokenScorer(network, batch_size=2, top_k=top_k)
    scorer.fit_lengths(scorer.plan_rows(requests))
    scorer.warm_up(generate=False)
    return scorer


def _assert_same(got, want) -> None:
    for a, b in zip(got, want):
        np.testing.assert_allclose(a.logprobs, b.logprobs, rtol=1e-6, atol=0)
        assert a.greedy.tolist() == b.greedy.tolist() and a.truncated == b.truncated
        if b.top_ids is not None:
            assert a.top_ids.tolist() == b.top_ids.tolist()
            np.testing.assert_allclose(a.top_logprobs, b.top_logprobs, rtol=1e-6, atol=0)


@pytest.mark.parametrize("top_k", [0, 3])
def test_the_head_at_the_reads_gives_the_full_heads_numbers(network, top_k):
    requests = _requests()
    split = _fitted(network, requests, top_k)
    whole = _fitted(without_head_split(network), requests, top_k)
    assert splits_head(network) and split.split_head and split._graphs.fork_cell.split
    assert scores_with_cache(whole.network) and not whole.split_head and not whole._graphs.fork_cell.split
    # fitted to the planned rows: the single-token rows' bucket gathers their 4 reads a row, not every position;
    # the forks' piece is their 5-token chunk, not FORK_CHUNK
    mc_bucket = split.bucket_for(45)
    assert split.read_width(mc_bucket) == 4 * split.rows_for(mc_bucket) < split.rows_for(mc_bucket) * mc_bucket
    assert split.fork_piece == 5 and whole.fork_piece > 5
    assert whole.read_widths == () and whole.read_width(mc_bucket) == whole.rows_for(mc_bucket) * mc_bucket
    _assert_same(split.score(requests), whole.score(requests))
    assert split.compiled_graphs == whole.compiled_graphs   # no graph compiled at a request


def test_a_row_with_more_reads_than_a_forward_gathers_runs_again_for_the_rest(network):
    planned = [ScoreRequest(_tokens(q, 30), [c]) for q in range(2) for c in _tokens(60 + q, 2)]
    split = _fitted(network, planned)
    whole = _fitted(without_head_split(network), planned)
    bucket = split.bucket_for(30)
    assert split.read_width(bucket) == 2 * split.rows_for(bucket)
    unplanned = [ScoreRequest([0], _tokens(9, bucket - 2)),    # a rolling window: every position read
                 ScoreRequest(_tokens(1, 20), _tokens(2, 3))]
    passes = split.stats.forward_passes
    _assert_same(split.score(unplanned), whole.score(unplanned))
    # the window's reads, then the 3 of the other row beside the window's last ones (in one forward if they fit)
    assert split.stats.forward_passes - passes == -(-(bucket - 2 + 3) // split.read_width(bucket))
    assert split.compiled_graphs == whole.compiled_graphs


def test_a_network_without_the_split_runs_its_full_forward(network):
    plain = without_cached_decoding(network)   # a forward only: no head split, no cache
    assert not splits_head(plain)
    requests = _requests()
    got = _fitted(plain, requests)
    assert not got.split_head and got.read_widths == ()
    _assert_same(got.score(requests), _fitted(without_head_split(network), requests).score(requests))
