"""``TokenScorer``: the engine's one face, joining its jobs (buckets, rows, forks, generation, graphs) on one
network: what suites, eval groups and serving call (the package's docstring is its API).

May import: the engine's modules; the pipeline's tasks (the cached-decoding interface).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterator, Sequence

import numpy as np
from mindspore import nn

from evald.pipeline.engine import cache_check, decoding, forks as forking
from evald.pipeline.engine.buckets import Buckets
from evald.pipeline.engine.graphs import PREFILL_CHUNK, Graphs
from evald.pipeline.engine.requests import GenerateRequest, ScoreRequest, TokenScores
from evald.pipeline.engine.rows import Prepared, prepared, score_rows, share_rows
from evald.pipeline.tasks.generation import decodes_with_cache, scores_with_cache, splits_head

log = logging.getLogger("evald.pipeline.engine")


class TokenScorer:
    def __init__(self, network: nn.Cell, *, max_length: int | None = None, batch_size: int | str = 8,
                 lengths: Sequence[int] | None = None, top_k: int = 0, fork_contexts: bool = True,
                 fork_piece: int | None = None, read_widths: Sequence[tuple[int, int]] | None = None,
                 row_caps: Sequence[tuple[int, int]] | None = None,
                 cache_caps: Sequence[tuple[int, int]] | None = None) -> None:
        self._buckets = Buckets(network, max_length, batch_size, lengths)
        self._buckets.read_widths = {int(n): int(w) for n, w in (read_widths or ())}
        self._buckets.row_caps = {int(n): int(r) for n, r in (row_caps or ())}
        self._buckets.cache_caps = {int(n): int(c) for n, c in (cache_caps or ())}
        self.network, self.top_k = network, top_k
        # the head at the read positions only (HeadSplit): the rows' reads a suite's dry run plans (plan_rows), and
        # the longest chunk of its forks, fit the reads a forward gathers and the fork piece (fit_lengths)
        self.split_head = splits_head(network)
        self._planned_reads: list[tuple[int, int]] = []
        self._planned_chunk = 0
        self._planned_forks = 0
        # False once fit_lengths saw a plan with no fork: score forks what plan_rows forks, so none would run and no
        # fork graph compiles (single-token choices); an eval group's WARM carries it to the other ranks
        self.plans_forks = True
        # False once fit_lengths saw a plan with no scored row nor fork (generation only): no scoring graph compiles
        # but the one the cached path's check reads the full forward through
        self.plans_scores = True
        self._planned_generate: list[int] = []
        self._piece_given = bool(fork_piece)
        self.cached = decodes_with_cache(network)
        self.fork_contexts = bool(fork_contexts)     # asked for; ``forks``: and the network can
        self.forks = self.fork_contexts and scores_with_cache(network)
        # the tokens of a fork call's chunk: from the lengths given at construction, kept when they are fitted (an
        # eval group's other ranks, built with the fitted lengths, are given this piece: the same fork shapes)
        self.fork_piece = int(fork_piece) if fork_piece else min(forking.FORK_CHUNK, self.lengths[0])
        self._graphs = Graphs(network, top_k, self.cached, self.forks)
        self.stats = self._graphs.stats
        log.info("token scorer: buckets %s, %d tokens per forward; generation: %s; diverging continuations: %s",
                 list(self.buckets), self.token_budget, self.decoding,
                 "fork one prefilled context" if self.forks else "a row each")

    # -- the buckets (evald.pipeline.engine.buckets) ---------------------------------------------------
    @property
    def max_length(self) -> int:
        return self._buckets.max_length

    @property
    def batch_size(self) -> int:
        return self._buckets.batch_size

    @property
    def token_budget(self) -> int:
        return self._buckets.token_budget

    @property
    def lengths(self) -> tuple[int, ...]:
        return self._buckets.lengths

    @property
    def buckets(self) -> tuple[tuple[int, int], ...]:
        return self._buckets.pairs

    @property
    def read_widths(self) -> tuple[tuple[int, int], ...]:
        """The (bucket length, reads a forward gathers) fitted to a suite's rows (``Buckets.fit_read_widths``);
        empty: every position of a bucket. An eval group's other ranks are given these (the same shapes)."""
        return tuple(sorted(self._buckets.read_widths.items()))

    def read_width(self, length: int) -> int:
        return self._buckets.read_width(length)

    @property
    def cache_caps(self) -> tuple[tuple[int, int], ...]:
        """The (bucket length, cache positions) of buckets whose generation decodes into a smaller cache, fitted
        to a suite's generation requests (``Buckets.fit_cache_caps``); an eval group's other ranks are given these."""
        return tuple(sorted(self._buckets.cache_caps.items()))

    @property
    def row_caps(self) -> tuple[tuple[int, int], ...]:
        """The (bucket length, rows) of buckets that run fewer rows than the token budget allows, fitted to a
        suite's rows (``Buckets.fit``). An eval group's other ranks are given these (the same shapes)."""
        return tuple(sorted(self._buckets.row_caps.items()))

    def rows_for(self, length: int) -> int:
        return self._buckets.rows_for(length)

    def bucket_for(self, length: int) -> int:
        return self._buckets.bucket_for(length)

    def fork_rows(self, length: int) -> int:
        return forking.fork_rows(self._buckets, length)

    @property
    def decoding(self) -> str:
        """Which generation path runs: ``cached`` (the network is a CachedDecoder) or ``full-forward``."""
        return "cached" if self.cached else "full-forward"

    # -- what is compiled (evald.pipeline.engine.graphs) -----------------------------------------------
    @property
    def compiled_graphs(self) -> int:
        return len(self._graphs.shapes)

    @property
    def _shapes(self) -> set[tuple[Any, ...]]:
        return self._graphs.shapes

    @property
    def _fork_ready(self) -> set[int]:
        return self._graphs.fork_ready

    @property
    def _score_cell(self) -> nn.Cell:
        return self._graphs.score_cell

    @property
    def _fork_cell(self) -> nn.Cell | None:
        return self._graphs.fork_cell

    # -- bucket lengths fitted to a suite's own rows (evald.pipeline.suites.bucket_plan) ---------------
    def plan_rows(self, requests: Sequence[ScoreRequest]) -> list[int]:
        """The lengths of the rows ``score(requests)`` would run (a fork: the cache positions it needs), no
        forward and no graph: what a suite's dry run records for ``fit_lengths``."""
        ready = [prepared(r, self.max_length) for r in requests]
        forks, plain = self._split(ready, lambda p: p if p <= self.max_length else None)
        rows, _ = share_rows([ready[i] for i in plain])
        self._planned_reads += [(len(row.tokens), len(row.reads)) for row in rows]
        self._planned_chunk = max([self._planned_chunk] + [len(c.tokens) for fork in forks for c in fork.chunks])
        self._planned_forks += len(forks)
        return [len(row.tokens) for row in rows] + [fork.positions() for fork in forks]

    def plan_generate(self, requests: Sequence[GenerateRequest]) -> list[int]:
        """The bucket length each of ``requests`` needs in ``generate`` (context and new tokens), no forward."""
        lengths = [min(self.max_length, len(context) + new)
                   for context, new, _ in decoding.generation_rows(requests, self.max_length)]
        self._planned_generate += lengths
        return lengths

    def fit_lengths(self, row_lengths: Sequence[int]) -> tuple[int, ...]:
        """Bucket lengths fitted to ``row_lengths`` in place of the ladder, before any graph compiles
        (``Buckets.fit``). For a network that splits its head (HeadSplit), also the reads a forward gathers
        and, unless given, the fork piece, fitted to what ``plan_rows`` saw (a suite's dry run)."""
        may_fit = self._buckets.may_fit
        lengths = self._buckets.fit(row_lengths, self.compiled_graphs)
        if not may_fit or self._buckets.may_fit:
            return lengths   # not fitted now (given lengths, fitted before, compiled already, or no rows)
        if self.forks and not self._planned_forks:
            self.plans_forks = False
            log.info("token scorer: no context fork planned: no fork graph compiled")
        if not self._planned_reads and not self._planned_forks:
            self.plans_scores = False
        if self.cached and self._planned_generate:
            log.info("token scorer: generation decodes into caches of %s positions",
                     self._buckets.fit_cache_caps(self._planned_generate) or "the buckets'")
        if self.split_head:
            widths = self._buckets.fit_read_widths(self._planned_reads)
            if self._planned_chunk and not self._piece_given:
                self.fork_piece = min(self.fork_piece, self._planned_chunk)
            log.info("token scorer: the head at the reads only: reads per forward %s, fork piece %d",
                     widths, self.fork_piece)
        return lengths

    def vocab_size(self) -> int:
        """The model's vocabulary: the last dimension of its logits, on one batch of the smallest bucket
        (one more graph, once; the logits of that one batch come to the host)."""
        import mindspore as ms

        zeros = np.zeros((self.batch_size, self.lengths[0]), np.int32)
        return int(self.network(ms.Tensor(zeros)).shape[-1])

    # -- compiling at start ----------------------------------------------------------------------------
    def warm_up(self, generate: bool = True, top_decoding: bool = False, forks: bool = True,
                check_rows: Sequence[Sequence[int]] | None = None) -> int:
        """Compile every bucket's graphs now (with ``top_decoding``, also ``prefill_top``'s and ``decode_top``'s
        when the network is a CachedDecoder; with ``forks``, the forks' when it is a CachedScorer), the cached
        path checked on ``check_rows`` (``warming``); the number compiled so far."""
        for _ in self.warming(generate, top_decoding, forks, check_rows):
            pass
        return self.compiled_graphs

    def warming(self, generate: bool = True, top_decoding: bool = False, forks: bool = True,
                check_rows: Sequence[Sequence[int]] | None = None) -> Iterator[int]:
        """``warm_up`` one graph at a time: each step of the iteration compiles one graph (seconds at LLM
        shapes) and yields the number compiled so far, so that a caller can do other work between two
        (evald validates a checkpoint that arrived meanwhile). ``score`` forks only into buckets whose fork
        graph is compiled: a suite without multiple-choice tasks passes ``forks=False`` and compiles none.
        Once the graphs of the first bucket long enough for it are compiled, the cached path that will run is
        checked against the full forward on ``check_rows`` (a suite's own rows; cache_check): a mismatch turns it
        off, and the other buckets compile the full forward's graphs instead."""
        graphs = self._graphs
        forks = forks and self.forks and self.plans_forks
        unchecked = (self.cached and (generate or top_decoding)) or forks
        for n in self.lengths:
            if self._buckets.idle(n):
                continue   # no planned row needs it (Buckets.fit): an unplanned row's, compiled if one comes
            rows = self.rows_for(n)
            if top_decoding and self.cached and graphs.top_cell is not None:
                _, _, cache = self.prefill_top([[0]], n)
                yield self.compiled_graphs
                self.decode_top([0], [0], cache)
                yield self.compiled_graphs
            zeros = np.zeros((rows, n), np.int32)
            if self.plans_scores or (unchecked and n >= cache_check.SHORTEST_BUCKET):
                self._score_batch(zeros, np.zeros((self.read_width(n), 3), np.int32))
                yield self.compiled_graphs
            capacity = self._buckets.generation_capacity(n)   # generation's cache (n unless fitted smaller)
            for size in sorted(({n} if forks else set()) | ({capacity} if generate and self.cached else set())):
                cache = self.network.init_cache(rows, size)
                chunk = min(size, PREFILL_CHUNK)
                _, cache = graphs.extend(np.zeros((rows, chunk), np.int32), np.zeros(rows, np.int32),
                                         np.zeros(rows, np.int32), cache)
                yield self.compiled_graphs
                if forks and size == n:
                    forked, piece = self.fork_rows(n), self.fork_piece
                    graphs.fork(cache, np.zeros(forked, np.int32), np.zeros((forked, piece), np.int32),
                                np.zeros(forked, np.int32), np.zeros((forked * piece, 3), np.int32))
                    graphs.fork_ready.add(n)
                    yield self.compiled_graphs
                if generate and self.cached and size == capacity:
                    graphs.extend(np.zeros((rows, 1), np.int32), np.zeros(rows, np.int32), np.zeros(rows, np.int32),
                                  cache)
                    yield self.compiled_graphs
            if unchecked and n >= cache_check.SHORTEST_BUCKET:
                unchecked = False
                self._check_cached(n, check_rows, generate, top_decoding, forks)
                forks = forks and self.forks
                yield self.compiled_graphs
            if generate and not self.cached:
                graphs.next_tokens(zeros, np.zeros(rows, np.int32))
                yield self.compiled_graphs
        if unchecked:
            log.warning("token scorer: %s's cached path is not checked against its full forward: its buckets %s are "
                        "shorter than the check needs (%d tokens)", type(self.network).__name__, list(self.lengths),
                        cache_check.SHORTEST_BUCKET)

    def _check_cached(self, n: int, rows: Sequence[Sequence[int]] | None, generate: bool, top_decoding: bool,
                      forks: bool) -> None:
        """The cached path that will run, checked against the full forward in bucket ``n`` (cache_check); on a
        mismatch it is turned off, with one ERROR naming the method and the difference."""
        decode, batch, capacity = None, self.rows_for(n), n
        if self.cached and generate:   # in generation's cache, fitted to the suite's requests (warming compiled it)
            decode, capacity = self._graphs.extend, self._buckets.generation_capacity(n)
        elif self.cached and top_decoding:
            decode, batch = self._top_choice, self.batch_size
        result = cache_check.run_check(rows, n, self._buckets, self._graphs, decode=decode, decode_batch=batch,
                                       decode_capacity=capacity, fork_piece=self.fork_piece if forks else None)
        turned_off = cache_check.report(result, type(self.network).__name__, (n, self.rows_for(n)))
        if "decoding" in turned_off:
            self.cached = False
        if turned_off:
            self.forks = False
            self._graphs.fork_ready.clear()

    def _top_choice(self, tokens: np.ndarray, start: np.ndarray, read: np.ndarray,
                    cache: Any) -> tuple[tuple[np.ndarray, np.ndarray], Any]:
        """Serving's cached step read as the check reads a decode step: each row's best token, its log-probability."""
        (values, ids), cache = self._graphs.extend_top(tokens, start, read, cache)
        return (ids[:, 0], values[:, 0]), cache

    # -- log-probabilities -----------------------------------------------------------------------------
    def score(self, requests: Sequence[ScoreRequest]) -> list[TokenScores]:
        ready = [prepared(r, self.max_length) for r in requests]
        forks, plain = self._split(ready, lambda p: forking.ready_bucket(self._buckets, self._graphs, p))
        forked = {i: (fork, k) for fork in forks for k, i in enumerate(fork.members)}
        got = score_rows([ready[i] for i in plain], self._buckets, self._score_batch, self.stats, self.top_k)
        got_by_request = dict(zip(plain, got))
        forking.score_forks(forks, self._buckets, self._graphs, self.fork_piece, self.top_k)
        results = []
        for i, (tokens, target, truncated, count) in enumerate(ready):
            if i in forked:
                fork, k = forked[i]
                values = fork.reads_of(k, tokens, target, count)
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

    def _split(self, ready: list[Prepared], fit: Callable[[int], int | None]) -> tuple[list[forking.Fork], list[int]]:
        """The forks among ``ready`` (``fit(positions)``: their bucket, or None) and the requests that run
        as rows: ``score`` fits forks to compiled fork graphs, ``plan_rows`` to any length that holds them."""
        forks = forking.plan_forks(ready, self.fork_piece, fit) if self.forks else []
        forked = {i for fork in forks for i in fork.members}
        return forks, [i for i in range(len(ready)) if i not in forked]

    def _score_batch(self, inputs: np.ndarray, reads: np.ndarray) -> list[np.ndarray]:
        """One forward of the scoring graph (bench/benchmarks.py wraps this to time or record the forwards)."""
        return self._graphs.score(inputs, reads)

    # -- greedy generation (evald.pipeline.engine.decoding) ---------------------------------------------
    def generate(self, requests: Sequence[GenerateRequest], eos_id: int | None = None) -> list[list[int]]:
        return decoding.generate(requests, eos_id, self._buckets, self._graphs, self.cached)

    def prefill_top(self, contexts: Sequence[Sequence[int]], capacity: int) -> tuple[np.ndarray, np.ndarray, Any]:
        """Prefill up to ``batch_size`` contexts into a new cache of ``capacity`` positions (one of ``lengths``);
        (ids (batch_size, k), log-probabilities (batch_size, k), cache): each row's next-token top k after its
        context (rows past ``len(contexts)`` are padding). Only for a CachedDecoder and ``top_k`` > 0."""
        if (not self.cached or self._graphs.top_cell is None or len(contexts) > self.batch_size
                or capacity not in self.lengths):
            raise ValueError(f"prefill_top needs a CachedDecoder, top_k > 0, at most {self.batch_size} contexts and "
                             f"a capacity of {list(self.lengths)}")
        return decoding.prefill_top(contexts, capacity, self.batch_size, self._graphs)

    def decode_top(self, tokens: Sequence[int], positions: Sequence[int],
                   cache: Any) -> tuple[np.ndarray, np.ndarray, Any]:
        """One token per row (padding past ``len(tokens)``) at its position (below the cache's capacity) into
        ``prefill_top``'s cache: (ids, log-probabilities, cache), the top k of the next token."""
        return decoding.decode_top(tokens, positions, cache, self.batch_size, self._graphs)
