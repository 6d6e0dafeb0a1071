"""Token log-probabilities and greedy generation on the compiled network, in a fixed set of shapes.

``TokenScorer`` is what benchmarks (evald.pipeline.suites.lm_adapter, lm-eval's ``loglikelihood``,
``loglikelihood_rolling`` and ``generate_until``) and an HTTP endpoint (``echo`` / ``logprobs``) run
on the network that hot swaps feed. Graph mode compiles a graph for every new input shape, so
every call runs in one of a small, fixed set of (rows, length) buckets compiled at start
(``warm_up``), and a hot swap (which only writes parameters) never compiles anything.

API
---
``scorer = TokenScorer(network, max_length=None, batch_size=8, lengths=None, top_k=0, fork_contexts=True,
fork_piece=None)``
    ``network`` maps int32 tokens (B, T) to logits (B, T, vocab) for any T <= max_length.
    ``max_length`` defaults to the network's ``max_length`` / ``seq_length`` / ``seq_len`` /
    ``max_position_embeddings`` attribute (or its ``config``'s). ``lengths`` are the bucket lengths
    (default: ``length_ladder``, a geometric ladder from max_length/8 (at least 32) to max_length in
    steps of sqrt(2), so a row is padded by less than 42%, 17% on average; ``fit_lengths`` may replace it).
    Every forward runs the same token budget, ``batch_size * max_length`` tokens: a bucket of length n has
    ``batch_size * max_length // n`` rows (``rows_for``). ``batch_size="auto"`` sizes that budget to fit
    memory (``auto_budget``).
    ``top_k`` > 0 also returns the k most likely tokens at each position.
``scorer.score([ScoreRequest(context, continuation), ...]) -> [TokenScores, ...]``
    Per continuation token: its log-probability given everything before it, whether it is the
    argmax (greedy) token, and with ``top_k`` the k best (ids, log-probabilities). Inputs longer than
    ``max_length + 1`` tokens lose context on the left, as lm-eval's HFLM does
    (``(context + continuation)[-(max_length + 1):][:-1]``); ``TokenScores.truncated`` says how many.
    A continuation longer than ``max_length`` is a ValueError.
    Shared contexts: a request's input row is ``(context + continuation)[:-1]``; requests whose rows
    are equal, or one a prefix of the other, run as ONE row (the network is causal, so a position's
    logits depend only on the tokens up to it): the single-token choices of a multiple-choice question
    are all read at the last position of one forward over its context. The graph reads the
    requested (row, position, token) log-probabilities on the device (``ReadLogProbs``); rows are
    sorted by length and packed into the shortest bucket that holds them.
    Diverging continuations (multi-token choices, none a prefix of another) after the same context: for a
    network that implements ``CachedScorer`` (evald.pipeline.tasks.generation), the context but its last
    token is prefilled once into a cache, which is forked into one row per choice (``ForkReads``: the
    context's last token and the choice but its last, at most FORK_CHUNK tokens, all read on the device),
    when that runs fewer tokens than a row per choice. ``fork_contexts=False`` turns this off (evald.serve,
    where a completion is one row); ``scorer.forks`` says whether it runs.
``scorer.generate([GenerateRequest(context, max_new_tokens, stop), ...], eos_id=None) -> [[int], ...]``
    Greedy continuation of each context, ending a row at ``eos_id``, at ``max_new_tokens``, when
    ``stop(generated_ids)`` is true, or at the bucket's end. Contexts are left-truncated to
    ``max_length - max_new_tokens`` (HFLM). A network that implements ``CachedDecoder``
    (evald.pipeline.tasks.generation) is prefilled in chunks of ``PREFILL_CHUNK`` tokens into a static
    cache of the bucket's length, then decodes one token per row per step; any other network runs
    a full forward of the bucket per new token (the fallback). ``scorer.decoding`` says which, and
    the log says it once.
``scorer.prefill_top(contexts, capacity)`` / ``scorer.decode_top(tokens, positions, cache)``
    For a CachedDecoder with ``top_k`` > 0 (evald.serve's /v1/completions): up to ``batch_size``
    contexts prefilled into a new cache of a bucket's length, then one token per row per step; each
    returns the next token's top k (ids, float32 log-probabilities, as ``score`` computes them) per row.
``scorer.plan_rows(requests)`` / ``scorer.plan_generate(requests)`` / ``scorer.fit_lengths(row_lengths)``
    The rows a call would run (no forward), and bucket lengths fitted to a suite's rows in place of the ladder
    (``fitted_lengths``: no more buckets, the fewest padded tokens; before any graph compiles). A suite runs
    lm-eval once at build time with ``bucket_plan.PlanningScorer`` to learn its rows.
``scorer.warm_up()`` compiles every bucket now (at start-up, not at the first checkpoint: per bucket the
scoring graph, for a CachedDecoder a prefill chunk and a decode step, for forks a prefill chunk and a fork; with
``top_decoding=True`` also prefill_top's and decode_top's graphs);
``scorer.compiled_graphs`` counts the (graph, shape) pairs compiled so far;
``scorer.stats`` counts requested, real and padded tokens run, for throughput.

Padding changes no log-probability: rows are right-padded, the network is causal, a row always
lands in the same bucket (the shortest that fits it), and a row's result does not depend on what
the other rows hold (tests/unit/pipeline/test_scoring.py checks this bit for bit on the demo model).
Only per-read results, (R,) or (R, k), leave the device, never (B, T, vocab) logits; generation
brings back one token per row per step (or (B, vocab) logits for sampling).

May import: the pipeline's tasks (generation's fixed-buffer cell and cached-decoding interface).
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import numpy as np
from mindspore import nn, ops

from evald.pipeline.tasks.generation import (ExtendStep, NextTokenLogits, decodes_with_cache, position_index,
                                             scores_with_cache)

log = logging.getLogger("evald.pipeline.suites.scoring")

_LENGTH_ATTRIBUTES = ("max_length", "seq_length", "seq_len", "max_position_embeddings", "max_seq_len")
_VOCAB_ATTRIBUTES = ("vocab_size", "n_vocab", "vocabulary_size")
PREFILL_CHUNK = 256          # tokens per prefill chunk of cached generation (at most the bucket's length)
FORK_CHUNK = 64              # the longest chunk (context's last token + continuation but its last) a fork runs
FORK_ROWS = 4                # a fork call runs at least this many rows: a multiple-choice question's choices
LADDER_RATIO = math.sqrt(2)  # consecutive bucket lengths: padding < 42% of a row, 17% on average
FIT_STEP = 16                # fitted bucket lengths are multiples of this: a row pads by less in its own bucket
AUTO_MEMORY_SHARE = 0.25     # the share of available memory ``batch_size="auto"`` lets one forward's logits take


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
    requested_tokens: int = 0   # input tokens of the requests as asked (each pair alone, no cache)
    real_tokens: int = 0        # tokens run through the network that a result needed
    padded_tokens: int = 0      # every position run, padding included
    forward_passes: int = 0


class ReadLogProbs(nn.Cell):
    """(B, T) tokens and (R, 3) reads of (row, position, token) -> each read's log-probability, the
    argmax at its (row, position), and the top k there; all on the device, only (R,)/(R, k) come back."""

    def __init__(self, network: nn.Cell, top_k: int = 0) -> None:
        super().__init__()
        self.network = network
        self.top_k = top_k

    def construct(self, tokens, reads):
        logits = self.network(tokens).astype(np.float32)            # (B, T, V)
        logp = ops.log_softmax(logits, -1)
        where = reads[:, :2]
        chosen = ops.gather_nd(logp, reads)                          # (R,)
        greedy = ops.gather_nd(ops.argmax(logits, -1), where)        # (R,)
        if self.top_k > 0:
            values, ids = ops.topk(logp, self.top_k)                 # (B, T, k)
            return chosen, greedy, ops.gather_nd(values, where), ops.gather_nd(ids, where)
        return chosen, greedy


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
    stays on the device and is dropped."""

    def __init__(self, network: nn.Cell, top_k: int = 0) -> None:
        super().__init__()
        self.network = network
        self.top_k = top_k

    def construct(self, cache, rows, tokens, start, reads):
        logits, _ = self.network.extend_all(tokens, start, self.network.cache_rows(cache, rows))
        logits = logits.astype(np.float32)                            # (B, c, V)
        logp = ops.log_softmax(logits, -1)
        where = reads[:, :2]
        chosen = ops.gather_nd(logp, reads)
        greedy = ops.gather_nd(ops.argmax(logits, -1), where)
        if self.top_k > 0:
            values, ids = ops.topk(logp, self.top_k)
            return chosen, greedy, ops.gather_nd(values, where), ops.gather_nd(ids, where)
        return chosen, greedy


def model_max_length(network: Any) -> int | None:
    """The longest input ``network`` accepts, from its (or its config's) usual attribute names."""
    return _model_int(network, _LENGTH_ATTRIBUTES)


def _model_int(network: Any, names: tuple[str, ...]) -> int | None:
    for holder in (network, getattr(network, "config", None)):
        for name in names:
            value = getattr(holder, name, None) if holder is not None else None
            if isinstance(value, int) and value > 0:
                return value
    return None


def length_ladder(max_length: int, ratio: float = LADDER_RATIO) -> tuple[int, ...]:
    """Bucket lengths from max_length down by ``ratio`` (rounded up to 16, or 64 past 512) to max_length/8
    (none shorter than 32 tokens: below that a graph costs more to compile than padding costs to run)."""
    shortest = max(1, min(max_length, max(32, max_length // 8)))
    lengths = [max_length]
    while True:
        step = 64 if lengths[-1] > 512 else 16
        n = int(math.ceil(lengths[-1] / ratio / step) * step)
        if n >= lengths[-1]:
            n = lengths[-1] - step
        if n < shortest:
            break
        lengths.append(n)
    return tuple(sorted(lengths))


def fitted_lengths(row_lengths: Sequence[int], max_length: int, rows_for: Callable[[int], int],
                   most: int) -> tuple[int, ...]:
    """At most ``most`` bucket lengths, the last ``max_length``, that run rows of ``row_lengths`` (a suite's
    forward rows, from a dry run) in the fewest padded tokens. Each row is rounded up to FIT_STEP; a bucket
    of length n runs ``rows_for(n)`` rows a forward, a partial last forward counted whole. A bucket besides
    max_length must save more than one forward's tokens, else its graphs cost more at start than it saves.
    Dynamic programming over the distinct rounded lengths: for each candidate top, the cost of every bucket
    below it is one numpy vector, and every bucket count is taken at once (O(most x lengths^2) integer
    operations in numpy, O(lengths) Python steps: 4,096 lengths in a 65,536 window in a fraction of a
    second, docs/benchmarks.md). Ties go to the lower bucket below, then to fewer buckets."""
    counts: dict[int, int] = {}
    for length in row_lengths:
        n = min(max_length, -(-max(1, int(length)) // FIT_STEP) * FIT_STEP)
        counts[n] = counts.get(n, 0) + 1
    candidates = np.array(sorted(set(counts) | {max_length}), np.int64)
    cumulative = np.cumsum([counts.get(int(n), 0) for n in candidates], dtype=np.int64)
    per_forward = np.array([rows_for(int(n)) for n in candidates], np.int64)
    last, layers = len(candidates) - 1, min(most, len(candidates))
    # best[k, j]: padded tokens of the rows up to candidates[j] in k + 1 buckets, the top one candidates[j];
    # below[k, j]: the index of the bucket under it (-1: none). Unreachable (k > j): a cost nothing beats.
    unreachable = np.iinfo(np.int64).max // 4
    best = np.full((layers, len(candidates)), unreachable, np.int64)
    below = np.full((layers, len(candidates)), -1, np.int64)
    best[0] = -(-cumulative // per_forward) * per_forward * candidates
    for j in range(1, len(candidates)):
        deepest = min(layers - 1, j)   # k + 1 buckets topped at j need k candidates below it
        if deepest < 1:
            continue
        rows = cumulative[j] - cumulative[:j]   # the rows in (candidates[i], candidates[j]], for every i < j
        bucket = -(-rows // per_forward[j]) * per_forward[j] * candidates[j]
        totals = best[:deepest, :j] + bucket    # row k - 1: k + 1 buckets, the one below at each i
        chosen = totals.argmin(axis=1)          # the first (lowest i) of equal costs
        best[1:deepest + 1, j] = totals[np.arange(deepest), chosen]
        below[1:deepest + 1, j] = chosen
    penalty = int(per_forward[last]) * max_length
    k = min(range(layers), key=lambda k: (int(best[k, last]) + k * penalty, k))
    lengths, j = [], last
    while j >= 0:
        lengths.append(int(candidates[j]))
        j = int(below[k, j])
        k -= 1
    return tuple(sorted(lengths))


def auto_budget(network: Any, max_length: int, available_bytes: int | None = None) -> int:
    """Tokens per forward so that the float32 logits and log-probabilities (2 x tokens x vocab x 4 bytes)
    take at most AUTO_MEMORY_SHARE of the memory available now; at least max_length, at most 64 x max_length."""
    vocab = _model_int(network, _VOCAB_ATTRIBUTES)
    if vocab is None:
        raise ValueError(f"batch_size auto needs the vocabulary size of {type(network).__name__}: set one of "
                         f"{', '.join(_VOCAB_ATTRIBUTES)} on it (or its config), or give a number")
    available = available_bytes if available_bytes is not None else _available_memory()
    tokens = int(AUTO_MEMORY_SHARE * available // (2 * vocab * 4))
    return int(min(64 * max_length, max(max_length, tokens)))


def _available_memory() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))


@dataclass
class _Row:
    """One input row of a forward and the (position, token) reads it carries for its requests."""
    tokens: tuple[int, ...]
    reads: list[tuple[int, int]]


def _prepared(request: ScoreRequest, max_length: int) -> tuple[np.ndarray, np.ndarray, int, int]:
    context, continuation = list(request.context), list(request.continuation)
    if not continuation:
        raise ValueError("a continuation needs at least one token to score")
    if len(continuation) > max_length:
        raise ValueError(f"a continuation of {len(continuation)} tokens does not fit max_length "
                         f"{max_length}")
    if not context:
        raise ValueError("a context needs at least one token (lm-eval passes the prefix/EOS token)")
    whole = context + continuation
    kept = whole[-(max_length + 1):]
    return (np.asarray(kept[:-1], np.int32), np.asarray(kept[1:], np.int32), len(whole) - len(kept),
            len(continuation))


def _share_rows(prepared: list) -> tuple[list[_Row], list[tuple[int, int]]]:
    """One row per distinct input that is no prefix of another; each request's (row, length)."""
    inputs = sorted({tuple(int(t) for t in p[0]) for p in prepared})
    owner: dict[tuple[int, ...], int] = {}
    rows: list[_Row] = []
    # In lexicographic order, a sequence that is a prefix of any other is a prefix of the one just after it.
    for k in range(len(inputs) - 1, -1, -1):
        tokens = inputs[k]
        after = inputs[k + 1] if k + 1 < len(inputs) else None
        if after is not None and len(after) > len(tokens) and after[:len(tokens)] == tokens:
            owner[tokens] = owner[after]
        else:
            owner[tokens] = len(rows)
            rows.append(_Row(tokens, []))
    seen: list[set] = [set() for _ in rows]
    placement = []
    for tokens, target, _, count in prepared:
        row = owner[tuple(int(t) for t in tokens)]
        for p in range(len(tokens) - count, len(tokens)):
            read = (p, int(target[p]))
            if read not in seen[row]:
                seen[row].add(read)
                rows[row].reads.append(read)
        placement.append((row, len(tokens)))
    return rows, placement


@dataclass
class _Fork:
    """Requests whose rows hold the same tokens before their first read (``shared``: the context but its last
    token) and diverge after it: ``shared`` is prefilled into a cache once and forked into one row per distinct
    ``chunk`` (the context's last token and the continuation but its last; equal or prefix chunks share a row)."""
    shared: tuple[int, ...]
    members: list[int]            # the requests, as indices into the call's requests
    chunks: list[_Row]            # reads: (index in the chunk, token)
    placement: list[int]          # each member's chunk
    capacity: int                 # the bucket whose cache holds shared + every chunk and one position more
    values: list[dict] = field(default_factory=list)   # per chunk: (index, token) -> the read's values

    def positions(self) -> int:
        """The cache positions the fork needs: the shared tokens, its longest chunk, and one more. A piece's
        padding past the capacity is clamped onto its last position (CachedDecoder), which then holds no real
        token, so no query of a real token attends to it."""
        return len(self.shared) + max(len(c.tokens) for c in self.chunks) + 1


def _forks(prepared: list, piece: int, fit: Callable[[int], int | None]) -> list[_Fork]:
    """The requests worth forking: sharing everything before their first read with another request whose chunk
    diverges (no prefix of it), every chunk at most ``piece`` tokens, where prefilling the shared tokens once
    and running each chunk padded to ``piece`` runs fewer tokens than a row per chunk; ``fit(positions)``
    gives the bucket or None."""
    by_shared: dict[tuple[int, ...], list[int]] = {}
    for i, (tokens, _, _, count) in enumerate(prepared):
        by_shared.setdefault(tuple(int(t) for t in tokens[:len(tokens) - count]), []).append(i)
    forks = []
    for shared, members in by_shared.items():
        if len(members) < 2 or not shared:
            continue
        tails = [(p[0][len(p[0]) - p[3]:], p[1][len(p[0]) - p[3]:], 0, p[3]) for p in (prepared[i] for i in members)]
        chunks, placement = _share_rows(tails)
        if len(chunks) < 2 or max(len(c.tokens) for c in chunks) > piece:
            continue             # equal or prefix rows: one row does it (a question's single-token choices)
        fork = _Fork(shared, members, chunks, [row for row, _ in placement], 0)
        forked = len(shared) + len(chunks) * piece
        alone = sum(len(shared) + len(c.tokens) for c in chunks)
        capacity = fit(fork.positions())
        if capacity is not None and forked < alone:
            fork.capacity = capacity
            forks.append(fork)
    return forks


def shared_rows(requests: Sequence[ScoreRequest], max_length: int) -> list[int]:
    """The input row each of ``requests`` is read from when they are scored in one call (requests that
    share a row have the same number; so do requests that share everything before their first read, which a
    CachedScorer may fork from one prefilled cache). Scoring any subset that keeps each number's requests
    together gives every request the same row, so the same bucket and the same bits (an eval group splits by this)."""
    prepared = [_prepared(r, max_length) for r in requests]
    _, placement = _share_rows(prepared)
    group = list(range(len(prepared)))     # union-find over rows: a row joins the rows its shared tokens join

    def root(row: int) -> int:
        while group[row] != row:
            group[row] = group[group[row]]
            row = group[row]
        return row

    first: dict[tuple[int, ...], int] = {}
    for (tokens, _, _, count), (row, _) in zip(prepared, placement):
        if len(tokens) > count:                # nothing shared before the first read: no fork
            other = first.setdefault(tuple(int(t) for t in tokens[:len(tokens) - count]), row)
            group[root(row)] = root(other)
    return [root(row) for row, _ in placement]


class TokenScorer:
    def __init__(self, network: nn.Cell, *, max_length: int | None = None, batch_size: int | str = 8,
                 lengths: Sequence[int] | None = None, top_k: int = 0, fork_contexts: bool = True,
                 fork_piece: int | None = None) -> None:
        max_length = max_length or model_max_length(network)
        if not max_length:
            raise ValueError(f"cannot tell the longest input of {type(network).__name__}: give max_length "
                             f"(the suite's max_length), or set one of {', '.join(_LENGTH_ATTRIBUTES)} on it")
        if batch_size == "auto":
            budget = auto_budget(network, max_length)
            batch_size = max(1, budget // max_length)
        elif not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be >= 1 or 'auto', got {batch_size!r}")
        else:
            budget = batch_size * max_length
        self._may_fit = lengths is None   # the ladder, until fit_lengths fits buckets to a suite's rows
        if lengths is None:
            lengths = length_ladder(max_length)
        lengths = tuple(sorted(set(int(n) for n in lengths)))
        if not lengths or lengths[0] < 1 or lengths[-1] != max_length:
            raise ValueError(f"bucket lengths {lengths} must be positive and end at max_length {max_length}")
        self.network, self.max_length, self.batch_size, self.lengths = network, max_length, batch_size, lengths
        self.token_budget = budget
        self.top_k = top_k
        self._score_cell = ReadLogProbs(network, top_k)
        self._next_cell = NextTokenLogits(network, greedy=True)
        self.cached = decodes_with_cache(network)
        self._extend_cell = ExtendStep(network, greedy=True) if self.cached else None
        self._top_cell = ExtendTopK(network, top_k) if self.cached and top_k > 0 else None
        self.fork_contexts = bool(fork_contexts)     # asked for; ``forks``: and the network can
        self.forks = self.fork_contexts and scores_with_cache(network)
        # the tokens of a fork call's chunk: from the lengths given at construction, kept when they are fitted (an
        # eval group's other ranks, built with the fitted lengths, are given this piece: the same fork shapes)
        self.fork_piece = int(fork_piece) if fork_piece else min(FORK_CHUNK, lengths[0])
        self._fork_cell = ForkReads(network, top_k) if self.forks else None
        for cell in (self._score_cell, self._next_cell, self._extend_cell, self._top_cell, self._fork_cell):
            if cell is not None:
                cell.set_train(False)
        self._shapes: set[tuple[Any, ...]] = set()
        self._fork_ready: set[int] = set()   # buckets whose fork graph is compiled
        self.stats = ScorerStats()
        log.info("token scorer: buckets %s, %d tokens per forward; generation: %s; diverging continuations: %s",
                 list(self.buckets), budget, self.decoding,
                 "fork one prefilled context" if self.forks else "a row each")

    @property
    def decoding(self) -> str:
        """Which generation path runs: ``cached`` (the network is a CachedDecoder) or ``full-forward``."""
        return "cached" if self.cached else "full-forward"

    def rows_for(self, length: int) -> int:
        return max(1, self.token_budget // length)

    @property
    def buckets(self) -> tuple[tuple[int, int], ...]:
        return tuple((self.rows_for(n), n) for n in self.lengths)

    @property
    def compiled_graphs(self) -> int:
        return len(self._shapes)

    def bucket_for(self, length: int) -> int:
        for n in self.lengths:
            if length <= n:
                return n
        raise ValueError(f"{length} tokens do not fit max_length {self.max_length}")

    # -- bucket lengths fitted to a suite's own rows (evald.pipeline.suites.bucket_plan) ---------------
    def plan_rows(self, requests: Sequence[ScoreRequest]) -> list[int]:
        """The lengths of the rows ``score(requests)`` would run (a fork: the cache positions it needs), no
        forward and no graph: what a suite's dry run records for ``fit_lengths``."""
        prepared = [self._row(r) for r in requests]
        forks, plain = self._split(prepared, lambda p: p if p <= self.max_length else None)
        rows, _ = _share_rows([prepared[i] for i in plain])
        return [len(row.tokens) for row in rows] + [fork.positions() for fork in forks]

    def plan_generate(self, requests: Sequence[GenerateRequest]) -> list[int]:
        """The bucket length each of ``requests`` needs in ``generate`` (context and new tokens), no forward."""
        return [min(self.max_length, len(context) + new) for context, new, _ in self._generation_rows(requests)]

    def fit_lengths(self, row_lengths: Sequence[int]) -> tuple[int, ...]:
        """Bucket lengths fitted to ``row_lengths`` (``fitted_lengths``, no more buckets than now) in place of
        the ladder. Only before any graph is compiled, so that a row lands in the same bucket at every checkpoint:
        a scorer already compiled (shared by another suite) keeps its lengths, and so does one given lengths by
        its caller or no rows."""
        if not self._may_fit or not row_lengths:
            return self.lengths
        if self._shapes:
            log.info("token scorer: keeps its buckets %s (%d graphs compiled already)", list(self.lengths),
                     len(self._shapes))
            return self.lengths
        ladder, self._may_fit = self.lengths, False
        self.lengths = fitted_lengths(row_lengths, self.max_length, self.rows_for, most=len(ladder))
        log.info("token scorer: buckets %s fitted to %d rows (the ladder was %s)", list(self.buckets),
                 len(row_lengths), list(ladder))
        return self.lengths

    def vocab_size(self) -> int:
        """The model's vocabulary: the last dimension of its logits, on one batch of the smallest bucket
        (one more graph, once; the logits of that one batch come to the host)."""
        import mindspore as ms

        zeros = np.zeros((self.batch_size, self.lengths[0]), np.int32)
        return int(self.network(ms.Tensor(zeros)).shape[-1])

    def warm_up(self, generate: bool = True, top_decoding: bool = False, forks: bool = True) -> int:
        """Compile every bucket's graphs now (with ``top_decoding``, also ``prefill_top``'s and ``decode_top``'s
        when the network is a CachedDecoder; with ``forks``, the forks' when it is a CachedScorer); the number
        compiled so far."""
        for _ in self.warming(generate, top_decoding, forks):
            pass
        return self.compiled_graphs

    def warming(self, generate: bool = True, top_decoding: bool = False, forks: bool = True) -> Iterator[int]:
        """``warm_up`` one graph at a time: each step of the iteration compiles one graph (seconds at LLM
        shapes) and yields the number compiled so far, so that a caller can do other work between two
        (evald validates a checkpoint that arrived meanwhile). ``score`` forks only into buckets whose fork
        graph is compiled: a suite without multiple-choice tasks passes ``forks=False`` and compiles none."""
        forks = forks and self.forks
        for n in self.lengths:
            if top_decoding and self._top_cell is not None:
                _, _, cache = self.prefill_top([[0]], n)
                yield self.compiled_graphs
                self.decode_top([0], [0], cache)
                yield self.compiled_graphs
            rows = self.rows_for(n)
            zeros = np.zeros((rows, n), np.int32)
            self._score_batch(zeros, np.zeros((rows * n, 3), np.int32))
            yield self.compiled_graphs
            if (generate and self.cached) or forks:
                cache = self.network.init_cache(rows, n)
                chunk = min(n, PREFILL_CHUNK)
                _, cache = self._extend(np.zeros((rows, chunk), np.int32), np.zeros(rows, np.int32),
                                        np.zeros(rows, np.int32), cache)
                yield self.compiled_graphs
                if forks:
                    forked, piece = self.fork_rows(n), self.fork_piece
                    self._fork_batch(cache, np.zeros(forked, np.int32), np.zeros((forked, piece), np.int32),
                                     np.zeros(forked, np.int32), np.zeros((forked * piece, 3), np.int32))
                    self._fork_ready.add(n)
                    yield self.compiled_graphs
            if generate and self.cached:
                self._extend(np.zeros((rows, 1), np.int32), np.zeros(rows, np.int32), np.zeros(rows, np.int32),
                             cache)
                yield self.compiled_graphs
            elif generate:
                self._next_tokens(zeros, np.zeros(rows, np.int32))
                yield self.compiled_graphs

    # -- log-probabilities ---------------------------------------------------------------------
    def score(self, requests: Sequence[ScoreRequest]) -> list[TokenScores]:
        prepared = [self._row(r) for r in requests]
        forks, plain = self._split(prepared, self._fork_bucket)
        forked = {i: (fork, k) for fork in forks for k, i in enumerate(fork.members)}
        got = self._score_rows([prepared[i] for i in plain])
        got_by_request = dict(zip(plain, got))
        self._score_forks(forks)
        results = []
        for i, (tokens, target, truncated, count) in enumerate(prepared):
            if i in forked:
                fork, k = forked[i]
                start = len(tokens) - count
                values = [fork.values[fork.placement[k]][(p - start, int(target[p]))] for p in range(start, len(tokens))]
            else:
                values = got_by_request[i]
            top_ids = top_lp = None
            if self.top_k > 0:
                top_lp = np.stack([g[2] for g in values]).astype(np.float32)
                top_ids = np.stack([g[3] for g in values]).astype(np.int64)
            results.append(TokenScores(np.asarray([g[0] for g in values], np.float32),
                                       np.asarray([g[1] for g in values], bool), top_ids, top_lp, truncated))
            self.stats.requested_tokens += len(tokens)
        return results

    def _split(self, prepared: list, fit: Callable[[int], int | None]) -> tuple[list[_Fork], list[int]]:
        """The forks among ``prepared`` (``fit(positions)``: their bucket, or None) and the requests that run
        as rows: ``score`` fits forks to compiled fork graphs, ``plan_rows`` to any length that holds them."""
        forks = _forks(prepared, self.fork_piece, fit) if self.forks else []
        forked = {i for fork in forks for i in fork.members}
        return forks, [i for i in range(len(prepared)) if i not in forked]

    def _score_rows(self, prepared: list) -> list[list[tuple]]:
        """Each request's reads from full-forward rows (equal and prefix rows shared)."""
        rows, placement = self._share(prepared)
        values: list[dict[tuple[int, int], tuple]] = [dict() for _ in rows]
        order = sorted(range(len(rows)), key=lambda i: -len(rows[i].tokens))
        batch: list[int] = []
        for i in order:
            n = self.bucket_for(len(rows[i].tokens))
            if batch and (self.bucket_for(len(rows[batch[0]].tokens)) != n or len(batch) >= self.rows_for(n)
                          or sum(len(rows[j].reads) for j in batch) + len(rows[i].reads) > self.rows_for(n) * n):
                self._run_rows(rows, batch, values)
                batch = []
            batch.append(i)
        if batch:
            self._run_rows(rows, batch, values)
        return [[values[row][(p, int(target[p]))] for p in range(len(tokens) - count, len(tokens))]
                for (tokens, target, _, count), (row, _) in zip(prepared, placement)]

    @staticmethod
    def _share(prepared: list) -> tuple[list[_Row], list[tuple[int, int]]]:
        return _share_rows(prepared)

    def _run_rows(self, rows: list[_Row], batch: list[int], values: list[dict]) -> None:
        n = self.bucket_for(len(rows[batch[0]].tokens))
        inputs = np.zeros((self.rows_for(n), n), np.int32)
        reads = np.zeros((self.rows_for(n) * n, 3), np.int32)
        owners: list[tuple[int, tuple[int, int]]] = []
        for r, i in enumerate(batch):
            inputs[r, :len(rows[i].tokens)] = rows[i].tokens
            for position, token in rows[i].reads:
                reads[len(owners)] = (r, position, token)
                owners.append((i, (position, token)))
        out = self._score_batch(inputs, reads)
        for k, (i, read) in enumerate(owners):
            top = (out[2][k], out[3][k]) if self.top_k > 0 else (None, None)
            values[i][read] = (out[0][k], int(out[1][k]) == read[1]) + top
        self.stats.real_tokens += sum(len(rows[i].tokens) for i in batch)

    def _row(self, request: ScoreRequest) -> tuple[np.ndarray, np.ndarray, int, int]:
        return _prepared(request, self.max_length)

    def _score_batch(self, inputs: np.ndarray, reads: np.ndarray) -> list[np.ndarray]:
        import mindspore as ms

        self._shapes.add(("score",) + inputs.shape)
        self.stats.padded_tokens += inputs.size
        self.stats.forward_passes += 1
        return [t.asnumpy() for t in self._score_cell(ms.Tensor(inputs), ms.Tensor(reads))]

    # -- diverging continuations: one prefilled context forked into a row per chunk (CachedScorer) -------
    def _fork_bucket(self, positions: int) -> int | None:
        """The bucket a fork of ``positions`` runs in, if its fork graph is compiled (never compile at a request)."""
        n = next((n for n in self.lengths if positions <= n), None)
        return n if n in self._fork_ready else None

    def fork_rows(self, length: int) -> int:
        """Rows of a fork call into a bucket of ``length``: the bucket's rows, and at least FORK_ROWS, so that a
        question's choices run in one call (their forked caches hold at most FORK_ROWS x max_length positions)."""
        return max(self.rows_for(length), FORK_ROWS)

    def _score_forks(self, forks: list[_Fork]) -> None:
        """Each fork's shared tokens prefilled once (a bucket's rows of forks at a time), then its chunks run on
        rows forked from that cache, ``fork_rows`` a call; fills each fork's ``values``."""
        by_bucket: dict[int, list[_Fork]] = {}
        for fork in sorted(forks, key=lambda f: len(f.shared)):
            fork.values = [dict() for _ in fork.chunks]
            by_bucket.setdefault(fork.capacity, []).append(fork)
        for n, members in sorted(by_bucket.items()):
            batch = self.rows_for(n)
            for begin in range(0, len(members), batch):
                prefilled = members[begin:begin + batch]
                _, cache = self._prefill([f.shared for f in prefilled], batch, n, self._extend)
                self.stats.real_tokens += sum(len(f.shared) for f in prefilled)
                chunks = [(slot, fork, c) for slot, fork in enumerate(prefilled) for c in range(len(fork.chunks))]
                for first in range(0, len(chunks), self.fork_rows(n)):
                    self._run_fork_chunks(chunks[first:first + self.fork_rows(n)], cache, self.fork_rows(n))

    def _run_fork_chunks(self, chunks: list[tuple[int, _Fork, int]], cache: Any, rows: int) -> None:
        """Up to ``rows`` chunks (each at most ``fork_piece`` tokens), each on a row forked from its slot of the
        prefilled ``cache``, in one call."""
        piece = self.fork_piece
        slots = np.zeros(rows, np.int32)
        tokens = np.zeros((rows, piece), np.int32)
        start = np.zeros(rows, np.int32)
        reads = np.zeros((rows * piece, 3), np.int32)
        owners: list[tuple[_Fork, int, tuple[int, int]]] = []
        for r, (slot, fork, c) in enumerate(chunks):
            chunk = fork.chunks[c]
            slots[r], start[r] = slot, len(fork.shared)
            tokens[r, :len(chunk.tokens)] = chunk.tokens
            for index, token in chunk.reads:
                reads[len(owners)] = (r, index, token)
                owners.append((fork, c, (index, token)))
            self.stats.real_tokens += len(chunk.tokens)
        out = self._fork_batch(cache, slots, tokens, start, reads)
        for k, (fork, c, read) in enumerate(owners):
            top = (out[2][k], out[3][k]) if self.top_k > 0 else (None, None)
            fork.values[c][read] = (out[0][k], int(out[1][k]) == read[1]) + top

    def _fork_batch(self, cache: Any, rows: np.ndarray, tokens: np.ndarray, start: np.ndarray,
                    reads: np.ndarray) -> list[np.ndarray]:
        import mindspore as ms

        assert self._fork_cell is not None
        self._shapes.add(("fork",) + tokens.shape + tuple(cache.shape))
        self.stats.padded_tokens += tokens.size
        self.stats.forward_passes += 1
        return [t.asnumpy() for t in self._fork_cell(cache, ms.Tensor(rows), ms.Tensor(tokens), ms.Tensor(start),
                                                     ms.Tensor(reads))]

    # -- greedy generation ---------------------------------------------------------------------
    def generate(self, requests: Sequence[GenerateRequest], eos_id: int | None = None) -> list[list[int]]:
        prepared = self._generation_rows(requests)
        results: list[list[int]] = [[] for _ in requests]
        by_bucket: dict[int, list[int]] = {}
        for i, (context, new, _) in enumerate(prepared):
            by_bucket.setdefault(self.bucket_for(min(self.max_length, len(context) + new)), []).append(i)
        run = self._generate_cached if self.cached else self._generate_batch
        for n, members in sorted(by_bucket.items()):
            members = sorted(members, key=lambda i: len(prepared[i][0]))   # similar contexts share a prefill
            for start in range(0, len(members), self.rows_for(n)):
                chunk = members[start:start + self.rows_for(n)]
                run(n, [prepared[i] for i in chunk], [results[i] for i in chunk], eos_id)
        return results

    def _generation_rows(self, requests: Sequence[GenerateRequest]) -> list[tuple[np.ndarray, int, Any]]:
        """Each request's (context, new tokens, stop): contexts left-truncated to ``max_length - new`` (HFLM)."""
        prepared = []
        for r in requests:
            new = max(1, min(int(r.max_new_tokens), self.max_length - 1))
            context = list(r.context)[-(self.max_length - new):]
            if not context:
                raise ValueError("generation needs a context of at least one token")
            prepared.append((np.asarray(context, np.int32), new, r.stop))
        return prepared

    def _accept(self, rows: list, outputs: list[list[int]], chosen: np.ndarray, active: np.ndarray,
                ends: np.ndarray, n: int, eos_id: int | None) -> list[int]:
        """Append each active row's chosen token; the rows that took one (ends: last filled position)."""
        took = []
        for r in np.flatnonzero(active):
            _, limit, stop = rows[r]
            token = int(chosen[r])
            if eos_id is not None and token == eos_id:
                active[r] = False
                continue
            outputs[r].append(token)
            ends[r] += 1
            took.append(int(r))
            self.stats.real_tokens += 1
            if len(outputs[r]) >= limit or ends[r] + 1 >= n or (stop is not None and stop(outputs[r])):
                active[r] = False
        return took

    def _generate_cached(self, n: int, rows: list, outputs: list[list[int]], eos_id: int | None) -> None:
        """Prefill the contexts in chunks into a cache of n positions, then one token per row per step."""
        batch = self.rows_for(n)
        contexts = [context for context, _, _ in rows]
        self.stats.real_tokens += sum(len(c) for c in contexts)
        (chosen,), cache = self._prefill(contexts, batch, n, self._extend)
        active = np.zeros(batch, bool)
        active[:len(rows)] = True
        ends = np.ones(batch, np.int64)
        ends[:len(rows)] = [len(c) for c in contexts]
        ends -= 1
        while True:
            took = self._accept(rows, outputs, chosen, active, ends, n, eos_id)
            if not active.any():
                return
            tokens = np.zeros((batch, 1), np.int32)
            for r in took:
                tokens[r, 0] = outputs[r][-1]
            start = np.minimum(ends, n - 1).astype(np.int32)
            (chosen,), cache = self._extend(tokens, start, np.zeros(batch, np.int32), cache)

    def _prefill(self, contexts: Sequence[Sequence[int]], batch: int, n: int,
                 step: Callable[[np.ndarray, np.ndarray, np.ndarray, Any], tuple[tuple[np.ndarray, ...], Any]]
                 ) -> tuple[tuple[np.ndarray, ...], Any]:
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

    def _extend(self, tokens: np.ndarray, start: np.ndarray, read: np.ndarray,
                cache: Any) -> tuple[tuple[np.ndarray], Any]:
        import mindspore as ms

        assert self._extend_cell is not None
        self._shapes.add(("extend",) + tokens.shape + tuple(cache.shape))
        self.stats.padded_tokens += tokens.size
        self.stats.forward_passes += 1
        best, cache = self._extend_cell(ms.Tensor(tokens), ms.Tensor(start), ms.Tensor(read), cache)
        return (best.asnumpy(),), cache

    # -- cached decoding with the top k (evald.serve's /v1/completions) ---------------------------
    def prefill_top(self, contexts: Sequence[Sequence[int]], capacity: int) -> tuple[np.ndarray, np.ndarray, Any]:
        """Prefill up to ``batch_size`` contexts into a new cache of ``capacity`` positions (one of ``lengths``);
        (ids (batch_size, k), log-probabilities (batch_size, k), cache): each row's next-token top k after its
        context (rows past ``len(contexts)`` are padding). Only for a CachedDecoder and ``top_k`` > 0."""
        if self._top_cell is None or len(contexts) > self.batch_size or capacity not in self.lengths:
            raise ValueError(f"prefill_top needs a CachedDecoder, top_k > 0, at most {self.batch_size} contexts and "
                             f"a capacity of {list(self.lengths)}")
        (values, ids), cache = self._prefill(contexts, self.batch_size, capacity, self._extend_top)
        return ids, values, cache

    def decode_top(self, tokens: Sequence[int], positions: Sequence[int],
                   cache: Any) -> tuple[np.ndarray, np.ndarray, Any]:
        """One token per row (padding past ``len(tokens)``) at its position (below the cache's capacity) into
        ``prefill_top``'s cache: (ids, log-probabilities, cache), the top k of the next token."""
        fed = np.zeros((self.batch_size, 1), np.int32)
        start = np.zeros(self.batch_size, np.int32)
        fed[:len(tokens), 0], start[:len(positions)] = tokens, positions
        (values, ids), cache = self._extend_top(fed, start, np.zeros(self.batch_size, np.int32), cache)
        return ids, values, cache

    def _extend_top(self, tokens: np.ndarray, start: np.ndarray, read: np.ndarray,
                    cache: Any) -> tuple[tuple[np.ndarray, np.ndarray], Any]:
        import mindspore as ms

        assert self._top_cell is not None
        self._shapes.add(("top-extend",) + tokens.shape + tuple(cache.shape))
        self.stats.padded_tokens += tokens.size
        self.stats.forward_passes += 1
        values, ids, cache = self._top_cell(ms.Tensor(tokens), ms.Tensor(start), ms.Tensor(read), cache)
        return (values.asnumpy(), ids.asnumpy()), cache

    def _generate_batch(self, n: int, rows: list, outputs: list[list[int]], eos_id: int | None) -> None:
        """The fallback: a full forward of the (rows, n) buffer per new token."""
        batch = self.rows_for(n)
        buffer = np.zeros((batch, n), np.int32)
        ends = np.zeros(batch, np.int64)   # the last filled position of each row
        active = np.zeros(batch, bool)
        for r, (context, _, _) in enumerate(rows):
            buffer[r, :len(context)] = context
            ends[r], active[r] = len(context) - 1, True
            self.stats.real_tokens += len(context)
        while active.any():
            chosen = self._next_tokens(buffer, ends)
            for r in self._accept(rows, outputs, chosen, active, ends, n, eos_id):
                buffer[r, ends[r]] = outputs[r][-1]

    def _next_tokens(self, buffer: np.ndarray, positions: np.ndarray) -> np.ndarray:
        import mindspore as ms

        self._shapes.add(("next",) + buffer.shape)
        self.stats.padded_tokens += buffer.size
        self.stats.forward_passes += 1
        return self._next_cell(ms.Tensor(buffer), ms.Tensor(position_index(positions))).asnumpy()
