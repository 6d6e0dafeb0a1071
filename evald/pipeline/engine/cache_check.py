"""A model's cached path checked against its full forward at warm-up, before any result depends on it.

A network that implements the cached interface (``CachedDecoder``'s ``init_cache``/``extend``, for
generation; ``CachedScorer``'s ``extend_all``/``cache_rows``, for forks) promises the logits of its full
forward at the same positions; nothing else would notice a wrong implementation (wrong numbers, silently)
or a slow one. So once its graphs are compiled, on up to CHECK_ROWS rows (a suite's own rows from its dry
run, else rows of the model's own greedy tokens), in the shapes already compiled (no graph more):

* decoding: each row but its last few tokens prefilled into a cache, then those tokens one decode step
  each; each step's chosen token's log-probability against the full forward's at that position;
* forks: each row but its last few tokens prefilled (that prefill's last position checked as decoding is),
  the rest run as a fork of that cache; each position's log-probability of the row's next token against the
  full forward's.

A difference beyond TOLERANCE (log-probability, float32) is a mismatch: the caller turns the cached path
off (generation then runs a full forward per token; a fork's requests run as rows) and logs one ERROR
naming the method and the difference. The log also says a decode step's measured time against a full
forward's of the same bucket, so that a "cached" implementation slower than the full forward is seen.

May import: the engine's buckets, forks and graphs.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from evald.pipeline.engine.buckets import Buckets
from evald.pipeline.engine.forks import fork_rows
from evald.pipeline.engine.graphs import Graphs

log = logging.getLogger("evald.pipeline.engine")

TOLERANCE = 1e-5      # the largest difference of a log-probability between the cached path and the full forward
CHECK_ROWS = 4        # rows checked
CHECK_TOKENS = 4      # positions of each row run through decode steps (or a fork)
SHORTEST_BUCKET = 3 * CHECK_TOKENS   # a bucket the check fits in: its reads (at most 9 a row) in one forward

# One cached call: (tokens, start, read, cache) -> ((chosen id, its log-probability) of each row, cache)
Decode = Callable[[np.ndarray, np.ndarray, np.ndarray, Any], tuple[tuple[np.ndarray, np.ndarray], Any]]


@dataclass(frozen=True)
class Mismatch:
    """Where the cached path and the full forward differ most."""
    difference: float        # the largest |log p(cached) - log p(full forward)|, inf where one is not finite
    row: int
    position: int


@dataclass(frozen=True)
class CheckResult:
    rows: int                          # rows checked
    given: bool                        # they were the caller's (a suite's own), not the model's greedy tokens
    decoding: Mismatch | None          # None: not checked (no decoding to run)
    forks: Mismatch | None             # None: not checked
    decode_step_s: float | None        # the fastest decode step measured
    full_forward_s: float              # one full forward of the bucket


def check_rows(given: Sequence[Sequence[int]] | None, n: int, buckets: Buckets, graphs: Graphs,
               most: int) -> tuple[list[list[int]], bool]:
    """Up to ``most`` rows of 3 to ``n - 1`` tokens (a fork needs one position past its row), and whether they
    are ``given``'s (a prefix of each, when longer); else rows of the model's greedy tokens after zeros (token
    ids it has; forwards of the scoring graph of bucket ``n`` as compiled)."""
    rows = [[int(t) for t in row][:n - 1] for row in (given or ())]
    rows = [row for row in rows if len(row) >= 3][:most]
    if rows:
        return rows, True
    reads = np.zeros((n, 3), np.int32)
    reads[:, 1] = np.arange(n)
    ids = _full_forward(np.zeros((buckets.rows_for(n), n), np.int32), reads, n, buckets, graphs)[1]
    return [[int(ids[(p * (r + 2) + r) % n]) if (p + r) % 3 else 0 for p in range(n - 1)] for r in range(most)], False


def _full_forward(inputs: np.ndarray, reads: np.ndarray, n: int, buckets: Buckets,
                  graphs: Graphs) -> tuple[np.ndarray, np.ndarray]:
    """(log-probability, argmax) of each of ``reads`` in ``inputs`` through bucket ``n``'s scoring graph as
    warm-up compiled it: ``read_width(n)`` reads a forward (fitted to a suite's rows), so as many forwards as
    that takes."""
    width = buckets.read_width(n)
    values, best = [], []
    for k in range(0, len(reads), width):
        chunk = np.zeros((width, 3), np.int32)
        chunk[:len(reads[k:k + width])] = reads[k:k + width]
        out = graphs.score(inputs, chunk)
        values.append(out[0][:len(reads[k:k + width])])
        best.append(out[1][:len(reads[k:k + width])])
    return np.concatenate(values), np.concatenate(best)


def run_check(given: Sequence[Sequence[int]] | None, n: int, buckets: Buckets, graphs: Graphs, *,
              decode: Decode | None, decode_batch: int, decode_capacity: int | None = None,
              fork_piece: int | None) -> CheckResult:
    """The check of the module's docstring in the bucket of length ``n`` (its graphs compiled; at least
    SHORTEST_BUCKET) on rows of ``given`` (``check_rows``): ``decode`` (a batch of ``decode_batch`` rows, into
    a cache of ``decode_capacity`` positions, ``n`` unless fitted smaller) when generation is cached, forks of
    ``fork_piece`` tokens when they run."""
    if n < SHORTEST_BUCKET:
        raise ValueError(f"the cached path's check needs a bucket of at least {SHORTEST_BUCKET} tokens, not {n}")
    batch = buckets.rows_for(n)
    rows, own = check_rows(given, n, buckets, graphs, min(CHECK_ROWS, decode_batch, batch))
    decoded: list[tuple[int, int, int, float]] = []
    step_s: list[float] = []
    if decode is not None:   # a row's prefix that fits the cache: the full forward at a position sees only its past
        capacity = min(n, decode_capacity or n)
        decoded, step_s = _decode([row[:capacity - 1] for row in rows], capacity, decode, decode_batch, graphs)
    forked: list[tuple[int, int, int, float]] = []
    if fork_piece is not None:   # its prefill is extend's: checked as decoding is
        prefilled, forked = _fork(rows, n, batch, fork_piece, buckets, graphs)
        decoded += prefilled
    inputs = np.zeros((batch, n), np.int32)
    for r, row in enumerate(rows):
        inputs[r, :len(row)] = row
    reads = np.asarray([(r, p, t) for r, p, t, _ in decoded + forked], np.int32).reshape(-1, 3)
    started = time.perf_counter()
    full = _full_forward(inputs, reads, n, buckets, graphs)[0]
    full_s = (time.perf_counter() - started) / max(1, -(-len(reads) // buckets.read_width(n)))
    return CheckResult(len(rows), own, _worst(decoded, full[:len(decoded)]) if decoded else None,
                       _worst(forked, full[len(decoded):len(decoded) + len(forked)]) if forked else None,
                       min(step_s, default=None), full_s)


def _decode(rows: list[list[int]], n: int, decode: Decode, batch: int,
            graphs: Graphs) -> tuple[list[tuple[int, int, int, float]], list[float]]:
    """Each row but its last CHECK_TOKENS - 1 tokens prefilled into a cache of ``n`` positions, then those one
    decode step each: per position run, (row, position, chosen token, its log-probability); and each decode
    step's seconds."""
    steps = [min(CHECK_TOKENS, len(row) - 1) for row in rows]
    prefilled = [len(row) - d for row, d in zip(rows, steps)]
    (ids, values), cache = graphs.prefill([row[:m] for row, m in zip(rows, prefilled)], batch, n, decode)
    out = [(r, m - 1, int(ids[r]), float(values[r])) for r, m in enumerate(prefilled)]
    seconds = []
    for j in range(1, max(steps)):
        tokens, start = np.zeros((batch, 1), np.int32), np.full(batch, n - 1, np.int32)
        going = [r for r, d in enumerate(steps) if j < d]
        for r in going:
            tokens[r, 0], start[r] = rows[r][prefilled[r] + j - 1], prefilled[r] + j - 1
        began = time.perf_counter()
        (ids, values), cache = decode(tokens, start, np.zeros(batch, np.int32), cache)
        seconds.append(time.perf_counter() - began)
        out += [(r, int(start[r]), int(ids[r]), float(values[r])) for r in going]
    return out, seconds


def _fork(rows: list[list[int]], n: int, batch: int, piece: int, buckets: Buckets,
          graphs: Graphs) -> tuple[list[tuple[int, int, int, float]], list[tuple[int, int, int, float]]]:
    """Each row but its last few tokens prefilled, then those run as a fork of that cache (one row each):
    the prefill's (row, position, chosen token, its log-probability) at each row's last prefilled position,
    and per forked position (row, position, the row's next token or 0 past its end, that token's
    log-probability)."""
    chunks = [min(piece, CHECK_TOKENS, len(row) - 1) for row in rows]
    shared = [len(row) - c for row, c in zip(rows, chunks)]
    (ids, logp), cache = graphs.prefill([row[:s] for row, s in zip(rows, shared)], batch, n, graphs.extend)
    prefilled = [(r, s - 1, int(ids[r]), float(logp[r])) for r, s in enumerate(shared)]
    forked = fork_rows(buckets, n)
    slots, start = np.zeros(forked, np.int32), np.zeros(forked, np.int32)
    tokens, reads = np.zeros((forked, piece), np.int32), np.zeros((forked * piece, 3), np.int32)
    where: list[tuple[int, int, int]] = []
    for r, (row, s, c) in enumerate(zip(rows, shared, chunks)):
        slots[r], start[r] = r, s
        tokens[r, :c] = row[s:]
        for j in range(c):
            token = row[s + j + 1] if s + j + 1 < len(row) else 0
            reads[len(where)] = (r, j, token)
            where.append((r, s + j, token))
    values = graphs.fork(cache, slots, tokens, start, reads)[0]
    return prefilled, [(r, p, t, float(values[k])) for k, (r, p, t) in enumerate(where)]


def _difference(cached: np.ndarray, full: np.ndarray) -> np.ndarray:
    """Per read: |cached - full|; 0 where both are the same non-finite value, inf where only one is finite."""
    both = ~np.isfinite(cached) & ~np.isfinite(full)
    same = both & ((cached == full) | (np.isnan(cached) & np.isnan(full)))
    one = np.isfinite(cached) != np.isfinite(full)
    with np.errstate(invalid="ignore"):
        gaps = np.abs(cached.astype(np.float64) - full.astype(np.float64))
    return np.where(same, 0.0, np.where(one, np.inf, gaps))


def _worst(cached: list[tuple[int, int, int, float]], full: np.ndarray) -> Mismatch:
    """The largest difference between ``cached`` (row, position, token, log-probability) and ``full`` (the
    full forward's log-probabilities of the same reads)."""
    gaps = _difference(np.asarray([v for *_, v in cached], np.float32), np.asarray(full, np.float32))
    k = int(np.argmax(gaps))
    return Mismatch(float(gaps[k]), cached[k][0], cached[k][1])


def report(result: CheckResult, model: str, bucket: tuple[int, int]) -> set[str]:
    """Log ``result`` of ``model`` (its class name) in ``bucket`` (length, rows); the cached paths to turn
    off: ``decoding`` (forks too: they prefill with ``extend``) or ``forks``. One ERROR for a mismatch; the
    times at INFO, at WARNING when a decode step is no faster than a full forward."""
    n, rows = bucket
    source = "the suite's own" if result.given else "of the model's own greedy tokens"
    where = f"on {result.rows} row(s) ({source}) in the bucket of {n} tokens"
    decode, fork = result.decoding, result.forks
    if decode is not None and decode.difference > TOLERANCE:
        log.error("token scorer: %s.extend (cached decoding) is not its full forward: log-probabilities %.3g apart "
                  "(row %d, position %d) %s, more than %g; evald runs the full forward instead (a forward per new "
                  "token; a row per diverging continuation): slower, the right numbers. Fix %s.extend (init_cache/"
                  "extend must give the full forward's logits at the same positions: "
                  "evald.pipeline.tasks.generation.CachedDecoder)",
                  model, decode.difference, decode.row, decode.position, where, TOLERANCE, model)
        return {"decoding", "forks"}
    if fork is not None and fork.difference > TOLERANCE:
        log.error("token scorer: %s.extend_all / cache_rows (context forks) are not its full forward: "
                  "log-probabilities %.3g apart (row %d, position %d) %s, more than %g; each continuation runs as "
                  "its own row instead (the right numbers). Fix %s.extend_all and %s.cache_rows "
                  "(evald.pipeline.tasks.generation.CachedScorer)", model, fork.difference, fork.row, fork.position,
                  where, TOLERANCE, model, model)
        return {"forks"}
    agreed = ", ".join(f"{what} up to {m.difference:.2g} apart" for what, m in (("decoding", decode), ("forks", fork))
                       if m is not None)
    if result.decode_step_s is None:
        log.info("token scorer: %s's cached path checked against its full forward %s: %s", model, where, agreed)
        return set()
    step_ms, full_ms = 1e3 * result.decode_step_s, 1e3 * result.full_forward_s
    slow = result.decode_step_s >= result.full_forward_s
    log.log(logging.WARNING if slow else logging.INFO,
            "token scorer: %s's cached path checked against its full forward %s: %s; a decode step takes %.3g ms, a "
            "full forward of the bucket (%d x %d) %.3g ms (%.2gx)%s", model, where, agreed, step_ms, rows, n, full_ms,
            full_ms / max(step_ms, 1e-9),
            f": its cached decoding is no faster than a full forward per token; look at {model}.extend's cost "
            "(docs/benchmarks.md, cached decoding)" if slow else "")
    return set()
