"""Standard errors of evald's metrics on the fixed subset, from the per-sample outputs alone.

The subset is a sample of the validation set, so every metric on it has a sampling
error; its standard error (SE) says how far apart two values must be before the
difference says more than "another sample would have moved it this much". Each
metric ``eval/<name>`` gets ``eval/<name>_se`` next to it (docs/metrics.md):

* a mean of per-sample values (classification loss and accuracy): ``s / sqrt(n)``,
  ``s`` the sample standard deviation (ddof 1);
* a ratio of sums (the token-weighted LM loss and accuracy ``sum(y) / sum(x)``, one
  ``y`` and ``x`` per sample): the delta-method SE of a ratio estimator,
  ``sqrt(n / (n - 1) * sum((y - r x)^2)) / sum(x)``; with equal ``x`` it is ``s / sqrt(n)``
  of the per-sample means. ``perplexity = exp(loss)`` gets ``exp(loss) * SE(loss)``;
* a metric that is not a mean (macro-F1, AUC): the standard deviation over
  ``RESAMPLES`` seeded bootstrap resamples of the samples (nan where the metric is
  undefined in a resample are left out). The seed is fixed, so the same outputs always
  give the same SE; the bootstrap's own relative error is about ``1 / sqrt(2 * RESAMPLES)``
  (5 %).

Everything here is a function of the per-sample outputs, so a subset evaluated in parts
(on several devices) gives the same SEs once the parts are put together. Fewer than two
samples give nan: there is no spread to measure.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

SE_SUFFIX = "_se"
RESAMPLES = 200
SEED = 0
_BOOTSTRAP_BUDGET = 50_000_000  # resamples x samples x classes: beyond it, fewer resamples (never under 50)


def se_tag(tag: str) -> str:
    """``eval/loss`` -> ``eval/loss_se``."""
    return tag + SE_SUFFIX


def mean_se(values: np.ndarray) -> float:
    values = np.asarray(values, dtype=np.float64)
    if values.size < 2:
        return math.nan
    return float(values.std(ddof=1) / math.sqrt(values.size))


def ratio_se(numerators: np.ndarray, denominators: np.ndarray) -> float:
    """Delta-method SE of ``sum(numerators) / sum(denominators)``, one pair per sample."""
    y = np.asarray(numerators, dtype=np.float64)
    x = np.asarray(denominators, dtype=np.float64)
    n, total = y.size, float(x.sum())
    if n < 2 or total <= 0:
        return math.nan
    residuals = y - (float(y.sum()) / total) * x
    return float(math.sqrt(n / (n - 1) * float(np.dot(residuals, residuals))) / total)


def bootstrap_se(statistic: Callable[[np.ndarray], np.ndarray], n: int, *, work_per_resample: int = 1,
                 resamples: int = RESAMPLES, seed: int = SEED) -> float:
    """Standard deviation of ``statistic`` over seeded bootstrap resamples of ``n`` samples.

    ``statistic`` takes a (B, n) array of sample indices and returns B values (nan allowed).
    """
    if n < 2:
        return math.nan
    resamples = max(50, min(resamples, _BOOTSTRAP_BUDGET // max(1, n * work_per_resample)))
    indices = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
    values = np.asarray(statistic(indices), dtype=np.float64)
    values = values[np.isfinite(values)]
    return float(values.std(ddof=1)) if values.size >= 2 else math.nan


# ---------------------------------------------------------------- per task


def lm_standard_errors(nll: np.ndarray, correct: np.ndarray, tokens: np.ndarray) -> dict[str, float]:
    """SEs of the token-weighted ``eval/loss``, ``eval/perplexity`` and ``eval/accuracy``."""
    loss_se = ratio_se(nll, tokens)
    loss = float(np.sum(nll)) / float(np.sum(tokens)) if np.sum(tokens) > 0 else math.nan
    return {"eval/loss_se": loss_se,
            "eval/perplexity_se": math.exp(min(loss, 700.0)) * loss_se,
            "eval/accuracy_se": ratio_se(correct, tokens)}


def classification_standard_errors(probs: np.ndarray, labels: np.ndarray,
                                   sample_nll: np.ndarray) -> dict[str, float]:
    """SEs of ``eval/loss``, ``eval/accuracy`` (means) and ``eval/macro_f1``, ``eval/auc`` (bootstrap)."""
    labels = np.asarray(labels, dtype=np.int64)
    preds = probs.argmax(axis=1)
    classes = probs.shape[1]
    return {"eval/loss_se": mean_se(sample_nll),
            "eval/accuracy_se": mean_se((preds == labels).astype(np.float64)),
            "eval/macro_f1_se": bootstrap_se(lambda idx: macro_f1_rows(labels[idx], preds[idx], classes),
                                             labels.size, work_per_resample=classes),
            "eval/auc_se": bootstrap_se(lambda idx: auc_rows(probs, labels, idx), labels.size,
                                        work_per_resample=classes)}


def macro_f1_rows(labels: np.ndarray, preds: np.ndarray, classes: int) -> np.ndarray:
    """Macro-F1 of each row (scikit-learn's: over classes present in labels or predictions)."""
    total = np.zeros(labels.shape[0])
    present = np.zeros(labels.shape[0])
    for c in range(classes):
        is_label, is_pred = labels == c, preds == c
        tp = (is_label & is_pred).sum(axis=1)
        denominator = is_label.sum(axis=1) + is_pred.sum(axis=1)  # 2TP + FP + FN
        here = denominator > 0
        total += np.where(here, 2.0 * tp / np.maximum(denominator, 1), 0.0)
        present += here
    return total / np.maximum(present, 1)


def auc_rows(probs: np.ndarray, labels: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """ROC-AUC of each resample (rows of ``indices``): binary on class 1, else macro one-vs-rest over
    the classes with positives and negatives in that resample; nan where none is defined."""
    classes = probs.shape[1]
    rows = labels[indices]
    columns = [1] if classes == 2 else range(classes)
    per_class = np.stack([_rank_auc(_average_ranks(probs[indices, c]), rows == c) for c in columns])
    with np.errstate(invalid="ignore"):
        defined = np.isfinite(per_class)
        counts = defined.sum(axis=0)
        sums = np.where(defined, per_class, 0.0).sum(axis=0)
        return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)


def _average_ranks(scores: np.ndarray) -> np.ndarray:
    """1-based ranks of each row's scores, ties sharing their average rank (Mann-Whitney)."""
    b, n = scores.shape
    order = np.argsort(scores, axis=1, kind="mergesort")
    ordered = np.take_along_axis(scores, order, axis=1)
    position = np.broadcast_to(np.arange(n), (b, n))
    starts_group = np.ones((b, n), dtype=bool)
    starts_group[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
    ends_group = np.ones((b, n), dtype=bool)
    ends_group[:, :-1] = starts_group[:, 1:]
    first = np.maximum.accumulate(np.where(starts_group, position, 0), axis=1)
    last = np.minimum.accumulate(np.where(ends_group, position, n - 1)[:, ::-1], axis=1)[:, ::-1]
    ranks = np.empty((b, n))
    np.put_along_axis(ranks, order, (first + last) / 2.0 + 1.0, axis=1)
    return ranks


def _rank_auc(ranks: np.ndarray, positive: np.ndarray) -> np.ndarray:
    n_pos = positive.sum(axis=1).astype(np.float64)
    n_neg = positive.shape[1] - n_pos
    u = (ranks * positive).sum(axis=1) - n_pos * (n_pos + 1) / 2.0
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where((n_pos > 0) & (n_neg > 0), u / (n_pos * n_neg), np.nan)
