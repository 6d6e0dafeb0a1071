"""Classification evaluation: loss, accuracy, macro-F1 and AUC on the fixed subset.

Validation items are ``(features, label)``. The Graph-mode cell returns logits
(B, C); the metrics come from evald.pipeline.metrics.classification (backed by
``mindspore.train`` metrics, checked against scikit-learn in the tests).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from mindspore import nn

from evald.pipeline.subset import Batch
from evald.pipeline.tasks.base import DataShapeError, EvaluationInterrupted, ShouldAbort, describe_item, never


class ClassifierEvalCell(nn.Cell):
    def __init__(self, network: nn.Cell) -> None:
        super().__init__()
        self.network = network

    def construct(self, features):
        return self.network(features)


class ClassificationTask:
    name = "classification"

    def __init__(self, plugins: Sequence[Any] = (), generation: Any = None) -> None:
        self.plugins = list(plugins)

    METRICS = ("eval/loss", "eval/accuracy", "eval/macro_f1", "eval/auc")

    def build_cell(self, network: nn.Cell) -> nn.Cell:
        return ClassifierEvalCell(network)

    @staticmethod
    def check_item(item: Any) -> None:
        """Each item must be a (features, integer label) pair."""
        ok = isinstance(item, (tuple, list)) and len(item) == 2
        if ok:
            label = np.asarray(item[1])
            ok = label.ndim == 0 and np.issubdtype(label.dtype, np.integer)
        if not ok:
            raise DataShapeError(f"the classification task expects each validation item to be a (features, "
                                 f"integer label) pair; got {describe_item(item)}")

    def evaluate(self, cell: nn.Cell, batches: Sequence[Batch], should_abort: ShouldAbort = never
                 ) -> dict[str, float]:
        return self.metrics(self.outputs(cell, batches, should_abort))

    def outputs(self, cell: nn.Cell, batches: Sequence[Batch], should_abort: ShouldAbort = never
                ) -> dict[str, np.ndarray]:
        """Per real sample, in subset order: the logits (float64) and the label."""
        import mindspore as ms

        all_logits, all_labels = [], []
        for plugin in self.plugins:
            plugin.metric.clear()
        for batch in batches:
            if should_abort():
                raise EvaluationInterrupted()
            features, labels = batch.arrays[0], batch.arrays[1]
            logits = cell(ms.Tensor(features)).asnumpy().astype(np.float64)
            real = batch.weights > 0
            all_logits.append(logits[real])
            all_labels.append(labels[real].astype(np.int64))
            for plugin in self.plugins:
                plugin.metric.update(logits[real], labels[real])
        return {"logits": np.concatenate(all_logits), "labels": np.concatenate(all_labels)}

    def metrics(self, outputs: dict[str, np.ndarray]) -> dict[str, float]:
        """Log-loss, accuracy, macro-F1 and AUC over the subset (evald.pipeline.metrics.classification), with their
        standard errors (evald.pipeline.metrics.uncertainty)."""
        from evald.pipeline.metrics.classification import classification_metrics, to_probabilities
        from evald.pipeline.metrics.uncertainty import classification_standard_errors

        logits, labels = outputs["logits"], outputs["labels"]
        shifted = logits - logits.max(axis=1, keepdims=True)
        log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        sample_nll = -log_probs[np.arange(len(labels)), labels]
        metrics = {"eval/loss": float(sample_nll.mean())}
        for key, value in classification_metrics(logits, labels, logits.shape[1]).items():
            metrics[f"eval/{key}"] = float(value)
        metrics.update(classification_standard_errors(to_probabilities(logits), labels, sample_nll))
        for plugin in self.plugins:
            metrics[f"eval/{plugin.name}"] = float(plugin.metric.eval())
        return metrics
