"""The paired statistics against references computed independently: scipy's binomial test for
McNemar, a plain numpy paired bootstrap with the same seed, and the MDE by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from evald.decisions import paired
from evald.decisions.paired import PairedError, compare, mcnemar, minimum_detectable_effect


def _scored(n: int, p_a: float, p_b: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    shared = rng.random(n)  # the same documents are hard for both steps: correlated scores
    return (shared < p_a).astype(float), (np.clip(shared + rng.normal(0, 0.15, n), 0, 1) < p_b).astype(float)


@pytest.mark.parametrize("a_only,b_only", [(0, 0), (0, 1), (3, 9), (10, 10), (17, 40), (250, 310), (1, 2000)])
def test_mcnemar_exact_and_mid_p_equal_scipy_binomial_test(a_only, b_only):
    a = np.array([1] * a_only + [0] * b_only + [1] * 50 + [0] * 30, dtype=float)
    b = np.array([0] * a_only + [1] * b_only + [1] * 50 + [0] * 30, dtype=float)
    test = mcnemar(a, b)
    assert (test.a_only, test.b_only) == (a_only, b_only)
    m, k = a_only + b_only, min(a_only, b_only)
    expected = 1.0 if m == 0 else stats.binomtest(k, m, 0.5, alternative="two-sided").pvalue
    mid = 1.0 if m == 0 else min(1.0, 2 * stats.binom.cdf(k, m, 0.5) - stats.binom.pmf(k, m, 0.5))
    assert test.p_exact == pytest.approx(expected, rel=1e-9, abs=1e-300)
    assert test.p_mid == pytest.approx(mid, rel=1e-9, abs=1e-300)
    assert test.p_mid <= test.p_exact


def test_bootstrap_interval_equals_a_plain_numpy_paired_bootstrap_with_the_same_seed():
    a, b = _scored(300, 0.45, 0.55, seed=1)
    result = compare("acc", a, b, resamples=2000, seed=7)
    rng = np.random.default_rng(7)
    idx = rng.integers(0, 300, size=(2000, 300))
    reference = (b[idx].mean(axis=1) - a[idx].mean(axis=1))
    low, high = np.quantile(reference, [0.025, 0.975])
    assert (result.ci_low, result.ci_high) == (pytest.approx(low, abs=1e-12), pytest.approx(high, abs=1e-12))
    assert result.difference == pytest.approx(b.mean() - a.mean())
    assert result.value_a == pytest.approx(a.mean()) and result.value_b == pytest.approx(b.mean())
    assert result.ci_low < result.difference < result.ci_high


def test_the_interval_is_reproducible_and_blocks_of_resamples_do_not_change_it(monkeypatch):
    a, b = _scored(2000, 0.5, 0.52, seed=3)
    first = compare("acc", a, b, resamples=3000, seed=0)
    assert compare("acc", a, b, resamples=3000, seed=0) == first
    monkeypatch.setattr(paired, "_BLOCK_CELLS", 2000 * 7)  # 7 resamples per block instead of all at once
    blocked = compare("acc", a, b, resamples=3000, seed=0)
    assert blocked == first  # blocks of rows draw the same index stream as one call
    assert compare("acc", a, b, resamples=3000, seed=1) != first


def test_paired_se_is_the_sd_of_the_differences_and_smaller_than_the_unpaired_one():
    a, b = _scored(500, 0.4, 0.5, seed=5)
    result = compare("acc_norm", a, b, resamples=200)
    d = b - a
    assert result.se == pytest.approx(d.std(ddof=1) / math.sqrt(500), rel=1e-12)
    unpaired = math.hypot(a.std(ddof=1), b.std(ddof=1)) / math.sqrt(500)
    assert result.se < 0.8 * unpaired  # correlated scores: the paired SE is well below the unpaired one
    assert result.se == pytest.approx(paired.paired_se("acc_norm", a, b), rel=1e-12)


def test_the_mde_by_hand():
    # 100 documents, 10 right at A only, 20 at B only: d takes -1 ten times, +1 twenty times, else 0
    a = np.array([1] * 10 + [0] * 20 + [1] * 40 + [0] * 30, dtype=float)
    b = np.array([0] * 10 + [1] * 20 + [1] * 40 + [0] * 30, dtype=float)
    result = compare("acc", a, b, resamples=100)
    mean = 0.1
    variance = (10 * (-1 - mean) ** 2 + 20 * (1 - mean) ** 2 + 70 * mean ** 2) / 99  # = 0.292929...
    se = math.sqrt(variance / 100)                                                  # = 0.0541
    z = 1.959963984540054 + 0.8416212335729143                                      # z(0.975) + z(0.8)
    assert result.se == pytest.approx(se, rel=1e-12)
    assert result.mde == pytest.approx(z * se, rel=1e-12) and result.mde == pytest.approx(0.15163, abs=1e-5)
    assert minimum_detectable_effect(se, 0.05, 0.8) == pytest.approx(2.8015852 * se, rel=1e-7)
    assert minimum_detectable_effect(se, 0.01, 0.9) == pytest.approx((2.5758293 + 1.2815516) * se, rel=1e-7)
    assert (result.alpha, result.power) == (0.05, 0.8) and result.mcnemar is not None


def test_bits_per_byte_pairs_are_a_ratio_of_sums_with_a_paired_delta_method_se():
    rng = np.random.default_rng(11)
    n = 400
    weights = rng.integers(50, 400, size=n).astype(float)
    ll_a = -weights * rng.uniform(1.0, 1.4, n)
    ll_b = ll_a * 0.97 + rng.normal(0, 3, n)  # step B slightly better on the same documents
    a, b = np.stack([ll_a, weights], 1), np.stack([ll_b, weights], 1)
    result = compare("bits_per_byte", a, b, resamples=2000, seed=2)
    bpb = lambda ll, w: -ll.sum() / w.sum() / math.log(2)  # noqa: E731
    assert result.value_a == pytest.approx(bpb(ll_a, weights)) and result.value_b == pytest.approx(bpb(ll_b, weights))
    rng = np.random.default_rng(2)
    idx = rng.integers(0, n, size=(2000, n))
    reference = [bpb(ll_b[i], weights[i]) - bpb(ll_a[i], weights[i]) for i in idx]
    assert result.ci_low == pytest.approx(np.quantile(reference, 0.025), abs=1e-12)
    assert result.ci_high == pytest.approx(np.quantile(reference, 0.975), abs=1e-12)
    assert result.se == pytest.approx(np.std(reference, ddof=1), rel=0.1)  # delta method ~ bootstrap SD
    assert result.mcnemar is None


def test_inputs_that_cannot_be_paired_are_refused_with_the_reason():
    with pytest.raises(PairedError, match="one value per document"):
        compare("acc", np.zeros(3), np.zeros(4))
    with pytest.raises(PairedError, match="not finite"):
        compare("acc", np.array([0.0, np.nan]), np.zeros(2))
    with pytest.raises(PairedError, match="only understood for"):
        compare("acc", np.ones((3, 2)), np.ones((3, 2)))
    with pytest.raises(PairedError, match="no documents"):
        compare("acc", np.zeros(0), np.zeros(0))
    with pytest.raises(PairedError, match="alpha and power"):
        compare("acc", np.zeros(3), np.zeros(3), alpha=0)


def test_one_document_has_no_spread_and_its_json_stays_strict():
    import json

    result = compare("acc", np.array([0.0]), np.array([1.0]), resamples=10)
    assert result.difference == 1.0 and math.isnan(result.se) and math.isnan(result.mde)
    assert json.loads(json.dumps(result.to_json(), allow_nan=False))["se"] is None


def test_no_document_changed_gives_no_mde_rather_than_zero():
    """Issue 26 item 9: `compare` printed "MDE 0.0000" when no document changed. A zero paired SE
    says the two steps agree on every document, not that any effect at all would be detected."""
    values = np.array([0.0, 1.0, 1.0, 0.0, 1.0])
    result = paired.compare("acc", values, values.copy())
    assert result.difference == 0.0 and result.se == 0.0
    assert math.isnan(result.mde) and result.to_json()["mde"] is None
