"""Bucket lengths fitted to a suite's own rows (issue 28, length-aware batching): the choice itself, the dry
run that learns the rows, and that fitted buckets give the ladder's numbers with less padding."""

from __future__ import annotations

import math

import pytest

from evald.pipeline.suites.scoring import FIT_STEP, fitted_lengths, length_ladder
from tests.bounded import cpu_within

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


# -- the fit's speed and its answer (issue 35: 4,096 distinct lengths in a 65,536 window took 16 s) --------------
def _reference_fit(row_lengths, max_length, rows_for, most):
    """The fit as it was written before issue 35 (a dynamic program over Python dicts, O(most x lengths^2)
    calls of ``cost``): the answer the fast fit must give, on inputs small enough for it."""
    counts: dict[int, int] = {}
    for length in row_lengths:
        n = min(max_length, -(-max(1, int(length)) // FIT_STEP) * FIT_STEP)
        counts[n] = counts.get(n, 0) + 1
    candidates = sorted(set(counts) | {max_length})
    cumulative = [0]
    for n in candidates:
        cumulative.append(cumulative[-1] + counts.get(n, 0))

    def cost(below: int, top: int) -> int:
        rows = cumulative[top + 1] - cumulative[below + 1]
        return -(-rows // rows_for(candidates[top])) * rows_for(candidates[top]) * candidates[top]

    last, penalty = len(candidates) - 1, rows_for(max_length) * max_length
    best = [{j: (cost(-1, j), -1) for j in range(len(candidates))}]
    for k in range(1, min(most, len(candidates))):
        previous = best[-1]
        best.append({j: min((previous[i][0] + cost(i, j), i) for i in range(k - 1, j))
                     for j in range(k, len(candidates))})
    k = min(range(len(best)), key=lambda k: (best[k][last][0] + k * penalty, k))
    chosen, j = [], last
    while j >= 0:
        chosen.append(candidates[j])
        j = best[k][j][1]
        k -= 1
    return tuple(sorted(chosen))


def _brute_force_cost(row_lengths, max_length, rows_for, most) -> int:
    """The least padded tokens plus one forward per bucket below max_length, over every set of buckets."""
    import itertools

    rounded = [min(max_length, -(-max(1, r) // FIT_STEP) * FIT_STEP) for r in row_lengths]
    below = sorted(set(rounded) - {max_length})
    penalty = rows_for(max_length) * max_length
    best = None
    for size in range(0, min(most, len(below) + 1)):
        for extra in itertools.combinations(below, size):
            lengths = tuple(sorted(extra)) + (max_length,)
            total = size * penalty
            for n in lengths:
                low = max([m for m in lengths if m < n], default=0)
                count = sum(1 for r in rounded if low < r <= n)
                total += math.ceil(count / rows_for(n)) * rows_for(n) * n
            best = total if best is None else min(best, total)
    return best


def _cost(row_lengths, lengths, max_length, rows_for) -> int:
    rounded = [min(max_length, -(-max(1, r) // FIT_STEP) * FIT_STEP) for r in row_lengths]
    total = (len(lengths) - 1) * rows_for(max_length) * max_length
    for n in lengths:
        low = max([m for m in lengths if m < n], default=0)
        count = sum(1 for r in rounded if low < r <= n)
        total += math.ceil(count / rows_for(n)) * rows_for(n) * n
    return total


@pytest.mark.parametrize("seed", range(40))
def test_the_fit_gives_the_reference_lengths_and_the_least_cost(seed):
    import random

    rng = random.Random(seed)
    max_length = rng.choice([64, 128, 256, 1280])
    budget = max_length * rng.choice([1, 2, 3, 8])

    def rows(n: int) -> int:
        return max(1, budget // n)

    row_lengths = [rng.randint(1, max_length) for _ in range(rng.randint(0, 60))]
    if seed % 5 == 0:   # ties: many rows of few lengths
        row_lengths = [rng.choice([17, 33, 48]) % max_length + 1 for _ in range(rng.randint(1, 40))]
    most = rng.randint(1, 5)
    got = fitted_lengths(row_lengths, max_length, rows, most)
    assert got == _reference_fit(row_lengths, max_length, rows, most), (row_lengths, max_length, budget, most)
    if len(set(row_lengths)) <= 10:
        assert _cost(row_lengths, got, max_length, rows) == _brute_force_cost(row_lengths, max_length, rows, most)


def test_the_fit_of_4096_distinct_lengths_in_a_65536_window_finishes_in_a_thread_within_a_generous_bound():
    """Issue 35: a suite whose dry run gives every multiple of 16 up to 65,536 (4,096 distinct lengths) fitted
    its buckets in 16 s (the build's first piece, one loop turn); the fit must take a small part of that.
    Run in a thread, the one bound this repository allows a test (generous: 5 s), on the CPU time the fit uses
    (tests/bounded.cpu_within): on a loaded shared machine its wall-clock time counts the other processes too."""
    max_length = 65536
    ladder = length_ladder(max_length)
    row_lengths = [n for n in range(FIT_STEP, max_length + 1, FIT_STEP) for _ in range(1 + n % 3)]
    assert len({-(-r // FIT_STEP) for r in row_lengths}) == 4096

    def rows(n: int) -> int:
        return max(1, 8 * max_length // n)

    lengths = cpu_within(5.0, lambda: fitted_lengths(row_lengths, max_length, rows, len(ladder)),
                         what="the fit of 4,096 distinct lengths")
    assert lengths[-1] == max_length and len(lengths) <= len(ladder)
    assert _cost(row_lengths, lengths, max_length, rows) <= _cost(row_lengths, ladder, max_length, rows)
