"""Sampled-output quality for language models, generated in Graph mode with fixed shapes.

The prompts are the first ``prompt_len`` tokens of the first ``prompts``
samples of the fixed validation subset, so they are the same at every
evaluation. Generation runs the network on a fixed (prompts, prompt_len +
new_tokens) buffer and reads the logits at the current position (a gather with
a tensor index), so neither a new token nor a new checkpoint recompiles
anything. No KV cache: for sample-quality probes of a few dozen tokens the
simplicity is worth more than the speed. Two continuations per prompt: greedy,
and seeded top-k/top-p sampling (same seed every evaluation, so differences
between checkpoints come from the weights, not the dice).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mindspore import nn, ops

from evald.metrics.sample_quality import sample_quality_report
from evald.tasks import EvaluationInterrupted, ShouldAbort, never


class NextTokenLogits(nn.Cell):
    def __init__(self, network: nn.Cell) -> None:
        super().__init__()
        self.network = network

    def construct(self, tokens, position):
        logits = self.network(tokens)                       # (P, L, V)
        return ops.gather(logits, position, 1).squeeze(1)   # (P, V) at `position`


class SampleGenerator:
    def __init__(self, *, prompts: int = 4, prompt_len: int = 32, new_tokens: int = 32, top_k: int = 8,
                 top_p: float = 0.95, seed: int = 7, samples_in_tensorboard: int = 2) -> None:
        self.num_prompts = prompts
        self.prompt_len = prompt_len
        self.new_tokens = new_tokens
        self.top_k = top_k
        self.top_p = top_p
        self.seed = seed
        self.samples_in_tensorboard = samples_in_tensorboard
        self.cell: NextTokenLogits | None = None
        self.prompts: np.ndarray | None = None

    def prepare(self, network: nn.Cell, dataset: Any, indices: np.ndarray) -> None:
        rows = [np.asarray(dataset[int(i)]).reshape(-1) for i in indices[: self.num_prompts]]
        too_short = [len(r) for r in rows if len(r) < self.prompt_len]
        if too_short:
            raise ValueError(f"generation prompts need {self.prompt_len} tokens but samples have {too_short}; "
                             f"lower --generation-prompt-len")
        self.prompts = np.stack([r[: self.prompt_len] for r in rows]).astype(np.int32)
        self.cell = NextTokenLogits(network)
        self.cell.set_train(False)

    def run(self, should_abort: ShouldAbort = never) -> tuple[dict[str, float], dict[str, str]]:
        import mindspore as ms

        assert self.cell is not None and self.prompts is not None
        metrics: dict[str, float] = {}
        texts: dict[str, str] = {}
        vocab = None
        for mode in ("greedy", "sampled"):
            rng = np.random.default_rng(self.seed)
            count, prompt_len = self.prompts.shape
            buffer = np.zeros((count, prompt_len + self.new_tokens), dtype=np.int32)
            buffer[:, :prompt_len] = self.prompts
            for position in range(prompt_len, prompt_len + self.new_tokens):
                if should_abort():
                    raise EvaluationInterrupted()
                logits = self.cell(ms.Tensor(buffer), ms.Tensor(np.array([position - 1], np.int32)))
                logits = logits.asnumpy().astype(np.float64)
                vocab = logits.shape[-1]
                if not np.isfinite(logits).all():
                    # Non-finite weights: no continuation to judge. The loss already says why.
                    return self._nonfinite_report(), {f"sample/{m}": "(non-finite logits: no sample)"
                                                      for m in ("greedy", "sampled")}
                buffer[:, position] = (logits.argmax(-1) if mode == "greedy"
                                       else [self._sample(row, rng) for row in logits])
            continuations = buffer[:, prompt_len:]
            report = sample_quality_report(list(self.prompts), list(continuations), vocab)
            metrics.update({f"sample/{mode}/{k}": v for k, v in report.items()})
            shown = [self._render(p, c, vocab) for p, c in
                     zip(self.prompts[: self.samples_in_tensorboard], continuations)]
            texts[f"sample/{mode}"] = "\n\n".join(shown)
        return metrics, texts

    @staticmethod
    def _nonfinite_report() -> dict[str, float]:
        keys = sample_quality_report([[0, 1]], [[0, 1]], 2)
        return {f"sample/{mode}/{k}": float("nan") for mode in ("greedy", "sampled") for k in keys}

    def _sample(self, logits: np.ndarray, rng: np.random.Generator) -> int:
        order = np.argsort(-logits)[: max(1, self.top_k)]
        top = logits[order] - logits[order].max()
        probs = np.exp(top) / np.exp(top).sum()
        keep = np.searchsorted(np.cumsum(probs), self.top_p) + 1
        probs = probs[:keep] / probs[:keep].sum()
        return int(order[rng.choice(len(probs), p=probs)])

    @staticmethod
    def _render(prompt: np.ndarray, continuation: np.ndarray, vocab: int | None) -> str:
        if vocab == 256:  # byte-level: show the text
            as_text = lambda t: bytes(int(x) for x in t).decode("utf-8", "replace")  # noqa: E731
            return f"    {as_text(prompt)!r}\n    -> {as_text(continuation)!r}"
        return f"    {prompt.tolist()}\n    -> {continuation.tolist()}"
