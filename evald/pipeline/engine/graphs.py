"""Graphs: the compiled cells of one network, and every run of them counted.

Each cell is one graph per input shape (Graph mode); ``Graphs`` holds a network's cells, records each
(graph, shape) pair that ran (``shapes``: what is compiled), and counts padded tokens and forward passes
(``stats``). Only per-read results, (R,) or (R, k), and one token (or the top k) per row leave the device,
never (B, T, vocab) logits:

- ``ReadLogProbs``: (B, T) tokens and (R, 3) reads of (row, position, token) -> each read's log-probability,
  the argmax at its (row, position) and the top k there;
- ``ForkReads``: a CachedScorer's prefilled cache forked into rows, one chunk run on each, read likewise;
- ``ExtendGreedy``: one ``extend`` call, the argmax at each row's read index and its log-probability;
- ``ExtendTopK``: one ``extend`` call, the top k at each row's read index (serving);
- ``NextTokenLogits``: the full-forward fallback's next token of each row of a fixed buffer.

``prefill`` runs contexts into a new cache in chunks of PREFILL_CHUNK tokens (the shape warm-up compiles).

May import: the engine's requests; the pipeline's tasks (the cached-decoding interface and its cells).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
from mindspore import nn, ops

from evald.pipeline.engine.requests import ScorerStats
from evald.pipeline.tasks.generation import NextTokenLogits, extends_hidden, position_index, splits_head

PREFILL_CHUNK = 256   # tokens per prefill chunk of cached generation (at most the bucket's length)

# One extend-like call: (tokens, start, read, cache) -> (outputs at each row's read index, cache)
Step = Callable[[np.ndarray, np.ndarray, np.ndarray, Any], tuple[tuple[np.ndarray, ...], Any]]


def _read(logits, reads, top_k: int):
    """Per-read results of (R, V) logits, one row per read: the log-probability of the read's token, the argmax,
    and the top k of the log-probabilities."""
    logits = logits.astype(np.float32)
    logp = ops.log_softmax(logits, -1)
    chosen = ops.gather_elements(logp, 1, reads[:, 2:3]).squeeze(1)     # (R,)
    greedy = ops.argmax(logits, -1)                                      # (R,)
    if top_k > 0:
        values, ids = ops.topk(logp, top_k)                              # (R, k)
        return chosen, greedy, values, ids
    return chosen, greedy


def _read_all(logits, reads, top_k: int):
    """Per-read results of (B, T, V) logits (the head at every position): gathered after the head."""
    logits = logits.astype(np.float32)
    logp = ops.log_softmax(logits, -1)
    where = reads[:, :2]
    chosen = ops.gather_nd(logp, reads)                          # (R,)
    greedy = ops.gather_nd(ops.argmax(logits, -1), where)        # (R,)
    if top_k > 0:
        values, ids = ops.topk(logp, top_k)                      # (B, T, k)
        return chosen, greedy, ops.gather_nd(values, where), ops.gather_nd(ids, where)
    return chosen, greedy


class ReadLogProbs(nn.Cell):
    """(B, T) tokens and (R, 3) reads of (row, position, token) -> each read's log-probability, the
    argmax at its (row, position), and the top k there; all on the device, only (R,)/(R, k) come back.
    For a network that splits its head (``HeadSplit``) the head, log_softmax and argmax run at the R read
    positions only (the hidden states gathered first); any other network runs its full forward."""

    def __init__(self, network: nn.Cell, top_k: int = 0) -> None:
        super().__init__()
        self.network = network
        self.top_k = top_k
        self.split = splits_head(network)

    def construct(self, tokens, reads):
        if self.split:
            hidden = ops.gather_nd(self.network.hidden_states(tokens), reads[:, :2])   # (R, d)
            return _read(self.network.apply_head(hidden), reads, self.top_k)
        return _read_all(self.network(tokens), reads, self.top_k)


class ExtendGreedy(nn.Cell):
    """One ``CachedDecoder.extend`` call as a graph: the argmax at each row's ``read`` index, its log-probability
    (float32, as ReadLogProbs computes it: what the cached path's check compares) and the cache; (B,) each."""

    def __init__(self, network: nn.Cell) -> None:
        super().__init__()
        self.network = network

    def construct(self, tokens, start, read, cache):
        logits, cache = self.network.extend(tokens, start, read, cache)
        logp = ops.log_softmax(logits.astype(np.float32), -1)        # (B, V)
        return ops.argmax(logp, -1), ops.amax(logp, -1), cache


class ExtendTopK(nn.Cell):
    """One ``CachedDecoder.extend`` call as a graph returning the top k log-probabilities (float32, as
    ReadLogProbs computes them) at each row's ``read`` index, their ids and the cache; only (B, k) leaves
    the device, never (B, vocab)."""

    def __init__(self, network: nn.Cell, top_k: int) -> None:
        super().__init__()
        self.network = network
        self.top_k = top_k

    def construct(self, tokens, start, read, cache):
        logits, cache = self.network.extend(tokens, start, read, cache)
        values, ids = ops.topk(ops.log_softmax(logits.astype(np.float32), -1), self.top_k)
        return values, ids, cache


class ForkReads(nn.Cell):
    """A CachedScorer's prefilled cache forked into rows (``cache_rows``), one chunk of continuation tokens run on
    each (``extend_all``), and the (R, 3) reads of (row, chunk index, token) gathered on the device as
    ReadLogProbs gathers them: each read's log-probability, the argmax there and the top k. The forked cache
    stays on the device and is dropped. With ``extend_hidden`` (HeadSplit) the head runs at the reads only."""

    def __init__(self, network: nn.Cell, top_k: int = 0) -> None:
        super().__init__()
        self.network = network
        self.top_k = top_k
        self.split = extends_hidden(network)

    def construct(self, cache, rows, tokens, start, reads):
        forked = self.network.cache_rows(cache, rows)
        if self.split:
            hidden, _ = self.network.extend_hidden(tokens, start, forked)
            return _read(self.network.apply_head(ops.gather_nd(hidden, reads[:, :2])), reads, self.top_k)
        logits, _ = self.network.extend_all(tokens, start, forked)
        return _read_all(logits, reads, self.top_k)


class Graphs:
    """The cells of ``network`` (the cached ones only for a CachedDecoder, the fork only for a CachedScorer)
    and their runs: ``shapes`` holds each (graph, shape) that ran, ``stats`` counts tokens and passes."""

    def __init__(self, network: nn.Cell, top_k: int, cached: bool, forks: bool) -> None:
        self.network = network
        self.score_cell = ReadLogProbs(network, top_k)
        self.next_cell = NextTokenLogits(network, greedy=True)
        self.extend_cell = ExtendGreedy(network) if cached else None
        self.top_cell = ExtendTopK(network, top_k) if cached and top_k > 0 else None
        self.fork_cell = ForkReads(network, top_k) if forks else None
        for cell in (self.score_cell, self.next_cell, self.extend_cell, self.top_cell, self.fork_cell):
            if cell is not None:
                cell.set_train(False)
        self.shapes: set[tuple[Any, ...]] = set()
        self.fork_ready: set[int] = set()   # buckets whose fork graph is compiled
        self.stats = ScorerStats()

    def _ran(self, key: tuple[Any, ...], tokens: np.ndarray) -> None:
        self.shapes.add(key)
        self.stats.padded_tokens += tokens.size
        self.stats.forward_passes += 1

    def score(self, inputs: np.ndarray, reads: np.ndarray) -> list[np.ndarray]:
        import mindspore as ms

        self._ran(("score",) + inputs.shape + reads.shape[:1], inputs)   # (rows, length, reads): a graph each
        return [t.asnumpy() for t in self.score_cell(ms.Tensor(inputs), ms.Tensor(reads))]

    def fork(self, cache: Any, rows: np.ndarray, tokens: np.ndarray, start: np.ndarray,
             reads: np.ndarray) -> list[np.ndarray]:
        import mindspore as ms

        assert self.fork_cell is not None
        self._ran(("fork",) + tokens.shape + tuple(cache.shape), tokens)
        return [t.asnumpy() for t in self.fork_cell(cache, ms.Tensor(rows), ms.Tensor(tokens), ms.Tensor(start),
                                                    ms.Tensor(reads))]

    def extend(self, tokens: np.ndarray, start: np.ndarray, read: np.ndarray,
               cache: Any) -> tuple[tuple[np.ndarray, np.ndarray], Any]:
        """((argmax, its log-probability) at each row's read index, cache)."""
        import mindspore as ms

        assert self.extend_cell is not None
        self._ran(("extend",) + tokens.shape + tuple(cache.shape), tokens)
        best, logp, cache = self.extend_cell(ms.Tensor(tokens), ms.Tensor(start), ms.Tensor(read), cache)
        return (best.asnumpy(), logp.asnumpy()), cache

    def extend_top(self, tokens: np.ndarray, start: np.ndarray, read: np.ndarray,
                   cache: Any) -> tuple[tuple[np.ndarray, np.ndarray], Any]:
        import mindspore as ms

        assert self.top_cell is not None
        self._ran(("top-extend",) + tokens.shape + tuple(cache.shape), tokens)
        values, ids, cache = self.top_cell(ms.Tensor(tokens), ms.Tensor(start), ms.Tensor(read), cache)
        return (values.asnumpy(), ids.asnumpy()), cache

    def next_tokens(self, buffer: np.ndarray, positions: np.ndarray) -> np.ndarray:
        import mindspore as ms

        self._ran(("next",) + buffer.shape, buffer)
        return self.next_cell(ms.Tensor(buffer), ms.Tensor(position_index(positions))).asnumpy()

    def prefill(self, contexts: Sequence[Sequence[int]], batch: int, n: int,
                step: Step) -> tuple[tuple[np.ndarray, ...], Any]:
        """``contexts`` (at most ``batch``) into a new cache of n positions, in chunks of PREFILL_CHUNK tokens
        (at most n); ``step``'s outputs for each row at its context's last token, and the cache."""
        chunk = min(n, PREFILL_CHUNK)
        lengths = np.ones(batch, np.int32)
        lengths[:len(contexts)] = [len(c) for c in contexts]
        cache = self.network.init_cache(batch, n)
        got: list[np.ndarray] = []
        for begin in range(0, int(lengths.max()), chunk):
            tokens = np.zeros((batch, chunk), np.int32)
            for r, context in enumerate(contexts):
                piece = context[begin:begin + chunk]
                tokens[r, :len(piece)] = piece
            read = np.clip(lengths - 1 - begin, 0, chunk - 1).astype(np.int32)
            out, cache = step(tokens, np.full(batch, begin, np.int32), read, cache)
            here = (lengths - 1 >= begin) & (lengths - 1 < begin + chunk)
            got = got or [np.zeros_like(o) for o in out]
            for kept, o in zip(got, out):
                kept[here] = o[here]
        return tuple(got), cache
