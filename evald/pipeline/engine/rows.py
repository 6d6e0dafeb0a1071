"""Planning a score call's rows: each request's input row, rows shared when equal or one a prefix of
another, and rows packed into the shortest bucket that holds them, their reads gathered on the device.

A request's input row is ``(context + continuation)[:-1]``, left-truncated to ``max_length`` tokens as
lm-eval's HFLM does (``(context + continuation)[-(max_length + 1):][:-1]``). Requests whose rows are equal,
or one a prefix of the other, run as ONE row (the network is causal, so a position's logits depend only on
the tokens up to it): the single-token choices of a multiple-choice question are all read at the last
position of one forward over its context.

May import: the engine's buckets and requests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from evald.pipeline.engine.buckets import Buckets
from evald.pipeline.engine.requests import ScoreRequest, ScorerStats

# A request ready to run: (input row, targets, context tokens dropped on the left, continuation tokens)
Prepared = tuple[np.ndarray, np.ndarray, int, int]
# One forward of a bucket: (B, T) tokens and (R, 3) reads of (row, position, token) -> the reads' values
RunBatch = Callable[[np.ndarray, np.ndarray], list[np.ndarray]]


@dataclass
class Row:
    """One input row of a forward and the (position, token) reads it carries for its requests."""
    tokens: tuple[int, ...]
    reads: list[tuple[int, int]]


def prepared(request: ScoreRequest, max_length: int) -> Prepared:
    """``request``'s input row and targets, left-truncated to fit ``max_length``; ValueError for a request
    with nothing to score or a continuation longer than the window."""
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


def share_rows(requests: list[Prepared]) -> tuple[list[Row], list[tuple[int, int]]]:
    """One row per distinct input that is no prefix of another; each request's (row, length)."""
    inputs = sorted({tuple(int(t) for t in p[0]) for p in requests})
    owner: dict[tuple[int, ...], int] = {}
    rows: list[Row] = []
    # In lexicographic order, a sequence that is a prefix of any other is a prefix of the one just after it.
    for k in range(len(inputs) - 1, -1, -1):
        tokens = inputs[k]
        after = inputs[k + 1] if k + 1 < len(inputs) else None
        if after is not None and len(after) > len(tokens) and after[:len(tokens)] == tokens:
            owner[tokens] = owner[after]
        else:
            owner[tokens] = len(rows)
            rows.append(Row(tokens, []))
    seen: list[set] = [set() for _ in rows]
    placement = []
    for tokens, target, _, count in requests:
        row = owner[tuple(int(t) for t in tokens)]
        for p in range(len(tokens) - count, len(tokens)):
            read = (p, int(target[p]))
            if read not in seen[row]:
                seen[row].add(read)
                rows[row].reads.append(read)
        placement.append((row, len(tokens)))
    return rows, placement


def shared_rows(requests: Sequence[ScoreRequest], max_length: int) -> list[int]:
    """The input row each of ``requests`` is read from when they are scored in one call (requests that
    share a row have the same number; so do requests that share everything before their first read, which a
    CachedScorer may fork from one prefilled cache). Scoring any subset that keeps each number's requests
    together gives every request the same row, so the same bucket and the same bits (an eval group splits by this)."""
    ready = [prepared(r, max_length) for r in requests]
    _, placement = share_rows(ready)
    group = list(range(len(ready)))     # union-find over rows: a row joins the rows its shared tokens join

    def root(row: int) -> int:
        while group[row] != row:
            group[row] = group[group[row]]
            row = group[row]
        return row

    first: dict[tuple[int, ...], int] = {}
    for (tokens, _, _, count), (row, _) in zip(ready, placement):
        if len(tokens) > count:                # nothing shared before the first read: no fork
            other = first.setdefault(tuple(int(t) for t in tokens[:len(tokens) - count]), row)
            group[root(row)] = root(other)
    return [root(row) for row, _ in placement]


def score_rows(requests: list[Prepared], buckets: Buckets, run: RunBatch, stats: ScorerStats,
               top_k: int) -> list[list[tuple]]:
    """Each request's reads from full-forward rows (equal and prefix rows shared), longest rows first, a
    bucket's rows at a time (``run``: one forward) and at most its ``read_width`` reads a forward (a row with
    more runs again for the rest); per request, per continuation token: (log-probability, is greedy[, top
    values, top ids])."""
    rows, placement = share_rows(requests)
    values: list[dict[tuple[int, int], tuple]] = [dict() for _ in rows]
    items: list[tuple[int, list[tuple[int, int]]]] = []   # (row, its reads in this forward), longest rows first
    for i in sorted(range(len(rows)), key=lambda i: -len(rows[i].tokens)):
        width = buckets.read_width(buckets.bucket_for(len(rows[i].tokens)))
        items += [(i, rows[i].reads[k:k + width]) for k in range(0, max(1, len(rows[i].reads)), width)]
    batch: list[tuple[int, list[tuple[int, int]]]] = []
    for item in items:
        n = buckets.bucket_for(len(rows[item[0]].tokens))
        if batch and (buckets.bucket_for(len(rows[batch[0][0]].tokens)) != n or len(batch) >= buckets.rows_for(n)
                      or sum(len(reads) for _, reads in batch) + len(item[1]) > buckets.read_width(n)):
            _run_rows(rows, batch, values, buckets, run, top_k)
            stats.real_tokens += sum(len(rows[j].tokens) for j, _ in batch)
            batch = []
        batch.append(item)
    if batch:
        _run_rows(rows, batch, values, buckets, run, top_k)
        stats.real_tokens += sum(len(rows[j].tokens) for j, _ in batch)
    return [[values[row][(p, int(target[p]))] for p in range(len(tokens) - count, len(tokens))]
            for (tokens, target, _, count), (row, _) in zip(requests, placement)]


def _run_rows(rows: list[Row], batch: list[tuple[int, list[tuple[int, int]]]], values: list[dict],
              buckets: Buckets, run: RunBatch, top_k: int) -> None:
    n = buckets.bucket_for(len(rows[batch[0][0]].tokens))
    inputs = np.zeros((buckets.rows_for(n), n), np.int32)
    reads = np.zeros((buckets.read_width(n), 3), np.int32)
    owners: list[tuple[int, tuple[int, int]]] = []
    for r, (i, row_reads) in enumerate(batch):
        inputs[r, :len(rows[i].tokens)] = rows[i].tokens
        for position, token in row_reads:
            reads[len(owners)] = (r, position, token)
            owners.append((i, (position, token)))
    out = run(inputs, reads)
    for k, (i, read) in enumerate(owners):
        top = (out[2][k], out[3][k]) if top_k > 0 else (None, None)
        values[i][read] = (out[0][k], int(out[1][k]) == read[1]) + top
