"""The demo GPT built in Graph mode for in-process tests (the pipeline's scorer and evald --serve run on it);
the previous execution mode is restored afterwards."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import mindspore as ms

from examples.tiny_lm.model import build_model


@contextmanager
def demo_network_in_graph_mode(seed: int, seq_len: int = 64) -> Iterator[ms.nn.Cell]:
    before = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE)
    net = build_model(seq_len=seq_len, seed=seed)
    net.set_train(False)
    try:
        yield net
    finally:
        ms.set_context(mode=before)


class _ForwardOnly(ms.nn.Cell):
    def __init__(self, inner: ms.nn.Cell) -> None:
        super().__init__()
        self.inner = inner
        self.max_length = inner.max_length

    def construct(self, tokens):
        return self.inner(tokens)


class _WholeHead(_ForwardOnly):
    """The same network, cached decoding and forks included, without the head split: the full head everywhere."""

    def init_cache(self, batch, capacity):
        return self.inner.init_cache(batch, capacity)

    def extend(self, tokens, start, read, cache):
        return self.inner.extend(tokens, start, read, cache)

    def extend_all(self, tokens, start, cache):
        return self.inner.extend_all(tokens, start, cache)

    def cache_rows(self, cache, rows):
        return self.inner.cache_rows(cache, rows)


def without_head_split(network: ms.nn.Cell) -> ms.nn.Cell:
    """The same network without ``hidden_states``/``apply_head``/``extend_hidden`` (HeadSplit): what a network
    that does not split its head looks like to evald, which then runs the head at every position."""
    return _WholeHead(network)


def without_cached_decoding(network: ms.nn.Cell) -> ms.nn.Cell:
    """The same network without its cached-decoding methods (init_cache, extend): what a network without
    the interface looks like to evald, which then generates with the full forward."""
    return _ForwardOnly(network)


class ShiftedCache(ms.nn.Cell):
    """The demo network with its cached methods off by one position (``start + 1``), as a real bug in a
    model's cached path would be: ``extend`` (decoding, and every prefill) and ``extend_all`` (forks), or with
    ``forks_only`` ``extend_all`` alone. A deliberately wrong implementation whose full forward is right
    (evald.pipeline.engine.cache_check must catch it)."""

    def __init__(self, inner: ms.nn.Cell, forks_only: bool = False) -> None:
        super().__init__()
        self.inner = inner
        self.max_length = inner.max_length
        self.decode_shift = 0 if forks_only else 1

    def construct(self, tokens):
        return self.inner(tokens)

    def init_cache(self, batch: int, capacity: int):
        return self.inner.init_cache(batch, capacity)

    def extend(self, tokens, start, read, cache):
        return self.inner.extend(tokens, start + self.decode_shift, read, cache)

    def extend_all(self, tokens, start, cache):
        return self.inner.extend_all(tokens, start + 1, cache)

    def cache_rows(self, cache, rows):
        return self.inner.cache_rows(cache, rows)


def wrongly_cached(network: ms.nn.Cell, forks_only: bool = False) -> ms.nn.Cell:
    """The same network with a wrong cached implementation (ShiftedCache)."""
    return ShiftedCache(network, forks_only)


class NoNetworkYet:
    """What evald --serve's Serving is given before the first checkpoint is swapped in: no network to serve."""

    network = None
    tensor_parallel = False

    def held(self) -> None:
        return None

    def group_scorer(self, scorer):
        return scorer
