"""Forks: continuations that share a context but diverge after it (multi-token choices, none a prefix of
another) scored from ONE prefilled cache.

For a network that implements ``CachedScorer`` (evald.pipeline.tasks.generation), the context but its last
token is prefilled once into a cache, which is forked into one row per choice (``ForkReads``: the context's
last token and the choice but its last, at most ``piece`` tokens, all read on the device), when that runs
fewer tokens than a row per choice. A fork runs only in a bucket whose fork graph is compiled
(``Graphs.fork_ready``): never a compile at a request.

May import: the engine's buckets, graphs, requests and rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from evald.pipeline.engine.buckets import Buckets
from evald.pipeline.engine.graphs import Graphs
from evald.pipeline.engine.rows import Prepared, Row, share_rows

FORK_CHUNK = 64              # the longest chunk (context's last token + continuation but its last) a fork runs
FORK_ROWS = 4                # a fork call runs at least this many rows: a multiple-choice question's choices


@dataclass
class Fork:
    """Requests whose rows hold the same tokens before their first read (``shared``: the context but its last
    token) and diverge after it: ``shared`` is prefilled into a cache once and forked into one row per distinct
    ``chunk`` (the context's last token and the continuation but its last; equal or prefix chunks share a row)."""
    shared: tuple[int, ...]
    members: list[int]            # the requests, as indices into the call's requests
    chunks: list[Row]             # reads: (index in the chunk, token)
    placement: list[int]          # each member's chunk
    capacity: int                 # the bucket whose cache holds shared + every chunk and one position more
    values: list[dict] = field(default_factory=list)   # per chunk: (index, token) -> the read's values

    def positions(self) -> int:
        """The cache positions the fork needs: the shared tokens, its longest chunk, and one more. A piece's
        padding past the capacity is clamped onto its last position (CachedDecoder), which then holds no real
        token, so no query of a real token attends to it."""
        return len(self.shared) + max(len(c.tokens) for c in self.chunks) + 1

    def reads_of(self, member: int, tokens: np.ndarray, target: np.ndarray, count: int) -> list[tuple]:
        """The values of the ``member``-th request (its row ``tokens``, ``target``, ``count`` read tokens)."""
        start = len(tokens) - count
        chunk = self.values[self.placement[member]]
        return [chunk[(p - start, int(target[p]))] for p in range(start, len(tokens))]


def fork_rows(buckets: Buckets, length: int) -> int:
    """Rows of a fork call into a bucket of ``length``: the bucket's rows, and at least FORK_ROWS, so that a
    question's choices run in one call (their forked caches hold at most FORK_ROWS x max_length positions)."""
    return max(buckets.rows_for(length), FORK_ROWS)


def plan_forks(requests: list[Prepared], piece: int, fit: Callable[[int], int | None]) -> list[Fork]:
    """The requests worth forking: sharing everything before their first read with another request whose chunk
    diverges (no prefix of it), every chunk at most ``piece`` tokens, where prefilling the shared tokens once
    and running each chunk padded to ``piece`` runs fewer tokens than a row per chunk; ``fit(positions)``
    gives the bucket or None."""
    by_shared: dict[tuple[int, ...], list[int]] = {}
    for i, (tokens, _, _, count) in enumerate(requests):
        by_shared.setdefault(tuple(int(t) for t in tokens[:len(tokens) - count]), []).append(i)
    forks = []
    for shared, members in by_shared.items():
        if len(members) < 2 or not shared:
            continue
        tails = [(p[0][len(p[0]) - p[3]:], p[1][len(p[0]) - p[3]:], 0, p[3]) for p in (requests[i] for i in members)]
        chunks, placement = share_rows(tails)
        if len(chunks) < 2 or max(len(c.tokens) for c in chunks) > piece:
            continue             # equal or prefix rows: one row does it (a question's single-token choices)
        fork = Fork(shared, members, chunks, [row for row, _ in placement], 0)
        forked = len(shared) + len(chunks) * piece
        alone = sum(len(shared) + len(c.tokens) for c in chunks)
        capacity = fit(fork.positions())
        if capacity is not None and forked < alone:
            fork.capacity = capacity
            forks.append(fork)
    return forks


def ready_bucket(buckets: Buckets, graphs: Graphs, positions: int) -> int | None:
    """The bucket a fork of ``positions`` runs in, if its fork graph is compiled (never compile at a request)."""
    n = next((n for n in buckets.lengths if positions <= n), None)
    return n if n in graphs.fork_ready else None


def score_forks(forks: list[Fork], buckets: Buckets, graphs: Graphs, piece: int, top_k: int) -> None:
    """Each fork's shared tokens prefilled once (a bucket's rows of forks at a time), then its chunks run on
    rows forked from that cache, ``fork_rows`` a call; fills each fork's ``values``."""
    by_bucket: dict[int, list[Fork]] = {}
    for fork in sorted(forks, key=lambda f: len(f.shared)):
        fork.values = [dict() for _ in fork.chunks]
        by_bucket.setdefault(fork.capacity, []).append(fork)
    for n, members in sorted(by_bucket.items()):
        batch, rows = buckets.rows_for(n), fork_rows(buckets, n)
        for begin in range(0, len(members), batch):
            prefilled = members[begin:begin + batch]
            _, cache = graphs.prefill([f.shared for f in prefilled], batch, n, graphs.extend)
            graphs.stats.real_tokens += sum(len(f.shared) for f in prefilled)
            chunks = [(slot, fork, c) for slot, fork in enumerate(prefilled) for c in range(len(fork.chunks))]
            for first in range(0, len(chunks), rows):
                _run_chunks(chunks[first:first + rows], cache, rows, graphs, piece, top_k)


def _run_chunks(chunks: list[tuple[int, Fork, int]], cache: object, rows: int, graphs: Graphs, piece: int,
                top_k: int) -> None:
    """Up to ``rows`` chunks (each at most ``piece`` tokens), each on a row forked from its slot of the
    prefilled ``cache``, in one call."""
    slots = np.zeros(rows, np.int32)
    tokens = np.zeros((rows, piece), np.int32)
    start = np.zeros(rows, np.int32)
    reads = np.zeros((rows * piece, 3), np.int32)
    owners: list[tuple[Fork, int, tuple[int, int]]] = []
    for r, (slot, fork, c) in enumerate(chunks):
        chunk = fork.chunks[c]
        slots[r], start[r] = slot, len(fork.shared)
        tokens[r, :len(chunk.tokens)] = chunk.tokens
        for index, token in chunk.reads:
            reads[len(owners)] = (r, index, token)
            owners.append((fork, c, (index, token)))
        graphs.stats.real_tokens += len(chunk.tokens)
    out = graphs.fork(cache, slots, tokens, start, reads)
    for k, (fork, c, read) in enumerate(owners):
        top = (out[2][k], out[3][k]) if top_k > 0 else (None, None)
        fork.values[c][read] = (out[0][k], int(out[1][k]) == read[1]) + top
