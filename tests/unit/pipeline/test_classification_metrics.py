"""classification_metrics against scikit-learn on seeded random data."""

import warnings

import numpy as np
import pytest
from mindspore.train import F1
from sklearn.metrics import accuracy_score, f1_score, roc_auc_score

from evald.pipeline.metrics.classification import classification_metrics

REL = 1e-6


def _softmax(x):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _informative_logits(rng, n, c, absent=()):
    """Logits correlated with the labels so AUC/F1 are away from trivial values."""
    choices = [k for k in range(c) if k not in absent]
    labels = rng.choice(choices, size=n)
    logits = rng.normal(size=(n, c))
    logits[np.arange(n), labels] += 1.0
    return logits, labels


def _ovr_auc_over_defined_classes(labels, probs):
    """sklearn's OvR macro AUC restricted to classes with both positives and negatives."""
    aucs = [
        roc_auc_score(labels == k, probs[:, k])
        for k in range(probs.shape[1])
        if 0 < (labels == k).sum() < len(labels)
    ]
    return float(np.mean(aucs)) if aucs else float("nan")


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("num_classes", [2, 3, 5])
@pytest.mark.parametrize("as_logits", [True, False])
def test_matches_sklearn(seed, num_classes, as_logits):
    rng = np.random.default_rng(seed)
    logits, labels = _informative_logits(rng, 80, num_classes)
    probs = _softmax(logits)
    got = classification_metrics(logits if as_logits else probs, labels, num_classes)

    preds = probs.argmax(axis=1)
    assert got["accuracy"] == pytest.approx(accuracy_score(labels, preds), rel=REL)
    assert got["macro_f1"] == pytest.approx(f1_score(labels, preds, average="macro", zero_division=0), rel=REL)
    if num_classes == 2:
        want_auc = roc_auc_score(labels, probs[:, 1])
    else:
        want_auc = roc_auc_score(labels, probs, multi_class="ovr", average="macro")
    assert got["auc"] == pytest.approx(want_auc, rel=REL)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_class_absent_from_labels_and_predictions(seed):
    rng = np.random.default_rng(seed)
    c = 4
    logits, labels = _informative_logits(rng, 60, c, absent=(3,))
    logits[:, 3] -= 20.0  # class 3 is never predicted either
    probs = _softmax(logits)
    preds = probs.argmax(axis=1)
    assert 3 not in labels and 3 not in preds

    got = classification_metrics(logits, labels, c)
    assert got["accuracy"] == pytest.approx(accuracy_score(labels, preds), rel=REL)
    assert got["macro_f1"] == pytest.approx(f1_score(labels, preds, average="macro", zero_division=0), rel=REL)
    assert got["auc"] == pytest.approx(_ovr_auc_over_defined_classes(labels, probs), rel=REL)


def test_mindspore_f1_average_differs_from_sklearn_macro_on_absent_class():
    """Documents why classification.py does not use F1().eval(average=True)."""
    labels = np.array([0, 1, 0, 1, 0])
    probs = np.array([[0.9, 0.1, 0, 0], [0.2, 0.8, 0, 0], [0.6, 0.4, 0, 0], [0.3, 0.7, 0, 0], [0.4, 0.6, 0, 0]])
    metric = F1()
    metric.update(probs, labels)
    sk = f1_score(labels, probs.argmax(axis=1), average="macro", zero_division=0)
    assert metric.eval(average=True) == pytest.approx(sk / 2)  # two empty classes counted as 0
    assert classification_metrics(probs, labels, 4)["macro_f1"] == pytest.approx(sk, rel=REL)


def test_class_predicted_but_absent_from_labels_counts_in_macro_f1():
    labels = np.array([0, 0, 1, 1])
    probs = np.array([[0.8, 0.1, 0.1], [0.1, 0.1, 0.8], [0.1, 0.8, 0.1], [0.1, 0.8, 0.1]])
    preds = probs.argmax(axis=1)
    got = classification_metrics(probs, labels, 3)
    assert got["macro_f1"] == pytest.approx(f1_score(labels, preds, average="macro", zero_division=0), rel=REL)
    # class 2 has no positives: left out of the OvR mean
    assert got["auc"] == pytest.approx(_ovr_auc_over_defined_classes(labels, probs), rel=REL)


@pytest.mark.parametrize("seed", [0, 1])
def test_tied_scores_match_sklearn(seed):
    rng = np.random.default_rng(seed)
    probs = _softmax(rng.normal(size=(100, 3)))
    probs = np.round(probs, 1)
    probs /= probs.sum(axis=1, keepdims=True)
    labels = rng.integers(0, 3, size=100)
    got = classification_metrics(probs, labels, 3, scores_kind="probabilities")
    assert got["auc"] == pytest.approx(roc_auc_score(labels, probs, multi_class="ovr"), rel=REL)


def test_large_logits_are_stable():
    logits = np.array([[1000.0, 0.0], [0.0, 1000.0], [999.0, 1000.0], [1000.0, 999.0]])
    labels = np.array([0, 1, 1, 0])
    got = classification_metrics(logits, labels, 2)
    assert got == {"accuracy": 1.0, "macro_f1": 1.0, "auc": 1.0}


def test_single_class_labels_give_nan_auc():
    rng = np.random.default_rng(0)
    for c in (2, 3):
        got = classification_metrics(rng.normal(size=(10, c)), np.zeros(10, dtype=int), c)
        assert np.isnan(got["auc"])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert np.isnan(roc_auc_score(np.zeros(10, dtype=int), rng.random(10)))


def test_bad_inputs_say_what_to_fix():
    with pytest.raises(ValueError, match=r"shape \(N, 3\)"):
        classification_metrics(np.zeros((4, 2)), np.zeros(4, dtype=int), 3)
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 2\)"):
        classification_metrics(np.zeros((2, 2)), np.array([0, 2]), 2)
    with pytest.raises(ValueError, match="non-finite"):
        classification_metrics(np.array([[np.nan, 0.0], [0.0, 1.0]]), np.array([0, 1]), 2)


def test_fp16_probabilities_are_not_softmaxed_again():
    rng = np.random.default_rng(5)
    logits, labels = _informative_logits(rng, 80, 4)
    probs16 = _softmax(logits).astype(np.float16)  # rows sum to 1 only to ~1e-3
    probs = probs16.astype(np.float64)
    got = classification_metrics(probs16, labels, 4)
    want = _ovr_auc_over_defined_classes(labels, probs)  # on the given probabilities as they are
    assert got["auc"] == pytest.approx(want, rel=REL)
