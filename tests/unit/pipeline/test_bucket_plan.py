"""Bucket lengths fitted to a suite's own rows (issue 28, length-aware batching): the choice itself, the dry
run that learns the rows, and that fitted buckets give the ladder's numbers with less padding."""

from __future__ import annotations

import math

import pytest

from evald.pipeline.suites.scoring import FIT_STEP, fitted_lengths, length_ladder

NETWORK_SEED = 7       # the network fixture's (tests/unit/conftest.py)
BPB_DOCS_PER_SET = 3   # the include fixture's (conftest.py)


def rows_for(n: int) -> int:
    """Rows per forward of a 2,560-token budget, as the bench at the issue's size runs (--batch-size 2, 1,280)."""
    return max(1, 2560 // n)


def padded(rows: list[int], lengths: tuple[int, ...]) -> int:
    """Tokens run for ``rows`` in buckets of ``lengths``: each in the shortest that holds it, whole forwards."""
    total = 0
    for n in lengths:
        below = max([m for m in lengths if m < n], default=0)
        count = sum(1 for r in rows if below < r <= n)
        total += math.ceil(count / rows_for(n)) * rows_for(n) * n
    return total


def test_rows_of_one_length_get_a_bucket_of_their_own():
    """10 held-out documents of 600 tokens in a 1,280 window: the ladder's 704 pads every row by 104 tokens."""
    assert fitted_lengths([600] * 10, 1280, rows_for, most=8) == (608, 1280)
    assert padded([600] * 10, (608, 1280)) < padded([600] * 10, length_ladder(1280))


def test_no_more_buckets_than_asked_ending_at_max_length_and_never_more_padding_than_the_ladder():
    import random

    rng = random.Random(0)
    rows = [rng.randint(20, 1280) for _ in range(3000)]
    ladder = length_ladder(1280)
    for most in (1, 3, len(ladder)):
        lengths = fitted_lengths(rows, 1280, rows_for, most=most)
        assert len(lengths) <= most and lengths[-1] == 1280 and list(lengths) == sorted(set(lengths))
        assert all(n % FIT_STEP == 0 for n in lengths)
    assert padded(rows, fitted_lengths(rows, 1280, rows_for, most=len(ladder))) < padded(rows, ladder)


def test_a_bucket_that_saves_less_than_a_forward_is_not_compiled():
    assert fitted_lengths([1156, 1156], 1280, rows_for, most=8) == (1280,)   # saves 224 tokens, a forward is 2,560
    assert fitted_lengths([], 1280, rows_for, most=8) == (1280,)


def test_a_suite_fits_its_buckets_before_compiling_and_gives_the_ladders_numbers(include, network):
    """The demo's bits-per-byte suite through lm-eval: its dry run fits the buckets (no forward, no graph), and
    the fitted suite's per-document numbers equal the ladder's (rel 1e-6) with fewer padded tokens."""
    pytest.importorskip("lm_eval")
    from evald.config.options import SuiteOptions
    from evald.pipeline.suites.runner import SuiteRunner
    from evald.pipeline.suites.scoring import TokenScorer
    from evald.pipeline.suites.tokenizer import ByteTokenizer

    options = SuiteOptions(tasks=("stdlib_bpb",), include_path=(include,), batch_size=8)
    fitted = SuiteRunner("bpb", options, network, ByteTokenizer())
    assert fitted.scorer.compiled_graphs == 0 and fitted.scorer.stats.forward_passes == 0   # a dry run
    ladder_scorer = TokenScorer(network, max_length=fitted.scorer.max_length, batch_size=8,
                                lengths=length_ladder(fitted.scorer.max_length))
    ladder = SuiteRunner("bpb", options, network, ByteTokenizer(), scorer=ladder_scorer)
    assert ladder.scorer.lengths == length_ladder(fitted.scorer.max_length)       # lengths given: kept
    assert fitted.scorer.lengths != ladder.scorer.lengths and fitted.scorer.lengths[-1] == fitted.scorer.max_length
    got, want = fitted.run(), ladder.run()
    for task, result in want.tasks.items():
        for a, b in zip(got.tasks[task].samples, result.samples):
            assert a["doc_id"] == b["doc_id"]
            assert a["metrics"]["bits_per_byte"][0] == pytest.approx(b["metrics"]["bits_per_byte"][0], rel=1e-6)
    assert got.compiled_graphs <= want.compiled_graphs
    assert fitted.scorer.stats.padded_tokens < ladder.scorer.stats.padded_tokens
    assert fitted.scorer.stats.real_tokens == ladder.scorer.stats.real_tokens


def test_another_eval_rank_builds_the_fitted_scorer_of_rank_0(network):
    """Rank 0 fits its buckets after building its scorer from the ladder; the other ranks build theirs from rank
    0's settings, with the fitted lengths. Every shape must agree, or a group's bits differ from one device's
    (CI: the fork piece followed the smallest length, 32 on rank 0 and 64 on rank 1)."""
    from types import SimpleNamespace

    from evald.pipeline.group.evaluator import _scorer_for
    from evald.pipeline.group.scoring import scorer_settings
    from evald.pipeline.suites.scoring import TokenScorer

    rank_0 = TokenScorer(network, max_length=64, batch_size=8)
    rank_0.fit_lengths([64] * 50)
    other = _scorer_for({}, SimpleNamespace(network=network), scorer_settings(rank_0))
    assert rank_0.forks and rank_0.lengths == (64,)
    assert (other.lengths, other.buckets, other.fork_piece) == (rank_0.lengths, rank_0.buckets, rank_0.fork_piece)
