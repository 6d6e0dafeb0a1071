"""Generation: greedy continuations, with the network's cache (cached decoding) or a full forward per new
token (the fallback), and serving's top-k decoding on a cache.

Greedy continuation ends a row at ``eos_id``, at its ``max_new_tokens``, when ``stop(generated_ids)`` is
true, or at the bucket's end. Contexts are left-truncated to ``max_length - max_new_tokens`` (HFLM). A
network that implements ``CachedDecoder`` (evald.pipeline.tasks.generation) is prefilled in chunks into a
static cache of the bucket's length, then decodes one token per row per step; any other network runs a full
forward of the bucket per new token. Rows of similar contexts share a batch, a bucket's rows at a time.

May import: the engine's buckets, graphs and requests.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from evald.pipeline.engine.buckets import Buckets
from evald.pipeline.engine.graphs import Graphs
from evald.pipeline.engine.requests import GenerateRequest

# A request ready to run: (context, new tokens, stop)
Row = tuple[np.ndarray, int, Callable[[list[int]], bool] | None]


def generation_rows(requests: Sequence[GenerateRequest], max_length: int) -> list[Row]:
    """Each request's (context, new tokens, stop): contexts left-truncated to ``max_length - new`` (HFLM)."""
    prepared = []
    for r in requests:
        new = max(1, min(int(r.max_new_tokens), max_length - 1))
        context = list(r.context)[-(max_length - new):]
        if not context:
            raise ValueError("generation needs a context of at least one token")
        prepared.append((np.asarray(context, np.int32), new, r.stop))
    return prepared


def generate(requests: Sequence[GenerateRequest], eos_id: int | None, buckets: Buckets, graphs: Graphs,
             cached: bool) -> list[list[int]]:
    """Each request's greedy continuation (the module's docstring)."""
    prepared = generation_rows(requests, buckets.max_length)
    results: list[list[int]] = [[] for _ in requests]
    by_bucket: dict[int, list[int]] = {}
    for i, (context, new, _) in enumerate(prepared):
        by_bucket.setdefault(buckets.bucket_for(min(buckets.max_length, len(context) + new)), []).append(i)
    run = _generate_cached if cached else _generate_batch
    for n, members in sorted(by_bucket.items()):
        members = sorted(members, key=lambda i: len(prepared[i][0]))   # similar contexts share a prefill
        for start in range(0, len(members), buckets.rows_for(n)):
            chunk = members[start:start + buckets.rows_for(n)]
            # the cache fitted to the suite's generation requests, unless one here needs more (the dry run did not
            # plan it): then the bucket's length, so that a row stops where it would in the bucket
            capacity = buckets.generation_capacity(n) if cached else n
            if any(len(prepared[i][0]) + prepared[i][1] > capacity for i in chunk):
                capacity = n
            run(capacity, buckets.rows_for(n), [prepared[i] for i in chunk], [results[i] for i in chunk], eos_id,
                graphs)
    return results


def _accept(rows: list[Row], outputs: list[list[int]], chosen: np.ndarray, active: np.ndarray, ends: np.ndarray,
            n: int, eos_id: int | None, graphs: Graphs) -> list[int]:
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
        graphs.stats.real_tokens += 1
        if len(outputs[r]) >= limit or ends[r] + 1 >= n or (stop is not None and stop(outputs[r])):
            active[r] = False
    return took


def _generate_cached(n: int, batch: int, rows: list[Row], outputs: list[list[int]], eos_id: int | None,
                     graphs: Graphs) -> None:
    """Prefill the contexts in chunks into a cache of n positions, then one token per row per step."""
    contexts = [context for context, _, _ in rows]
    graphs.stats.real_tokens += sum(len(c) for c in contexts)
    (chosen, _), cache = graphs.prefill(contexts, batch, n, graphs.extend)
    active = np.zeros(batch, bool)
    active[:len(rows)] = True
    ends = np.ones(batch, np.int64)
    ends[:len(rows)] = [len(c) for c in contexts]
    ends -= 1
    while True:
        took = _accept(rows, outputs, chosen, active, ends, n, eos_id, graphs)
        if not active.any():
            return
        tokens = np.zeros((batch, 1), np.int32)
        for r in took:
            tokens[r, 0] = outputs[r][-1]
        start = np.minimum(ends, n - 1).astype(np.int32)
        (chosen, _), cache = graphs.extend(tokens, start, np.zeros(batch, np.int32), cache)


def _generate_batch(n: int, batch: int, rows: list[Row], outputs: list[list[int]], eos_id: int | None,
                    graphs: Graphs) -> None:
    """The fallback: a full forward of the (rows, n) buffer per new token."""
    buffer = np.zeros((batch, n), np.int32)
    ends = np.zeros(batch, np.int64)   # the last filled position of each row
    active = np.zeros(batch, bool)
    for r, (context, _, _) in enumerate(rows):
        buffer[r, :len(context)] = context
        ends[r], active[r] = len(context) - 1, True
        graphs.stats.real_tokens += len(context)
    while active.any():
        chosen = graphs.next_tokens(buffer, ends)
        for r in _accept(rows, outputs, chosen, active, ends, n, eos_id, graphs):
            buffer[r, ends[r]] = outputs[r][-1]


def prefill_top(contexts: Sequence[Sequence[int]], capacity: int, batch: int,
                graphs: Graphs) -> tuple[np.ndarray, np.ndarray, Any]:
    """``contexts`` (at most ``batch``) prefilled into a new cache of ``capacity`` positions: (ids (batch, k),
    log-probabilities (batch, k), cache), each row's next-token top k (rows past ``len(contexts)``: padding)."""
    (values, ids), cache = graphs.prefill(contexts, batch, capacity, graphs.extend_top)
    return ids, values, cache


def decode_top(tokens: Sequence[int], positions: Sequence[int], cache: Any, batch: int,
               graphs: Graphs) -> tuple[np.ndarray, np.ndarray, Any]:
    """One token per row (padding past ``len(tokens)``) at its position into ``prefill_top``'s cache: (ids,
    log-probabilities, cache), the top k of the next token."""
    fed = np.zeros((batch, 1), np.int32)
    start = np.zeros(batch, np.int32)
    fed[:len(tokens), 0], start[:len(positions)] = tokens, positions
    (values, ids), cache = graphs.extend_top(fed, start, np.zeros(batch, np.int32), cache)
    return ids, values, cache
