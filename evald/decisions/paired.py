"""Paired comparison of two steps scored on the same documents: the difference, its paired-bootstrap
confidence interval, McNemar's exact and mid-p tests for 0/1 metrics, the paired standard error
and the minimum detectable effect (MDE) at that number of documents.

Pure: per-document arrays in, numbers out; no I/O (``ledger/samples.py`` reads the files).

Why paired: both steps answered the same documents, so most of the sampling noise is shared
and cancels in the difference; an unpaired test (lm-eval's comparator, lm-eval #3831)
treats the two values as independent and overstates the noise of their difference.

A metric's per-document values are either numbers (the metric is their mean: ``acc``,
``acc_norm``, ``exact_match``) or ``(loglikelihood, weight)`` pairs, lm-eval's per-document
output of ``loglikelihood_rolling`` tasks, aggregated as a ratio of sums ``r = sum(ll) / sum(w)``:
``bits_per_byte = -r / ln 2``, ``byte_perplexity`` and ``word_perplexity = exp(-r)``.

* difference: ``value(B) - value(A)``, each from all documents;
* paired SE: for a mean, ``sd(b_i - a_i) / sqrt(n)`` (ddof 1); for a ratio, the delta method on
  each document's influence, paired by document (the same estimator as
  ``pipeline/metrics/uncertainty.ratio_se``, applied to the difference);
* bootstrap interval: ``resamples`` resamples of the documents (the same resampled documents
  for both steps, which is what makes it paired), ``rng = numpy.random.default_rng(seed)``,
  each resample's indices ``rng.integers(0, n, size=n)`` drawn in blocks of rows; the
  percentile interval at ``1 - alpha``. The same inputs and seed give the same interval;
* McNemar (every value 0 or 1 on both sides): ``n10`` documents right at A only, ``n01`` at B
  only; under no difference ``min(n10, n01) ~ Binomial(n10 + n01, 1/2)``; exact two-sided
  ``p = min(1, 2 P(X <= k))`` and mid-p ``2 P(X <= k) - P(X = k)``;
* MDE: ``(z(1 - alpha/2) + z(power)) * paired SE``, the smallest true difference a two-sided test
  at level ``alpha`` detects with probability ``power`` at this many documents, with the
  spread of the differences observed here (defaults: alpha 0.05, power 0.8: 2.8016 SEs).

May import: numpy and the standard library only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Callable

import numpy as np

ALPHA = 0.05
POWER = 0.8
RESAMPLES = 10_000
SEED = 0
_BLOCK_CELLS = 4_000_000  # resampled indices held at once (rows x documents), about 32 MB

# lm-eval's aggregations of (loglikelihood, weight) pairs, as a function of r = sum(ll) / sum(w),
# with their derivative (for the delta-method SE).
_RATIO_METRICS: dict[str, tuple[Callable[[float], float], Callable[[float], float]]] = {
    "bits_per_byte": (lambda r: -r / math.log(2), lambda r: -1 / math.log(2)),
    "byte_perplexity": (lambda r: math.exp(-r), lambda r: -math.exp(-r)),
    "word_perplexity": (lambda r: math.exp(-r), lambda r: -math.exp(-r)),
}


class PairedError(ValueError):
    """The two sides cannot be compared as given; the message says why."""


@dataclass(frozen=True)
class McNemar:
    a_only: int     # documents scored 1 at step A and 0 at step B
    b_only: int     # documents scored 1 at step B and 0 at step A
    p_exact: float  # two-sided exact binomial test on the discordant documents
    p_mid: float    # its mid-p version (less conservative; Fagerland et al. 2013)


@dataclass(frozen=True)
class PairedComparison:
    metric: str
    n: int
    value_a: float
    value_b: float
    difference: float    # value_b - value_a
    se: float            # paired standard error of the difference
    ci_low: float
    ci_high: float
    alpha: float
    power: float
    mde: float           # minimum detectable effect at alpha (two-sided) and power
    resamples: int
    seed: int
    mcnemar: McNemar | None  # for 0/1 metrics

    @property
    def confidence(self) -> float:
        return 1.0 - self.alpha

    def to_json(self) -> dict:
        out = {k: _finite_or_none(getattr(self, k)) for k in (
            "metric", "n", "value_a", "value_b", "difference", "se", "ci_low", "ci_high", "alpha", "power", "mde",
            "resamples", "seed")}  # strict JSON: an SE of one document (nan) is null
        out["confidence"] = self.confidence
        out["mcnemar"] = None if self.mcnemar is None else {
            "a_only": self.mcnemar.a_only, "b_only": self.mcnemar.b_only, "p_exact": self.mcnemar.p_exact,
            "p_mid": self.mcnemar.p_mid}
        return out


def _finite_or_none(value):
    return None if isinstance(value, float) and not math.isfinite(value) else value


@dataclass(frozen=True)
class _Metric:
    """One side's per-document values, as a ratio of sums (a mean is ``sum(v) / sum(1)``)."""

    numerators: np.ndarray
    denominators: np.ndarray
    transform: Callable[[float], float]
    derivative: Callable[[float], float]

    @property
    def ratio(self) -> float:
        return float(self.numerators.sum() / self.denominators.sum())

    @property
    def value(self) -> float:
        return self.transform(self.ratio)

    def influence(self) -> np.ndarray:
        """Each document's first-order contribution to the value (delta method)."""
        r = self.ratio
        return self.derivative(r) * (self.numerators - r * self.denominators) / self.denominators.sum()


def _as_metric(name: str, values: np.ndarray, side: str) -> _Metric:
    values = np.asarray(values, dtype=np.float64)
    if not np.all(np.isfinite(values)):
        raise PairedError(f"{name}: step {side} has a value that is not finite")
    if values.ndim == 1:
        return _Metric(values, np.ones_like(values), lambda r: r, lambda r: 1.0)
    if values.ndim == 2 and values.shape[1] == 2:
        if name not in _RATIO_METRICS:
            raise PairedError(f"{name}: per-document pairs are only understood for {sorted(_RATIO_METRICS)}")
        if not np.all(values[:, 1] > 0):
            raise PairedError(f"{name}: step {side} has a document whose weight (second value) is not > 0")
        transform, derivative = _RATIO_METRICS[name]
        return _Metric(values[:, 0], values[:, 1], transform, derivative)
    raise PairedError(f"{name}: per-document values must be numbers or (loglikelihood, weight) pairs, "
                      f"got shape {values.shape}")


def _is_binary(values: np.ndarray) -> bool:
    return values.ndim == 1 and bool(np.all((values == 0) | (values == 1)))


def compare(metric: str, a: np.ndarray, b: np.ndarray, *, alpha: float = ALPHA, power: float = POWER,
            resamples: int = RESAMPLES, seed: int = SEED) -> PairedComparison:
    """Compare step B with step A on one metric; ``a[i]`` and ``b[i]`` are the same document's values."""
    if not 0 < alpha < 1 or not 0 < power < 1:
        raise PairedError(f"alpha and power must be in (0, 1), got alpha={alpha}, power={power}")
    if resamples < 1 or seed < 0:
        raise PairedError(f"resamples must be >= 1 and seed >= 0, got {resamples}, {seed}")
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        raise PairedError(f"{metric}: the two steps have {a.shape} and {b.shape} values; a paired comparison "
                          "needs one value per document on each side")
    n = a.shape[0] if a.ndim else 0
    if n == 0:
        raise PairedError(f"{metric}: no documents to compare")
    side_a, side_b = _as_metric(metric, a, "A"), _as_metric(metric, b, "B")
    value_a, value_b = side_a.value, side_b.value
    se = paired_se_of(side_a, side_b)
    low, high = _bootstrap_interval(side_a, side_b, alpha, resamples, seed)
    z = NormalDist().inv_cdf(1 - alpha / 2) + NormalDist().inv_cdf(power)
    test = mcnemar(a, b) if _is_binary(a) and _is_binary(b) else None
    # no document changed (se 0): the data say nothing about which effect a test would detect
    mde = z * se if se > 0 else float("nan")
    return PairedComparison(metric, n, value_a, value_b, value_b - value_a, se, low, high, alpha, power, mde,
                            resamples, seed, test)


def paired_se(metric: str, a: np.ndarray, b: np.ndarray) -> float:
    """The standard error of ``value(B) - value(A)``, paired by document (nan below two documents)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or a.ndim == 0 or a.shape[0] == 0:
        raise PairedError(f"{metric}: a paired SE needs one value per document on each side, got "
                          f"{a.shape} and {b.shape}")
    return paired_se_of(_as_metric(metric, a, "A"), _as_metric(metric, b, "B"))


def paired_se_of(a: _Metric, b: _Metric) -> float:
    n = a.numerators.shape[0]
    if n < 2:
        return math.nan
    d = b.influence() - a.influence()
    return float(math.sqrt(n / (n - 1) * float(np.dot(d - d.mean(), d - d.mean()))))


def minimum_detectable_effect(se: float, alpha: float = ALPHA, power: float = POWER) -> float:
    """``(z(1 - alpha/2) + z(power)) * se``: two-sided level ``alpha``, probability ``power``."""
    return (NormalDist().inv_cdf(1 - alpha / 2) + NormalDist().inv_cdf(power)) * se


def _bootstrap_interval(a: _Metric, b: _Metric, alpha: float, resamples: int, seed: int) -> tuple[float, float]:
    n = a.numerators.shape[0]
    rng = np.random.default_rng(seed)
    rows = max(1, _BLOCK_CELLS // n)
    differences = np.empty(resamples, dtype=np.float64)
    transform_a, transform_b = np.vectorize(a.transform), np.vectorize(b.transform)
    for start in range(0, resamples, rows):
        count = min(rows, resamples - start)
        idx = rng.integers(0, n, size=(count, n))
        ratio_a = a.numerators[idx].sum(axis=1) / a.denominators[idx].sum(axis=1)
        ratio_b = b.numerators[idx].sum(axis=1) / b.denominators[idx].sum(axis=1)
        differences[start:start + count] = transform_b(ratio_b) - transform_a(ratio_a)
    low, high = np.quantile(differences, [alpha / 2, 1 - alpha / 2])
    return float(low), float(high)


def mcnemar(a: np.ndarray, b: np.ndarray) -> McNemar:
    """McNemar's exact and mid-p tests of two 0/1 scorings of the same documents."""
    a, b = np.asarray(a), np.asarray(b)
    a_only = int(np.count_nonzero((a == 1) & (b == 0)))
    b_only = int(np.count_nonzero((a == 0) & (b == 1)))
    discordant, k = a_only + b_only, min(a_only, b_only)
    if discordant == 0:
        return McNemar(0, 0, 1.0, 1.0)
    log_cdf, log_pmf_k = _binomial_half_log_cdf(k, discordant)
    cdf, pmf_k = math.exp(log_cdf), math.exp(log_pmf_k)
    return McNemar(a_only, b_only, min(1.0, 2 * cdf), min(1.0, 2 * cdf - pmf_k))


def _binomial_half_log_cdf(k: int, m: int) -> tuple[float, float]:
    """``log P(X <= k)`` and ``log P(X = k)`` for ``X ~ Binomial(m, 1/2)``, in log space (no overflow)."""
    i = np.arange(k, dtype=np.float64)
    # log C(m, j) for j = 0..k from the ratios C(m, j+1) / C(m, j) = (m - j) / (j + 1)
    log_comb = np.concatenate([[0.0], np.cumsum(np.log(m - i) - np.log(i + 1))])
    log_pmf = log_comb - m * math.log(2)
    top = float(log_pmf.max())
    return top + math.log(float(np.exp(log_pmf - top).sum())), float(log_pmf[-1])
