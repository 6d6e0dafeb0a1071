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

from evald.subset import Batch


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

    def build_cell(self, network: nn.Cell) -> nn.Cell:
        return LMEvalCell(network)

    def evaluate(self, cell: nn.Cell, batches: Sequence[Batch]) -> dict[str, float]:
        import mindspore as ms

        nll_sum = correct_sum = token_count = 0.0
        for plugin in self.plugins:
            plugin.metric.clear()
        for batch in batches:
            (window,) = batch.arrays
            nll, correct = cell(ms.Tensor(window.astype(np.int32)))
            nll = nll.asnumpy().astype(np.float64)
            correct = correct.asnumpy().astype(np.float64)
            weights = batch.weights[:, None]
            nll_sum += float((nll * weights).sum())
            correct_sum += float((correct * weights).sum())
            token_count += float(weights.sum() * nll.shape[1])
            real = batch.weights > 0
            for plugin in self.plugins:
                plugin.metric.update(nll[real], correct[real])
        loss = nll_sum / token_count
        metrics = {
            "eval/loss": loss,
            "eval/perplexity": math.exp(min(loss, 700.0)),
            "eval/accuracy": correct_sum / token_count,
        }
        for plugin in self.plugins:
            metrics[f"eval/{plugin.name}"] = float(plugin.metric.eval())
        return metrics
