"""Standard errors from per-sample outputs: checked against their definitions, against the
spread of the metric over many independent subsets drawn from a known population, and against
the metric code evald reports (the bootstrap's own macro-F1 and AUC equal evald's and
scikit-learn's on the full sample)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from evald.pipeline.metrics import uncertainty as U


def test_ratio_se_with_equal_denominators_is_the_se_of_the_per_sample_means():
    rng = np.random.default_rng(0)
    nll = rng.gamma(2.0, 30.0, size=200)
    tokens = np.full(200, 64.0)
    assert U.ratio_se(nll, tokens) == pytest.approx(U.mean_se(nll / 64.0), rel=1e-12)
    assert U.mean_se(nll / 64.0) == pytest.approx((nll / 64.0).std(ddof=1) / math.sqrt(200), rel=1e-12)


def test_fewer_than_two_samples_have_no_standard_error():
    assert math.isnan(U.mean_se(np.array([1.0])))
    assert math.isnan(U.ratio_se(np.array([3.0]), np.array([2.0])))
    assert math.isnan(U.bootstrap_se(lambda idx: idx.mean(axis=1), 1))


def test_the_ratio_se_predicts_the_spread_of_the_token_weighted_loss_over_independent_subsets():
    """A population of 100 000 'documents' from 8 to 2048 tokens, short ones harder and noisier; the
    loss of a 256-document subset is sum(nll) / sum(tokens). Its delta-method SE, computed from one
    subset (averaged over 20 subsets), must match the standard deviation of that loss over 2 000
    independent subsets within 10 %. The SE of the unweighted per-document mean, a plausible
    mistake, is about three times too large here."""
    rng = np.random.default_rng(1)
    tokens = np.exp(rng.uniform(np.log(8), np.log(2048), size=100_000)).round()
    nll = (1.0 + 8.0 / np.sqrt(tokens) * rng.gamma(2.0, 1.0, size=100_000)) * tokens
    picks = [rng.choice(100_000, 256, replace=False) for _ in range(2020)]
    spread = np.std([nll[p].sum() / tokens[p].sum() for p in picks[:2000]], ddof=1)
    estimate = np.mean([U.ratio_se(nll[p], tokens[p]) for p in picks[2000:]])
    assert estimate == pytest.approx(spread, rel=0.10)
    assert np.mean([U.mean_se(nll[p] / tokens[p]) for p in picks[2000:]]) > 2 * spread


def test_the_bootstrap_se_of_a_mean_matches_its_analytic_se_and_is_reproducible():
    rng = np.random.default_rng(2)
    correct = (rng.random(400) < 0.7).astype(np.float64)
    boot = U.bootstrap_se(lambda idx: correct[idx].mean(axis=1), correct.size)
    assert boot == pytest.approx(U.mean_se(correct), rel=0.15)
    assert U.bootstrap_se(lambda idx: correct[idx].mean(axis=1), correct.size) == boot  # seeded


@pytest.mark.parametrize("classes, n, seed", [(2, 300, 3), (5, 400, 4), (7, 60, 5)])
def test_the_bootstrap_statistics_equal_evalds_metrics_and_scikit_learns_on_the_full_sample(classes, n, seed):
    pytest.importorskip("mindspore")
    from sklearn.metrics import f1_score, roc_auc_score

    from evald.pipeline.metrics.classification import classification_metrics, to_probabilities

    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, size=n)
    if classes > 2:
        labels[labels == classes - 1] = 0                   # one class never occurs in the labels
    logits = rng.normal(size=(n, classes)) + 1.5 * np.eye(classes)[labels]
    logits[: n // 4] = np.round(logits[: n // 4])            # ties in the scores
    probs = to_probabilities(logits)
    everything = np.arange(n)[None, :]
    reported = classification_metrics(logits, labels, classes)
    f1 = U.macro_f1_rows(labels[everything], probs.argmax(axis=1)[everything], classes)[0]
    auc = U.auc_rows(probs, labels, everything)[0]
    assert f1 == pytest.approx(reported["macro_f1"], rel=1e-9)
    assert f1 == pytest.approx(f1_score(labels, probs.argmax(axis=1), average="macro", zero_division=0), rel=1e-9)
    assert auc == pytest.approx(reported["auc"], rel=1e-9)
    present = sorted(set(labels))
    if classes == 2:
        expected = roc_auc_score(labels, probs[:, 1])
    else:
        expected = np.mean([roc_auc_score(labels == c, probs[:, c]) for c in present])
    assert auc == pytest.approx(expected, rel=1e-9)


def test_classification_task_reports_a_standard_error_next_to_each_metric():
    pytest.importorskip("mindspore")
    from evald.pipeline.tasks.classification import ClassificationTask

    rng = np.random.default_rng(6)
    labels = rng.integers(0, 3, size=200)
    logits = rng.normal(size=(200, 3)) + np.eye(3)[labels]
    metrics = ClassificationTask().metrics({"logits": logits, "labels": labels})
    for name in ("loss", "accuracy", "macro_f1", "auc"):
        se = metrics[f"eval/{name}_se"]
        assert 0 < se < 0.2, (name, se)
    correct = (logits.argmax(axis=1) == labels).astype(float)
    assert metrics["eval/accuracy_se"] == pytest.approx(correct.std(ddof=1) / math.sqrt(200))
    # a bigger subset of the same population measures more precisely
    labels4 = np.tile(labels, 4)
    logits4 = np.tile(logits, (4, 1)) + rng.normal(scale=1e-3, size=(800, 3))
    bigger = ClassificationTask().metrics({"logits": logits4, "labels": labels4})
    assert bigger["eval/auc_se"] < metrics["eval/auc_se"] and bigger["eval/macro_f1_se"] < metrics["eval/macro_f1_se"]


def test_lm_metrics_are_the_same_whether_the_outputs_came_in_one_part_or_several():
    pytest.importorskip("mindspore")
    from evald.pipeline.tasks.lm import LanguageModelTask

    rng = np.random.default_rng(7)
    outputs = {"nll": rng.gamma(3.0, 40.0, size=96), "correct": rng.integers(0, 64, size=96).astype(float),
               "tokens": np.full(96, 64.0)}
    task = LanguageModelTask()
    whole = task.metrics(outputs)
    parts = [{k: v[i::3] for k, v in outputs.items()} for i in range(3)]   # three devices' shares
    joined = {k: np.concatenate([p[k] for p in parts]) for k in outputs}
    assert task.metrics(joined) == pytest.approx(whole, rel=1e-12)
    assert whole["eval/loss_se"] == pytest.approx((outputs["nll"] / 64).std(ddof=1) / math.sqrt(96))
    assert whole["eval/perplexity_se"] == pytest.approx(whole["eval/perplexity"] * whole["eval/loss_se"])
