"""Buckets and planning: the fixed (rows, length) shapes every forward runs in, and their lengths fitted to a
suite's rows.

Graph mode compiles a graph for every new input shape, so every call runs in one of a few buckets: a bucket
of length n has ``token_budget // n`` rows (``Buckets.rows_for``), so every forward runs the same token
budget. The lengths are ``length_ladder``'s (a geometric ladder from max_length/8 to max_length) until
``Buckets.fit`` replaces them with ``fitted_lengths``: no more buckets, the fewest padded tokens for the rows
a suite's dry run recorded, before any graph compiles. The model's window and vocabulary are read from its
usual attribute names (``model_max_length``, ``auto_budget``).

May import: numpy only.
"""

from __future__ import annotations

import logging
import math
import os
from typing import Any, Callable, Sequence

import numpy as np

log = logging.getLogger("evald.pipeline.engine")

LENGTH_ATTRIBUTES = ("max_length", "seq_length", "seq_len", "max_position_embeddings", "max_seq_len")
VOCAB_ATTRIBUTES = ("vocab_size", "n_vocab", "vocabulary_size")
LADDER_RATIO = math.sqrt(2)  # consecutive bucket lengths: padding < 42% of a row, 17% on average
FIT_STEP = 16                # fitted bucket lengths are multiples of this: a row pads by less in its own bucket
AUTO_MEMORY_SHARE = 0.25     # the share of available memory ``batch_size="auto"`` lets one forward's logits take


def model_max_length(network: Any) -> int | None:
    """The longest input ``network`` accepts, from its (or its config's) usual attribute names."""
    return model_int(network, LENGTH_ATTRIBUTES)


def model_int(network: Any, names: tuple[str, ...]) -> int | None:
    """The first positive integer among ``names`` on ``network`` or its ``config``."""
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


def fit_step_up(length: int) -> int:
    """``length`` (at least 1) rounded up to a multiple of FIT_STEP: the lengths a fit chooses from."""
    return -(-max(1, int(length)) // FIT_STEP) * FIT_STEP


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
        n = min(max_length, fit_step_up(length))
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
    vocab = model_int(network, VOCAB_ATTRIBUTES)
    if vocab is None:
        raise ValueError(f"batch_size auto needs the vocabulary size of {type(network).__name__}: set one of "
                         f"{', '.join(VOCAB_ATTRIBUTES)} on it (or its config), or give a number")
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


class Buckets:
    """The buckets of one scorer: ``lengths`` (ascending, the last ``max_length``), each of ``rows_for(n)``
    rows. Given no lengths it starts from the ladder, which ``fit`` may replace once, before any graph."""

    def __init__(self, network: Any, max_length: int | None, batch_size: int | str,
                 lengths: Sequence[int] | None) -> None:
        max_length = max_length or model_max_length(network)
        if not max_length:
            raise ValueError(f"cannot tell the longest input of {type(network).__name__}: give max_length "
                             f"(the suite's max_length), or set one of {', '.join(LENGTH_ATTRIBUTES)} on it")
        if batch_size == "auto":
            budget = auto_budget(network, max_length)
            batch_size = max(1, budget // max_length)
        elif not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be >= 1 or 'auto', got {batch_size!r}")
        else:
            budget = batch_size * max_length
        self.may_fit = lengths is None   # the ladder, until fit() fits buckets to a suite's rows
        chosen = tuple(sorted(set(int(n) for n in (lengths if lengths is not None else length_ladder(max_length)))))
        if not chosen or chosen[0] < 1 or chosen[-1] != max_length:
            raise ValueError(f"bucket lengths {chosen} must be positive and end at max_length {max_length}")
        self.max_length, self.batch_size, self.token_budget, self.lengths = max_length, batch_size, budget, chosen
        self.read_widths: dict[int, int] = {}   # reads a forward of bucket n gathers; default: all its positions
        self.row_caps: dict[int, int] = {}      # rows of bucket n fitted to a suite's rows; default: the budget's
        self.cache_caps: dict[int, int] = {}    # generation's cache in bucket n fitted to a suite's; default: n

    def rows_for(self, length: int) -> int:
        return max(1, min(self.token_budget // length, self.row_caps.get(length) or self.token_budget))

    def idle(self, length: int) -> bool:
        """Whether the bucket of ``length`` holds none of a suite's planned rows (a row cap of 0): kept as an
        unplanned row's home, not compiled at start."""
        return self.row_caps.get(length) == 0

    def read_width(self, length: int) -> int:
        """The reads one forward of the bucket of ``length`` gathers (the rows of its (R, 3) reads): fitted to a
        suite's rows (``fit_read_widths``), else every position of the bucket."""
        return self.read_widths.get(length, self.rows_for(length) * length)

    def _planned_rows(self, lengths: Sequence[int], row_lengths: Sequence[int]) -> dict[int, int]:
        """The planned rows in each of ``lengths`` (the shortest that holds each)."""
        planned = {n: 0 for n in lengths}
        for length in row_lengths:
            planned[next(n for n in lengths if min(max(1, int(length)), self.max_length) <= n)] += 1
        return planned

    def _fit_cost(self, lengths: Sequence[int], row_lengths: Sequence[int]) -> int:
        """Tokens the planned rows run in ``lengths`` (a bucket with fewer rows than a forward runs just them), and
        one forward of the window for every bucket compiled beyond the first (``fitted_lengths``' trade)."""
        planned = {n: rows for n, rows in self._planned_rows(lengths, row_lengths).items() if rows}
        tokens = sum(-(-rows // self.rows_for(n)) * min(rows, self.rows_for(n)) * n for n, rows in planned.items())
        return tokens + (len(planned) - 1) * self.rows_for(self.max_length) * self.max_length

    def generation_capacity(self, length: int) -> int:
        """The cache positions generation in the bucket of ``length`` decodes into: fitted to a suite's generation
        requests (``fit_cache_caps``), else the bucket's length. A decode step moves the whole cache, so 4 prompts
        that need 567 positions decode into 576, not 1,024."""
        return self.cache_caps.get(length, length)

    def fit_cache_caps(self, planned: Sequence[int]) -> dict[int, int]:
        """Generation's cache capacities fitted to ``planned`` generation rows (context and new tokens, from
        ``plan_generate``): per bucket, its longest, rounded up to FIT_STEP (a request longer than that, which the
        dry run did not plan, decodes at the bucket's length)."""
        caps: dict[int, int] = {}
        for length in planned:
            n = self.bucket_for(min(max(1, int(length)), self.max_length))
            caps[n] = max(caps.get(n, 0), min(n, fit_step_up(length)))
        self.cache_caps = {n: c for n, c in caps.items() if c < n}
        return self.cache_caps

    def fit_read_widths(self, planned: Sequence[tuple[int, int]]) -> dict[int, int]:
        """Read widths fitted to ``planned`` rows of (length, reads): for each bucket, the reads of its
        ``rows_for`` rows with the most reads (no planned forward has more; a forward packs rows up to it, and a
        row with more reads runs again for the rest). A network that splits its head runs the head at that many
        positions a forward, not at all of them: a multiple-choice row of 650 tokens is read at one."""
        by_bucket: dict[int, list[int]] = {n: [] for n in self.lengths if not self.idle(n)}
        for length, reads in planned:
            by_bucket.setdefault(self.bucket_for(min(length, self.max_length)), []).append(int(reads))
        # a bucket whose planned rows read nothing (generation's) reads a position a row: the cached path's check
        # runs its few reads in a few forwards, and the head never runs at every position of a bucket nobody scores
        # (an idle bucket keeps every position: an unplanned row there is read in one forward)
        self.read_widths = {n: max(1, min(self.rows_for(n) * n, sum(sorted(counts)[-self.rows_for(n):])
                                          if counts else self.rows_for(n)))
                            for n, counts in sorted(by_bucket.items())}
        return self.read_widths

    @property
    def pairs(self) -> tuple[tuple[int, int], ...]:
        """Each bucket as (rows, length)."""
        return tuple((self.rows_for(n), n) for n in self.lengths)

    def bucket_for(self, length: int) -> int:
        for n in self.lengths:
            if length <= n:
                return n
        raise ValueError(f"{length} tokens do not fit max_length {self.max_length}")

    def fit(self, row_lengths: Sequence[int], compiled: int) -> tuple[int, ...]:
        """Lengths fitted to ``row_lengths`` (``fitted_lengths``, no more buckets than now) in place of the
        ladder. Only while no graph is compiled (``compiled``), so that a row lands in the same bucket at every
        checkpoint: buckets already compiled (a scorer shared by another suite) are kept, and so are lengths
        given by the caller, or with no rows."""
        if not self.may_fit or not row_lengths:
            return self.lengths
        if compiled:
            log.info("token scorer: keeps its buckets %s (%d graphs compiled already)", list(self.lengths), compiled)
            return self.lengths
        ladder, self.may_fit, self.row_caps = self.lengths, False, {}
        self.lengths = fitted_lengths(row_lengths, self.max_length, self.rows_for, most=len(ladder))
        # The window's bucket is always kept (an unplanned row's home), but when no planned row needs it, it is not
        # compiled at start: then the buckets under the suite's longest row need not save a forward to pay for it.
        top = min(self.max_length, max(fit_step_up(n) for n in row_lengths))
        if top < self.max_length and len(ladder) > 1:
            under = fitted_lengths(row_lengths, top, self.rows_for, most=len(ladder) - 1) + (self.max_length,)
            if self._fit_cost(under, row_lengths) < self._fit_cost(self.lengths, row_lengths):
                self.lengths = under
        # a bucket runs no more rows than the suite has for it: 6 questions' rows run 6 rows, not the budget's 12
        # (rows do not change a row's numbers); a bucket no planned row needs keeps the budget's rows, idle
        planned = self._planned_rows(self.lengths, row_lengths)
        self.row_caps = {n: count for n, count in planned.items() if count < self.token_budget // n}
        log.info("token scorer: buckets %s fitted to %d rows (the ladder was %s)", list(self.pairs),
                 len(row_lengths), list(ladder))
        return self.lengths
