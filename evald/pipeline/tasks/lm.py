"""Language-model evaluation: token-weighted loss, perplexity and next-token accuracy.

The Graph-mode cell returns per-token negative log-likelihood and correctness
(B, T), never the (B, T, vocab) logits: at LLM vocabulary sizes moving logits
to the host would cost more than the forward pass. That is also why the
perplexity here is exp(mean NLL) computed from those sums in float64 rather
than ``mindspore.train.Perplexity``, which needs the full probability tensor.
Validation items are windows of T+1 token ids: inputs ``w[:-1]``, targets ``w[1:]``.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
from mindspore import nn, ops

from evald.pipeline.metrics.uncertainty import lm_standard_errors
from evald.pipeline.subset import Batch
from evald.pipeline.tasks.base import DataShapeError, EvaluationInterrupted, ShouldAbort, describe_item, never


class LMEvalCell(nn.Cell):
    def __init__(self, network: nn.Cell) -> None:
        super().__init__()
        self.network = network

    def construct(self, window):
        inputs = window[:, :-1]
        targets = window[:, 1:]
        logits = self.network(inputs)
        log_probs = ops.log_softmax(logits, -1)
        nll = -ops.gather_elements(log_probs, -1, targets.expand_dims(-1)).squeeze(-1)
        correct = ops.equal(ops.argmax(logits, -1), targets).astype(nll.dtype)
        return nll, correct


class LanguageModelTask:
    name = "lm"

    def __init__(self, plugins: Sequence[Any] = (), generation: Any = None) -> None:
        self.plugins = list(plugins)
        self.generation = generation

    METRICS = ("eval/loss", "eval/perplexity", "eval/accuracy")

    def build_cell(self, network: nn.Cell) -> nn.Cell:
        return LMEvalCell(network)

    @staticmethod
    def check_item(item: Any) -> None:
        """Each item must be ONE row of T+1 integer token ids (inputs w[:-1], targets w[1:])."""
        if isinstance(item, (tuple, list)) and len(item) == 1:
            item = item[0]
        array = None if isinstance(item, (tuple, list, dict)) else np.asarray(item)
        if array is None or array.ndim != 1 or array.shape[0] < 2 or not np.issubdtype(array.dtype, np.integer):
            hint = (" (that looks like (inputs, labels) pairs: return windows of T+1 ids, w[:-1] being the "
                    "inputs and w[1:] the targets, or use --task classification)"
                    if isinstance(item, (tuple, list)) and len(item) == 2 else "")
            raise DataShapeError(f"the lm task expects each validation item to be one row of T+1 integer token "
                                 f"ids; got {describe_item(item)}{hint}")

    def evaluate(self, cell: nn.Cell, batches: Sequence[Batch], should_abort: ShouldAbort = never
                 ) -> dict[str, float]:
        return self.metrics(self.outputs(cell, batches, should_abort))

    def outputs(self, cell: nn.Cell, batches: Sequence[Batch], should_abort: ShouldAbort = never
                ) -> dict[str, np.ndarray]:
        """Per real sample, in subset order: summed NLL, correct next tokens, and tokens (float64).

        Metrics are computed from these alone (``metrics``), so the samples may be evaluated
        in parts, on several devices, and put together before the metrics are computed.
        """
        import mindspore as ms

        nll_rows, correct_rows, token_rows = [], [], []
        for plugin in self.plugins:
            plugin.metric.clear()
        for batch in batches:
            if should_abort():
                raise EvaluationInterrupted()
            (window,) = batch.arrays
            nll, correct = cell(ms.Tensor(window.astype(np.int32)))
            nll = nll.asnumpy().astype(np.float64)
            correct = correct.asnumpy().astype(np.float64)
            real = batch.weights > 0
            nll_rows.append(nll[real].sum(axis=1))
            correct_rows.append(correct[real].sum(axis=1))
            token_rows.append(np.full(int(real.sum()), float(nll.shape[1])))
            for plugin in self.plugins:
                plugin.metric.update(nll[real], correct[real])
        return {"nll": np.concatenate(nll_rows), "correct": np.concatenate(correct_rows),
                "tokens": np.concatenate(token_rows)}

    def metrics(self, outputs: dict[str, np.ndarray]) -> dict[str, float]:
        """Token-weighted loss, perplexity and next-token accuracy over the subset, with their standard errors."""
        token_count = float(outputs["tokens"].sum())
        loss = float(outputs["nll"].sum()) / token_count
        metrics = {
            "eval/loss": loss,
            "eval/perplexity": math.exp(min(loss, 700.0)),
            "eval/accuracy": float(outputs["correct"].sum()) / token_count,
        }
        metrics.update(lm_standard_errors(outputs["nll"], outputs["correct"], outputs["tokens"]))
        for plugin in self.plugins:
            metrics[f"eval/{plugin.name}"] = float(plugin.metric.eval())
        return metrics
