"""Sample-quality metrics against values worked out by hand."""

import math

import numpy as np
import pytest

from evald.pipeline.metrics.sample_quality import (
    distinct_n,
    mean_repetition_rate,
    repetition_rate,
    sample_quality_report,
    topic_consistency,
)


def test_repetition_rate_alternating_sequence():
    seq = [1, 2, 1, 2, 1, 2]
    # unigrams: 6 tokens, 2 unique -> 1 - 2/6
    assert repetition_rate(seq, 1) == pytest.approx(2 / 3)
    # bigrams: (1,2)(2,1)(1,2)(2,1)(1,2): 5 total, 2 unique -> 1 - 2/5
    assert repetition_rate(seq, 2) == pytest.approx(0.6)
    # trigrams: (1,2,1)(2,1,2)(1,2,1)(2,1,2): 4 total, 2 unique
    assert repetition_rate(seq, 3) == pytest.approx(0.5)


def test_repetition_rate_no_repeats_and_short_samples():
    assert repetition_rate([1, 2, 3, 4], 2) == 0.0
    assert repetition_rate([1, 2], 3) == 0.0
    assert repetition_rate([], 1) == 0.0
    assert repetition_rate([7, 7, 7, 7], 1) == pytest.approx(0.75)


def test_repetition_rate_accepts_numpy_arrays():
    assert repetition_rate(np.array([1, 2, 1, 2, 1, 2], dtype=np.int32), 2) == pytest.approx(0.6)


def test_repetition_rate_rejects_bad_n():
    with pytest.raises(ValueError, match="n-gram order"):
        repetition_rate([1, 2, 3], 0)


def test_mean_repetition_rate_weights_samples_equally():
    samples = [[1, 2, 1, 2, 1, 2], [1, 2, 3, 4], [5]]
    # rep-2 per sample: 0.6, 0.0, 0.0 (too short)
    assert mean_repetition_rate(samples, 2) == pytest.approx(0.2)
    assert mean_repetition_rate([], 2) == 0.0


def test_distinct_n_pools_over_samples():
    samples = [[1, 2, 3], [1, 2, 4]]
    # unigrams: 6 total, unique {1,2,3,4} -> 4/6
    assert distinct_n(samples, 1) == pytest.approx(4 / 6)
    # bigrams: (1,2)(2,3)(1,2)(2,4): 4 total, 3 unique
    assert distinct_n(samples, 2) == pytest.approx(3 / 4)
    assert distinct_n([[1], [2]], 2) == 0.0
    assert distinct_n([], 1) == 0.0


def test_topic_consistency_cosine_of_unigram_counts():
    # prompt counts: {1:2, 2:1}; continuation counts: {1:1, 3:1}
    # dot = 2, |p| = sqrt(5), |c| = sqrt(2)
    assert topic_consistency([1, 1, 2], [1, 3], vocab_size=4) == pytest.approx(2 / math.sqrt(10))
    assert topic_consistency([1, 2], [2, 1, 1, 2], vocab_size=3) == pytest.approx(1.0)
    assert topic_consistency([0, 1], [2, 3], vocab_size=4) == 0.0
    assert topic_consistency([], [1], vocab_size=4) == 0.0
    assert topic_consistency([1], [], vocab_size=4) == 0.0


def test_topic_consistency_rejects_out_of_vocab_ids():
    with pytest.raises(ValueError, match="outside"):
        topic_consistency([1, 9], [1], vocab_size=4)


def test_sample_quality_report_keys_and_values():
    prompts = [[1, 2], [3, 4]]
    continuations = [[1, 2, 1, 2, 1, 2], [3, 5, 6, 7]]
    report = sample_quality_report(prompts, continuations, vocab_size=8)
    assert set(report) == {"rep_1", "rep_2", "rep_3", "rep_4", "distinct_1", "distinct_2", "topic_consistency"}
    assert report["rep_2"] == pytest.approx((0.6 + 0.0) / 2)
    assert report["rep_1"] == pytest.approx((2 / 3 + 0.0) / 2)
    # unigrams over continuations: 10 total, unique {1,2,3,5,6,7}
    assert report["distinct_1"] == pytest.approx(6 / 10)
    # bigrams: 5 + 3 = 8 total; unique (1,2)(2,1)(3,5)(5,6)(6,7)
    assert report["distinct_2"] == pytest.approx(5 / 8)
    # pair 1: p=(1,1) c=(3,3) -> 1.0 ; pair 2: p={3,4} c={3,5,6,7} -> 1/(sqrt2*2)
    assert report["topic_consistency"] == pytest.approx((1.0 + 1 / (2 * math.sqrt(2))) / 2)


def test_sample_quality_report_length_mismatch():
    with pytest.raises(ValueError, match="one continuation per prompt"):
        sample_quality_report([[1]], [[1], [2]], vocab_size=4)
