"""Token log-probabilities and greedy generation on the compiled network, in fixed shape buckets.

``TokenScorer`` is what benchmarks (evald.pipeline.suites.lm_adapter, lm-eval's ``loglikelihood``,
``loglikelihood_rolling`` and ``generate_until``) and an HTTP endpoint (``echo`` / ``logprobs``) run
on the network that hot swaps feed. Graph mode compiles a graph for every new input shape, so
every call runs in one of a small, fixed set of (batch, length) buckets, and a hot swap (which only
writes parameters) never compiles anything.

API
---
``scorer = TokenScorer(network, max_length=None, batch_size=8, lengths=None, top_k=0)``
    ``network`` maps int32 tokens (B, T) to logits (B, T, vocab) for any T <= max_length.
    ``max_length`` defaults to the network's ``max_length`` / ``seq_length`` / ``seq_len`` /
    ``max_position_embeddings`` attribute (or its ``config``'s). ``lengths`` are the bucket lengths
    (default: max_length/4, /2 and max_length); every bucket has ``batch_size`` rows. ``top_k`` > 0
    also returns the k most likely tokens at each position (one graph for every k up to it).
``scorer.score([ScoreRequest(context, continuation), ...]) -> [TokenScores, ...]``
    Per continuation token: its log-probability given everything before it, whether it is the
    argmax (greedy) token, and with ``top_k`` the k best (ids, log-probabilities). Inputs longer than
    ``max_length + 1`` tokens lose context on the left, as lm-eval's HFLM does
    (``(context + continuation)[-(max_length + 1):][:-1]``); ``TokenScores.truncated`` says how many.
    A continuation longer than ``max_length`` is a ValueError.
``scorer.generate([GenerateRequest(context, max_new_tokens, stop), ...], eos_id=None) -> [[int], ...]``
    Greedy continuation of each context on a fixed buffer (one forward pass per new token, no KV
    cache), ending a row at ``eos_id``, at ``max_new_tokens``, when ``stop(generated_ids)`` is true,
    or at the bucket's end. Contexts are left-truncated to ``max_length - max_new_tokens`` (HFLM).
``scorer.warm_up()`` compiles every bucket now (at start-up, not at the first checkpoint);
``scorer.compiled_graphs`` counts the (graph, shape) pairs compiled so far;
``scorer.stats`` counts real and padded tokens run, for throughput.

Padding changes no log-probability: rows are right-padded, the network is causal, a request always
lands in the same bucket (the shortest that fits it), and a row's result does not depend on what
the other rows hold (tests/unit/pipeline/test_scoring.py checks this bit for bit on the demo model).
Only (B, T) or (B, T, k) results leave the device, never (B, T, vocab) logits.

May import: the pipeline's tasks (generation's fixed-buffer cell).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
from mindspore import nn, ops

from evald.pipeline.tasks.generation import NextTokenLogits, position_index

_LENGTH_ATTRIBUTES = ("max_length", "seq_length", "seq_len", "max_position_embeddings", "max_seq_len")


@dataclass(frozen=True)
class ScoreRequest:
    context: Sequence[int]
    continuation: Sequence[int]


@dataclass(frozen=True)
class TokenScores:
    logprobs: np.ndarray                 # (n,) float32: log p(continuation[i] | everything before it)
    greedy: np.ndarray                   # (n,) bool: continuation[i] is the argmax token
    top_ids: np.ndarray | None = None    # (n, k) int: the k most likely tokens, best first (top_k > 0)
    top_logprobs: np.ndarray | None = None   # (n, k) float32
    truncated: int = 0                   # context tokens dropped on the left to fit max_length

    @property
    def total(self) -> float:
        return float(np.sum(self.logprobs, dtype=np.float64))

    @property
    def is_greedy(self) -> bool:
        return bool(np.all(self.greedy))


@dataclass(frozen=True)
class GenerateRequest:
    context: Sequence[int]
    max_new_tokens: int
    stop: Callable[[list[int]], bool] | None = None   # called with the ids generated so far


@dataclass
class ScorerStats:
    real_tokens: int = 0        # tokens of requests run through the network
    padded_tokens: int = 0      # every position run, padding included
    forward_passes: int = 0


class TokenLogProbs(nn.Cell):
    """(B, T) tokens and targets -> the targets' log-probabilities, the argmax, and the top k, on device."""

    def __init__(self, network: nn.Cell, top_k: int = 0) -> None:
        super().__init__()
        self.network = network
        self.top_k = top_k

    def construct(self, tokens, targets):
        logits = self.network(tokens).astype(np.float32)             # (B, T, V)
        logp = ops.log_softmax(logits, -1)
        chosen = ops.gather_elements(logp, 2, targets.expand_dims(-1)).squeeze(-1)   # (B, T)
        greedy = ops.argmax(logits, -1)                              # (B, T)
        if self.top_k > 0:
            values, ids = ops.topk(logp, self.top_k)                 # (B, T, k)
            return chosen, greedy, values, ids
        return chosen, greedy


def model_max_length(network: Any) -> int | None:
    """The longest input ``network`` accepts, from its (or its config's) usual attribute names."""
    for holder in (network, getattr(network, "config", None)):
        for name in _LENGTH_ATTRIBUTES:
            value = getattr(holder, name, None) if holder is not None else None
            if isinstance(value, int) and value > 0:
                return value
    return None


class TokenScorer:
    def __init__(self, network: nn.Cell, *, max_length: int | None = None, batch_size: int = 8,
                 lengths: Sequence[int] | None = None, top_k: int = 0) -> None:
        max_length = max_length or model_max_length(network)
        if not max_length:
            raise ValueError(f"cannot tell the longest input of {type(network).__name__}: give max_length "
                             f"(the suite's max_length), or set one of {', '.join(_LENGTH_ATTRIBUTES)} on it")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if lengths is None:
            lengths = {max(1, max_length // 4), max(1, max_length // 2), max_length}
        lengths = tuple(sorted(set(int(n) for n in lengths)))
        if not lengths or lengths[0] < 1 or lengths[-1] != max_length:
            raise ValueError(f"bucket lengths {lengths} must be positive and end at max_length {max_length}")
        self.network, self.max_length, self.batch_size, self.lengths = network, max_length, batch_size, lengths
        self.top_k = top_k
        self._score_cell = TokenLogProbs(network, top_k)
        self._next_cell = NextTokenLogits(network, greedy=True)
        for cell in (self._score_cell, self._next_cell):
            cell.set_train(False)
        self._shapes: set[tuple[str, int, int]] = set()
        self.stats = ScorerStats()

    @property
    def buckets(self) -> tuple[tuple[int, int], ...]:
        return tuple((self.batch_size, n) for n in self.lengths)

    @property
    def compiled_graphs(self) -> int:
        return len(self._shapes)

    def bucket_for(self, length: int) -> int:
        for n in self.lengths:
            if length <= n:
                return n
        raise ValueError(f"{length} tokens do not fit max_length {self.max_length}")

    def vocab_size(self) -> int:
        """The model's vocabulary: the last dimension of its logits, on one batch of the smallest bucket
        (one more graph, once; the logits of that one batch come to the host)."""
        import mindspore as ms

        zeros = np.zeros((self.batch_size, self.lengths[0]), np.int32)
        return int(self.network(ms.Tensor(zeros)).shape[-1])

    def warm_up(self, generate: bool = True) -> int:
        """Compile every bucket's graphs now; the number compiled so far."""
        for n in self.lengths:
            zeros = np.zeros((self.batch_size, n), np.int32)
            self._score_batch(zeros, zeros)
            if generate:
                self._next_tokens(zeros, np.zeros(self.batch_size, np.int32))
        return self.compiled_graphs

    # -- log-probabilities ---------------------------------------------------------------------
    def score(self, requests: Sequence[ScoreRequest]) -> list[TokenScores]:
        rows = [self._row(r) for r in requests]
        results: list[TokenScores | None] = [None] * len(rows)
        by_bucket: dict[int, list[int]] = {}
        for i, (tokens, _, _) in enumerate(rows):
            by_bucket.setdefault(self.bucket_for(len(tokens)), []).append(i)
        for n, members in sorted(by_bucket.items()):
            for start in range(0, len(members), self.batch_size):
                chunk = members[start:start + self.batch_size]
                inputs = np.zeros((self.batch_size, n), np.int32)
                targets = np.zeros((self.batch_size, n), np.int32)
                for r, i in enumerate(chunk):
                    tokens, target, _ = rows[i]
                    inputs[r, :len(tokens)], targets[r, :len(target)] = tokens, target
                out = self._score_batch(inputs, targets)
                for r, i in enumerate(chunk):
                    tokens, target, truncated = rows[i]
                    count = len(requests[i].continuation)
                    span = slice(len(tokens) - count, len(tokens))
                    top_ids = top_lp = None
                    if self.top_k > 0:
                        top_lp, top_ids = out[2][r, span].copy(), out[3][r, span].astype(np.int64)
                    results[i] = TokenScores(out[0][r, span].copy(), out[1][r, span] == target[span],
                                             top_ids, top_lp, truncated)
                self.stats.real_tokens += sum(len(rows[i][0]) for i in chunk)
        return results  # type: ignore[return-value]

    def _row(self, request: ScoreRequest) -> tuple[np.ndarray, np.ndarray, int]:
        context, continuation = list(request.context), list(request.continuation)
        if not continuation:
            raise ValueError("a continuation needs at least one token to score")
        if len(continuation) > self.max_length:
            raise ValueError(f"a continuation of {len(continuation)} tokens does not fit max_length "
                             f"{self.max_length}")
        if not context:
            raise ValueError("a context needs at least one token (lm-eval passes the prefix/EOS token)")
        whole = context + continuation
        kept = whole[-(self.max_length + 1):]
        return (np.asarray(kept[:-1], np.int32), np.asarray(kept[1:], np.int32), len(whole) - len(kept))

    def _score_batch(self, inputs: np.ndarray, targets: np.ndarray) -> list[np.ndarray]:
        import mindspore as ms

        self._shapes.add(("score",) + inputs.shape)
        self.stats.padded_tokens += inputs.size
        self.stats.forward_passes += 1
        return [t.asnumpy() for t in self._score_cell(ms.Tensor(inputs), ms.Tensor(targets))]

    # -- greedy generation ---------------------------------------------------------------------
    def generate(self, requests: Sequence[GenerateRequest], eos_id: int | None = None) -> list[list[int]]:
        prepared = []
        for r in requests:
            new = max(1, min(int(r.max_new_tokens), self.max_length - 1))
            context = list(r.context)[-(self.max_length - new):]
            if not context:
                raise ValueError("generation needs a context of at least one token")
            prepared.append((np.asarray(context, np.int32), new, r.stop))
        results: list[list[int]] = [[] for _ in requests]
        by_bucket: dict[int, list[int]] = {}
        for i, (context, new, _) in enumerate(prepared):
            by_bucket.setdefault(self.bucket_for(min(self.max_length, len(context) + new)), []).append(i)
        for n, members in sorted(by_bucket.items()):
            for start in range(0, len(members), self.batch_size):
                chunk = members[start:start + self.batch_size]
                self._generate_batch(n, [prepared[i] for i in chunk], [results[i] for i in chunk], eos_id)
        return results

    def _generate_batch(self, n: int, rows: list, outputs: list[list[int]], eos_id: int | None) -> None:
        buffer = np.zeros((self.batch_size, n), np.int32)
        positions = np.zeros(self.batch_size, np.int32)   # the last filled position of each row
        active = np.zeros(self.batch_size, bool)
        for r, (context, _, _) in enumerate(rows):
            buffer[r, :len(context)] = context
            positions[r], active[r] = len(context) - 1, True
            self.stats.real_tokens += len(context)
        while active.any():
            chosen = self._next_tokens(buffer, positions)
            for r in np.flatnonzero(active):
                _, limit, stop = rows[r]
                token = int(chosen[r])
                if eos_id is not None and token == eos_id:
                    active[r] = False
                    continue
                outputs[r].append(token)
                positions[r] += 1
                buffer[r, positions[r]] = token
                self.stats.real_tokens += 1
                if len(outputs[r]) >= limit or positions[r] + 1 >= n or (stop is not None and stop(outputs[r])):
                    active[r] = False

    def _next_tokens(self, buffer: np.ndarray, positions: np.ndarray) -> np.ndarray:
        import mindspore as ms

        self._shapes.add(("next",) + buffer.shape)
        self.stats.padded_tokens += buffer.size
        self.stats.forward_passes += 1
        return self._next_cell(ms.Tensor(buffer), ms.Tensor(position_index(positions))).asnumpy()
