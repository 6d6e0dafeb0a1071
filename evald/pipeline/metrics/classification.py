"""Accuracy, macro-F1 and ROC-AUC for a classifier's scores, backed by mindspore.train metrics.

evald reports the same numbers a user would get from scikit-learn, so that a
value in evald's dashboard can be checked offline. Where a mindspore.train
metric differs from scikit-learn's definition, the difference is handled here
and explained next to the code.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from mindspore.train import F1, ROC, Accuracy, auc

__all__ = ["classification_metrics", "to_probabilities"]

ScoresKind = Literal["auto", "logits", "probabilities"]


def _stable_softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax; subtracting the row max keeps exp() from overflowing on large logits."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(shifted)
    return e / e.sum(axis=1, keepdims=True)


def _looks_like_probabilities(scores: np.ndarray, atol: float = 1e-3) -> bool:
    # 1e-3 rather than float64 precision: fp16/fp32 softmax outputs sum to 1 only roughly, and
    # softmaxing probabilities a second time would silently change the per-class AUCs.
    return bool(
        np.all(scores >= 0.0)
        and np.all(scores <= 1.0)
        and np.allclose(scores.sum(axis=1), 1.0, rtol=0.0, atol=atol)
    )


def to_probabilities(scores: np.ndarray, kind: ScoresKind = "auto") -> np.ndarray:
    """Turn (N, C) scores into probabilities that sum to 1 per row.

    ROC-AUC one-vs-rest is computed on per-class probability columns (what
    scikit-learn's ``roc_auc_score(multi_class='ovr')`` expects). A per-class
    AUC is *not* invariant to softmax when computed on raw logits, because
    softmax mixes the other classes' logits into each column; so logits must be
    converted first and probabilities must not be softmaxed again.
    ``kind='auto'`` treats scores in [0, 1] whose rows sum to 1 (within 1e-3)
    as probabilities and everything else as logits.
    """
    scores = np.asarray(scores, dtype=np.float64)
    if kind == "probabilities":
        return scores
    if kind == "logits":
        return _stable_softmax(scores)
    if kind == "auto":
        return scores if _looks_like_probabilities(scores) else _stable_softmax(scores)
    raise ValueError(f"scores kind must be 'auto', 'logits' or 'probabilities', got {kind!r}")


def _check_inputs(scores: np.ndarray, labels: np.ndarray, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    if not isinstance(num_classes, (int, np.integer)) or num_classes < 2:
        raise ValueError(f"num_classes must be an integer >= 2, got {num_classes!r}")
    scores = np.asarray(scores, dtype=np.float64)
    labels = np.asarray(labels)
    if scores.ndim != 2 or scores.shape[1] != num_classes:
        raise ValueError(
            f"scores must have shape (N, {num_classes}) (one column per class), got {scores.shape}; "
            "for a single-logit binary model pass np.stack([-z, z], axis=1) / 2 or [1-p, p]"
        )
    if labels.ndim != 1 or labels.shape[0] != scores.shape[0]:
        raise ValueError(
            f"labels must have shape ({scores.shape[0]},) to match scores {scores.shape}, got {labels.shape}; "
            "pass class indices, not one-hot rows"
        )
    if scores.shape[0] == 0:
        raise ValueError("got 0 samples; classification metrics need at least one scored example")
    if not np.all(np.isfinite(scores)):
        raise ValueError(
            f"scores contain {int(np.size(scores) - np.isfinite(scores).sum())} non-finite values; "
            "the model produced NaN/inf outputs, check the checkpoint before evaluating it"
        )
    if not np.issubdtype(labels.dtype, np.integer):
        if not np.all(labels == np.round(labels)):
            raise ValueError(f"labels must be integer class indices, got non-integer values of dtype {labels.dtype}")
    labels = labels.astype(np.int64)
    if labels.min() < 0 or labels.max() >= num_classes:
        raise ValueError(
            f"labels must lie in [0, {num_classes}), got min {labels.min()} and max {labels.max()}; "
            "check num_classes and the label mapping"
        )
    return scores, labels


def _macro_f1(probs: np.ndarray, labels: np.ndarray, num_classes: int) -> float:
    """Macro-F1 with scikit-learn's semantics (``f1_score(average='macro', zero_division=0)``).

    mindspore.train.F1 computes per-class F1 = 2TP / (2TP + FP + FN) for *all*
    ``num_classes`` columns (a class with TP=FP=FN=0 gets 0, like zero_division=0),
    and ``eval(average=True)`` averages over all of them. scikit-learn averages
    only over the classes that occur in the labels or in the predictions; a class
    absent from both would otherwise drag the mean down with a 0 that says
    nothing about the model. So we take F1's per-class vector and average it over
    the classes present in labels or predictions.
    """
    metric = F1()
    metric.clear()
    metric.update(probs, labels)
    per_class = np.asarray(metric.eval(average=False), dtype=np.float64)
    preds = probs.argmax(axis=1)
    present = np.union1d(np.unique(labels), np.unique(preds))
    return float(per_class[present].mean())


def _binary_auc(class_scores: np.ndarray, labels: np.ndarray, pos_label: int) -> float:
    """AUC of one class's scores against "label == pos_label", via mindspore.train.ROC + auc.

    Returns nan when the labels hold only positives or only negatives, where
    ROC-AUC is undefined (mindspore's ROC raises; scikit-learn warns and returns nan).
    """
    positives = labels == pos_label
    if positives.all() or not positives.any():
        return float("nan")
    roc = ROC(class_num=1, pos_label=int(pos_label))
    roc.clear()
    roc.update(class_scores, labels)
    fpr, tpr, _ = roc.eval()
    return float(auc(fpr, tpr))


def classification_metrics(
    scores: np.ndarray,
    labels: np.ndarray,
    num_classes: int,
    *,
    scores_kind: ScoresKind = "auto",
) -> dict[str, float]:
    """Accuracy, macro-F1 and ROC-AUC of (N, C) scores against (N,) integer labels.

    - ``accuracy``: mindspore.train.Accuracy('classification') on argmax(scores).
    - ``macro_f1``: mean of mindspore.train.F1 per-class scores over the classes
      present in labels or predictions (scikit-learn ``average='macro'``, ``zero_division=0``).
    - ``auc``: binary (C == 2): AUC of the class-1 probability; multi-class: macro
      one-vs-rest AUC, each class's AUC from mindspore.train.ROC + auc on its
      probability column. Classes with no positives or no negatives in ``labels``
      are left out of the mean; if none remain, ``auc`` is nan.

    ``scores`` may be logits or probabilities (see :func:`to_probabilities`;
    force the interpretation with ``scores_kind``).
    """
    scores, labels = _check_inputs(scores, labels, num_classes)
    probs = to_probabilities(scores, scores_kind)

    accuracy = Accuracy("classification")
    accuracy.clear()
    accuracy.update(probs, labels)

    if num_classes == 2:
        auc_value = _binary_auc(probs[:, 1], labels, pos_label=1)
    else:
        # mindspore.train.ROC(class_num=C) on the full (N, C) matrix raises as soon as
        # one class has no positives or no negatives, so run it per class and skip those.
        per_class = [_binary_auc(probs[:, c], labels, pos_label=c) for c in range(num_classes)]
        defined = [a for a in per_class if not np.isnan(a)]
        auc_value = float(np.mean(defined)) if defined else float("nan")

    return {
        "accuracy": float(accuracy.eval()),
        "macro_f1": _macro_f1(probs, labels, num_classes),
        "auc": auc_value,
    }
