"""Sampled-output quality for language models, generated in Graph mode with fixed shapes.

The prompts are the first ``prompt_len`` tokens of the first ``prompts``
samples of the fixed validation subset, so they are the same at every
evaluation. A network that implements ``CachedDecoder`` (below) is prefilled
once with the prompts into a static cache of prompt_len + new_tokens positions
and then decodes one token per row per step; any other network runs on a fixed
(prompts, prompt_len + new_tokens) buffer, a full forward per new token, reading
the logits at the current position (a gather with a tensor index). Both have
fixed shapes, so neither a new token nor a new checkpoint recompiles anything.
Two continuations per prompt: greedy,
and seeded top-k/top-p sampling (same seed every evaluation, one generator per
prompt, so differences between checkpoints come from the weights, not the dice,
and a prompt's sample does not depend on which eval rank continued it).
"""

from __future__ import annotations

import logging
from typing import Any, Protocol, runtime_checkable

import numpy as np
from mindspore import nn, ops

from evald.pipeline.metrics.sample_quality import sample_quality_report
from evald.pipeline.tasks.base import EvaluationInterrupted, ShouldAbort, never


log = logging.getLogger("evald.pipeline.tasks.generation")


@runtime_checkable
class CachedDecoder(Protocol):
    """The optional interface of a network that decodes incrementally (a static key/value cache).

    ``init_cache(batch, capacity)`` returns the cache of ``batch`` rows for ``capacity`` positions
    (one tensor, any layout the network likes; zeros are fine). ``extend(tokens, start, read, cache)``
    takes (B, c) int32 ``tokens`` that sit at positions ``start[b] .. start[b] + c - 1`` of row ``b``
    (``start``: (B,) int32), writes their keys and values into ``cache``, attends each token to the
    cache's positions up to its own, and returns ``(logits, cache)``: the (B, vocab) logits at chunk
    index ``read[b]`` of each row (the head runs at that position only) and the updated cache.
    Positions past ``capacity - 1`` (padding) must be clamped to it, never raise. A prefill is one or
    more chunks of c tokens; a decode step is c = 1. Shapes are static per (B, c, capacity), so Graph
    mode compiles one graph per chunk size and capacity. The logits must be those of the network's
    full forward at the same positions (up to float rounding): evald checks its greedy tokens against
    the full-forward path in tests. Reference: examples/tiny_lm/model.py, examples/llm_decoder/model.py.
    """

    def init_cache(self, batch: int, capacity: int) -> Any: ...

    def extend(self, tokens: Any, start: Any, read: Any, cache: Any) -> tuple[Any, Any]: ...


@runtime_checkable
class CachedScorer(CachedDecoder, Protocol):
    """A CachedDecoder that also scores a chunk at every position, so that continuations that share a context
    but diverge after it run the context once (evald.pipeline.engine forks one prefilled cache).

    ``extend_all(tokens, start, cache)`` is ``extend`` with the head at every chunk position: it returns the
    (B, c, vocab) logits and the updated cache. ``cache_rows(cache, rows)`` returns a cache of ``len(rows)``
    rows whose row b is ``cache``'s row ``rows[b]`` ((B,) int32; a row may be taken several times), in the
    network's own cache layout. The logits must be those of the full forward at the same positions (up to
    float rounding). Reference: examples/tiny_lm/model.py, examples/llm_decoder/model.py.
    """

    def extend_all(self, tokens: Any, start: Any, cache: Any) -> tuple[Any, Any]: ...

    def cache_rows(self, cache: Any, rows: Any) -> Any: ...


@runtime_checkable
class HeadSplit(Protocol):
    """The optional interface of a network whose forward is a trunk and a per-position head, so that evald runs
    the head (the vocabulary projection, then log_softmax and argmax) only at the positions it reads: one
    position of a 650-token row for a single-token choice, where the full forward runs it at all 650.

    ``hidden_states(tokens)`` maps (B, T) int32 tokens to (B, T, d) hidden states, and ``apply_head(hidden)``
    maps (..., d) hidden states to (..., vocab) logits position by position, so that the forward is
    ``apply_head(hidden_states(tokens))`` (up to float rounding). A CachedScorer that has it may also have
    ``extend_hidden(tokens, start, cache)``: ``extend_all`` before the head ((B, c, d) hidden states and the
    updated cache), so that a fork reads its chunks the same way. Any other network runs its full forward.
    Reference: examples/tiny_lm/model.py, examples/llm_decoder/model.py.
    """

    def hidden_states(self, tokens: Any) -> Any: ...

    def apply_head(self, hidden: Any) -> Any: ...


def splits_head(network: nn.Cell) -> bool:
    """Whether the head can run at the read positions only (``HeadSplit``)."""
    return isinstance(network, HeadSplit)


def extends_hidden(network: nn.Cell) -> bool:
    """Whether a fork can read its chunks before the head (a HeadSplit CachedScorer with ``extend_hidden``)."""
    return splits_head(network) and scores_with_cache(network) and callable(getattr(network, "extend_hidden", None))


def decodes_with_cache(network: nn.Cell) -> bool:
    return isinstance(network, CachedDecoder)


def scores_with_cache(network: nn.Cell) -> bool:
    """Whether continuations after a shared context can fork one prefilled cache (``CachedScorer``)."""
    return isinstance(network, CachedScorer)


class ExtendStep(nn.Cell):
    """One ``CachedDecoder.extend`` call as a graph: (logits (B, V) or with ``greedy`` their argmax (B,), cache)."""

    def __init__(self, network: nn.Cell, greedy: bool = False) -> None:
        super().__init__()
        self.network = network
        self.greedy = greedy

    def construct(self, tokens, start, read, cache):
        logits, cache = self.network.extend(tokens, start, read, cache)
        if self.greedy:
            return ops.argmax(logits, -1), cache
        return logits, cache


class NextTokenLogits(nn.Cell):
    """The logits (B, V) at each row's own position of a fixed (B, L) buffer, or with ``greedy`` their
    argmax (B,), computed on the device; ``index`` is (B, 2) int32 rows of (row, position). A network that
    splits its head (HeadSplit) runs the head at those B positions only.

    Shared by the sample generator and the benchmarks' greedy ``generate_until``
    (evald.pipeline.engine.TokenScorer.generate), so there is one fixed-buffer generation.
    """

    def __init__(self, network: nn.Cell, greedy: bool = False) -> None:
        super().__init__()
        self.network = network
        self.greedy = greedy
        self.split = splits_head(network)   # the head at each row's position only (HeadSplit)

    def construct(self, tokens, index):
        if self.split:
            chosen = self.network.apply_head(ops.gather_nd(self.network.hidden_states(tokens), index))   # (B, V)
        else:
            chosen = ops.gather_nd(self.network(tokens), index)     # (B, L, V) on the device, then (B, V)
        if self.greedy:
            return ops.argmax(chosen, -1)                   # (B,)
        return chosen


def position_index(positions: np.ndarray) -> np.ndarray:
    """The (B, 2) ``index`` of NextTokenLogits for one position per row."""
    positions = np.asarray(positions, np.int32).reshape(-1)
    return np.stack([np.arange(len(positions), dtype=np.int32), positions], axis=1)


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
        self.extend: ExtendStep | None = None       # the cached path, for a network that is a CachedDecoder
        self.network: nn.Cell | None = None
        self.prompts: np.ndarray | None = None      # this rank's buffer rows (padded to the common count)
        self.all_prompts: np.ndarray | None = None  # every prompt, for the report
        self.local_rows = np.zeros(0, int)          # which prompts this rank continues
        self.vocab: int | None = None

    def prepare(self, network: nn.Cell, dataset: Any, indices: np.ndarray, part: tuple[int, int] = (0, 1)) -> None:
        """The prompts; with ``part`` (rank, size), this rank continues only its slice of them."""
        rows = [np.asarray(dataset[int(i)]).reshape(-1) for i in indices[: self.num_prompts]]
        too_short = [len(r) for r in rows if len(r) < self.prompt_len]
        if too_short:
            raise ValueError(f"generation prompts need {self.prompt_len} tokens but samples have {too_short}; "
                             f"lower --generation-prompt-len")
        self.all_prompts = np.stack([r[: self.prompt_len] for r in rows]).astype(np.int32)
        rank, size = part
        chunk = -(-len(self.all_prompts) // size)   # every rank's buffer has this many rows: one compile
        self.local_rows = np.arange(rank * chunk, min(len(self.all_prompts), (rank + 1) * chunk))
        local = self.all_prompts[self.local_rows]
        if 0 < len(local) < chunk:
            local = np.concatenate([local, np.repeat(local[:1], chunk - len(local), axis=0)])
        self.prompts = local
        self.cell = NextTokenLogits(network)
        self.cell.set_train(False)
        self.network = network
        if decodes_with_cache(network):
            self.extend = ExtendStep(network)
            self.extend.set_train(False)
            log.info("sample generation: cached decoding (%s is a CachedDecoder)", type(network).__name__)
        else:
            self.extend = None
            log.info("sample generation: a full forward per new token (%s has no init_cache/extend)",
                     type(network).__name__)

    def layout(self) -> dict[str, tuple[tuple[int, ...], Any]]:
        """The full-size arrays ``outputs`` fills (rows: all prompts), for an eval group's answer."""
        count = len(self.all_prompts)
        return {"greedy": ((count, self.new_tokens), np.dtype(np.int64)),
                "sampled": ((count, self.new_tokens), np.dtype(np.int64)), "finite": ((count,), np.dtype(np.float64))}

    def run(self, should_abort: ShouldAbort = never) -> tuple[dict[str, float], dict[str, str]]:
        return self.report(self.outputs(should_abort))

    def outputs(self, should_abort: ShouldAbort = never) -> dict[str, np.ndarray]:
        """For this rank's prompts: greedy and sampled continuations, and whether the logits stayed finite.

        Each prompt samples with its own generator, seeded by (seed, prompt index), so a prompt's
        continuation does not depend on which rank, or which row of the buffer, continues it.
        """
        import mindspore as ms

        assert self.cell is not None and self.prompts is not None
        count = len(self.local_rows)
        out = {"greedy": np.zeros((count, self.new_tokens), np.int64),
               "sampled": np.zeros((count, self.new_tokens), np.int64), "finite": np.ones(count)}
        if count == 0:
            return out
        for mode in ("greedy", "sampled"):
            rngs = [np.random.default_rng([self.seed, int(i)]) for i in self.local_rows]
            rows, prompt_len = self.prompts.shape
            buffer = np.zeros((rows, prompt_len + self.new_tokens), dtype=np.int32)
            buffer[:, :prompt_len] = self.prompts
            cache = None
            for position in range(prompt_len, prompt_len + self.new_tokens):
                if should_abort():
                    raise EvaluationInterrupted()
                if self.extend is not None:   # prefill the prompts once, then one token per row per step
                    if cache is None:
                        cache = self.network.init_cache(rows, prompt_len + self.new_tokens)
                        tokens, start, read = self.prompts, 0, prompt_len - 1
                    else:
                        tokens, start, read = buffer[:, position - 1:position], position - 1, 0
                    logits, cache = self.extend(ms.Tensor(np.ascontiguousarray(tokens, np.int32)),
                                                ms.Tensor(np.full(rows, start, np.int32)),
                                                ms.Tensor(np.full(rows, read, np.int32)), cache)
                else:
                    index = position_index(np.full(rows, position - 1))
                    logits = self.cell(ms.Tensor(buffer), ms.Tensor(index))
                logits = logits.asnumpy().astype(np.float64)
                self.vocab = logits.shape[-1]
                if not np.isfinite(logits).all():
                    out["finite"][:] = 0.0  # non-finite weights: no continuation to judge
                    return out
                chosen = logits.argmax(-1)
                if mode == "sampled":
                    chosen[:count] = [self._sample(row, rng) for row, rng in zip(logits[:count], rngs)]
                buffer[:, position] = chosen
            out[mode] = buffer[:count, prompt_len:].astype(np.int64)
        return out

    def report(self, outputs: dict[str, np.ndarray]) -> tuple[dict[str, float], dict[str, str]]:
        """Sample-quality metrics and texts over all prompts' continuations."""
        if not outputs["finite"].all():
            # Non-finite weights: no continuation to judge. The loss already says why.
            return self._nonfinite_report(), {f"sample/{m}": "(non-finite logits: no sample)"
                                              for m in ("greedy", "sampled")}
        metrics: dict[str, float] = {}
        texts: dict[str, str] = {}
        for mode in ("greedy", "sampled"):
            continuations = outputs[mode]
            report = sample_quality_report(list(self.all_prompts), list(continuations), self.vocab)
            metrics.update({f"sample/{mode}/{k}": v for k, v in report.items()})
            shown = [self._render(p, c, self.vocab) for p, c in
                     zip(self.all_prompts[: self.samples_in_tensorboard], continuations)]
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
