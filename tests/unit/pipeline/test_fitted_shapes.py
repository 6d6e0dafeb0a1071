"""Issue 36 item 4: shapes fitted to what a suite's dry run plans. A bucket runs no more rows than the suite has
for it, and generation decodes into a cache of the positions its requests need (a decode step moves the whole
cache), not the bucket's length; the numbers and the greedy tokens are those of the unfitted shapes, a request the
dry run did not plan included; an eval group's other ranks are given the same shapes."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")

from evald.pipeline.engine import GenerateRequest, ScoreRequest, TokenScorer  # noqa: E402

NETWORK_SEED = 13   # the network fixture's (tests/unit/conftest.py)


def _tokens(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(1, 256, n).tolist()


def test_a_bucket_runs_the_rows_the_suite_has_for_it(network):
    requests = [ScoreRequest(_tokens(q, 40), [c]) for q in range(3) for c in _tokens(20 + q, 4)]
    fitted = TokenScorer(network, batch_size=8)
    fitted.fit_lengths(fitted.plan_rows(requests))
    fitted.warm_up(generate=False, forks=False)
    unfitted = TokenScorer(network, batch_size=8, lengths=fitted.lengths)
    unfitted.warm_up(generate=False, forks=False)
    # 3 questions: 3 rows, not 10, in a 48 bucket; the window's 64 bucket holds none, so is not compiled
    assert fitted.buckets == ((3, 48), (8, 64)) and unfitted.buckets == ((10, 48), (8, 64))
    assert fitted.row_caps == ((48, 3), (64, 0)) and all(shape[2] != 64 for shape in fitted._shapes)   # (score, rows, length, reads)
    before = fitted.stats.padded_tokens, unfitted.stats.padded_tokens
    for a, b in zip(fitted.score(requests), unfitted.score(requests)):
        np.testing.assert_allclose(a.logprobs, b.logprobs, rtol=1e-6, atol=0)
        assert a.greedy.tolist() == b.greedy.tolist()
    assert fitted.stats.padded_tokens - before[0] == 3 * 48 < unfitted.stats.padded_tokens - before[1]


def test_generation_decodes_into_the_cache_its_requests_need(network):
    planned = [GenerateRequest(_tokens(k, 10 + k), 12) for k in range(2)]
    fitted = TokenScorer(network, batch_size=2)
    # a longer scored row beside them: one bucket of 64 (a second would not save a forward)
    fitted.fit_lengths(fitted.plan_generate(planned) + fitted.plan_rows([ScoreRequest(_tokens(3, 50), _tokens(4, 10))]))
    fitted.warm_up(forks=False)
    unfitted = TokenScorer(network, batch_size=2, lengths=fitted.lengths)
    unfitted.warm_up(forks=False)
    n = fitted.lengths[-1]
    assert fitted.lengths == (64,) and fitted.cache_caps == ((n, 32),) and unfitted.cache_caps == ()
    assert any(shape[0] == "extend" and shape[-2] == 32 for shape in fitted._shapes)   # (.., capacity, d_head)
    compiled = fitted.compiled_graphs
    assert fitted.generate(planned) == unfitted.generate(planned)
    assert fitted.compiled_graphs == compiled   # the fitted cache's graphs were compiled at start
    longer = [GenerateRequest(_tokens(9, 30), 20)]   # not planned: 50 positions, more than the fitted 32
    assert fitted.generate(longer) == unfitted.generate(longer) and len(fitted.generate(longer)[0]) == 20


def test_an_eval_rank_builds_the_fitted_shapes_of_rank_0(network):
    from evald.pipeline.group.evaluator import _scorer_for
    from evald.pipeline.group.scoring import scorer_settings

    rank_0 = TokenScorer(network, batch_size=8)
    rank_0.fit_lengths(rank_0.plan_rows([ScoreRequest(_tokens(q, 40), [1, 2]) for q in range(3)])
                       + rank_0.plan_generate([GenerateRequest(_tokens(5, 10), 12)]))
    other = _scorer_for({}, SimpleNamespace(network=network), scorer_settings(rank_0))
    assert rank_0.row_caps and rank_0.read_widths
    assert ((other.buckets, other.row_caps, other.cache_caps, other.read_widths, other.fork_piece)
            == (rank_0.buckets, rank_0.row_caps, rank_0.cache_caps, rank_0.read_widths, rank_0.fork_piece))


def test_the_cached_paths_check_runs_in_the_fitted_shapes(network, monkeypatch, caplog):
    """The warm-up check (cache_check) reads the full forward through the fitted read width and decodes in the
    fitted cache: it compiles no graph of its own, and it did run."""
    import logging

    from evald.pipeline.engine import cache_check

    shapes_around_check = []
    real = cache_check.run_check

    def recorded(given, n, buckets, graphs, **kwargs):
        before = set(graphs.shapes)
        result = real(given, n, buckets, graphs, **kwargs)
        shapes_around_check.append((before, set(graphs.shapes)))
        return result

    monkeypatch.setattr(cache_check, "run_check", recorded)
    questions = [ScoreRequest(_tokens(q, 40), [c]) for q in range(3) for c in _tokens(20 + q, 4)]
    planned = [GenerateRequest(_tokens(k, 10 + k), 12) for k in range(2)]
    scorer = TokenScorer(network, batch_size=8)
    scorer.fit_lengths(scorer.plan_rows(questions) + scorer.plan_generate(planned))
    assert scorer.read_widths and scorer.cache_caps   # narrower than the bucket: what the check must keep to
    with caplog.at_level(logging.INFO, logger="evald.pipeline.engine"):
        scorer.warm_up(forks=True, check_rows=[list(r.context) + list(r.continuation) for r in questions])
    [(before, after)] = shapes_around_check
    assert after == before, f"the check compiled {after - before}"
    assert any("checked against its full forward" in r.getMessage() for r in caplog.records)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_suite_that_plans_no_fork_compiles_no_fork_graph(network):
    """Single-token choices never fork (score forks what plan_rows forks): no fork graph, nor its prefill, is
    compiled, the same numbers; diverging choices keep their forks."""
    single = [ScoreRequest(_tokens(q, 40), [c]) for q in range(3) for c in _tokens(20 + q, 4)]
    fitted = TokenScorer(network, batch_size=8)
    fitted.fit_lengths(fitted.plan_rows(single))
    fitted.warm_up(generate=False, forks=True)
    assert fitted.forks and not fitted.plans_forks   # it could fork; its suite's plan has none
    assert {shape[0] for shape in fitted._shapes} == {"score"}
    unfitted = TokenScorer(network, batch_size=8, lengths=fitted.lengths)
    for a, b in zip(fitted.score(single), unfitted.score(single)):
        np.testing.assert_allclose(a.logprobs, b.logprobs, rtol=1e-6, atol=0)
    diverging = [ScoreRequest(_tokens(q, 40), _tokens(30 + 4 * q + c, 6)) for q in range(3) for c in range(4)]
    forking = TokenScorer(network, batch_size=8)
    forking.fit_lengths(forking.plan_rows(diverging))
    forking.warm_up(generate=False, forks=True)
    assert forking.plans_forks and any(shape[0] == "fork" for shape in forking._shapes)


def test_a_generation_only_suite_compiles_only_the_scoring_graph_its_check_reads(network, caplog):
    """Generation scores nothing: one scoring graph, in the bucket the cached path's check runs in, reading a
    position a row (the head nowhere near every position); a network without a cache (no check) compiles none.
    The greedy tokens are the unfitted scorer's."""
    import logging

    from tests.networks import without_cached_decoding

    planned = [GenerateRequest(_tokens(k, 10 + k), 12) for k in range(2)]
    scorer = TokenScorer(network, batch_size=2)
    scorer.fit_lengths(scorer.plan_generate(planned))
    with caplog.at_level(logging.INFO, logger="evald.pipeline.engine"):
        scorer.warm_up(forks=False)
    assert any("checked against its full forward" in r.getMessage() for r in caplog.records)
    [(_, rows, length, reads)] = [shape for shape in scorer._shapes if shape[0] == "score"]
    assert reads == rows == scorer.rows_for(length) and not scorer.plans_scores
    unfitted = TokenScorer(network, batch_size=2, lengths=scorer.lengths)
    assert scorer.generate(planned) == unfitted.generate(planned)

    full = TokenScorer(without_cached_decoding(network), batch_size=2)
    full.fit_lengths(full.plan_generate(planned))
    full.warm_up(forks=False)
    assert not [shape for shape in full._shapes if shape[0] == "score"] and full.compiled_graphs > 0
    assert full.generate(planned) == unfitted.generate(planned)
