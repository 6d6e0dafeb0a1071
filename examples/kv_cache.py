"""The static key/value cache of the example decoders: the arithmetic both share (examples/tiny_lm,
examples/llm_decoder), so that each model's file holds only what is its own.

The cache is one tensor of (layers, 2, B, heads, capacity, d_head): for each layer its keys and values.
A call runs a chunk of c tokens per row from ``start`` (B,), against the cache as it was before the chunk
and against the chunk's own keys and values, then writes every layer's keys and values into the cache
at once. The functions run inside MindSpore graphs (they are called from a Cell's ``construct``), so they
use only ``ops`` and shapes. Why it is laid out so: the decode step's cost on MindSpore's CPU is moving
the cache, not arithmetic (bench/decode_step.py, docs/performance.md).

May import: mindspore only.
"""

from __future__ import annotations

import mindspore as ms
from mindspore import ops


def init_cache(layers: int, batch: int, heads: int, capacity: int, d_head: int):
    """Zeros of (layers, 2, batch, heads, capacity, d_head), float32."""
    return ops.zeros((layers, 2, batch, heads, capacity, d_head), ms.float32)


def chunk_positions(start, c: int, capacity: int):
    """The positions (B, c) of a chunk of c tokens at ``start`` (B,), clamped to capacity - 1, so that
    padding never indexes out of range."""
    b = start.shape[0]
    return ops.minimum(start.reshape(b, 1) + ops.arange(c).reshape(1, c).astype(start.dtype), capacity - 1)


def attention_masks(start, c: int, capacity: int):
    """What a chunk of c tokens at ``start`` (B,) does not see, as 1.0: the cache's positions from the row's
    start on (B, 1, 1, capacity), which hold nothing of this row yet or are the chunk's own, and the chunk's
    later tokens (1, 1, c, c). Each token sees the cache's positions before ``start`` and the chunk's tokens
    up to itself: the positions up to its own, as the full forward does."""
    b = start.shape[0]
    old = ops.arange(capacity).reshape(1, 1, 1, capacity) >= start.reshape(b, 1, 1, 1).astype(ms.int64)
    index = ops.arange(c)
    own = index.reshape(1, 1, 1, c) > index.reshape(1, 1, c, 1)
    return old.astype(ms.float32), own.astype(ms.float32)


def layer_caches(cache):
    """The cache as 2 x layers tensors (B, H, C, dh): layer i's keys at 2i, its values at 2i + 1. One
    unstack, not ``cache[i, 0]``: on MindSpore's CPU a strided slice of the cache copies it slowly."""
    layers = cache.shape[0]
    return ops.unstack(cache.reshape((layers * 2,) + cache.shape[2:]), 0)


def attend_chunk(q, k, v, keys, values, old_masked, chunk_masked, scale: float, scores):
    """The chunk's queries ``q`` (B, H, c, dh) against the cache's ``keys``/``values`` (B, H, C, dh) as it
    was before the chunk (``old_masked``) and against the chunk's own ``k``/``v`` (``chunk_masked``): the
    attention output (B, H, c, dh). ``scores`` is a batch matmul with ``transpose_b`` (a transposed copy of
    the keys costs more than the product). Two score blocks, not one over a cache with the chunk written
    in: no per-layer copy of the cache."""
    old = scores(q, keys) * scale + old_masked * -1e9
    own = scores(q, k) * scale + chunk_masked * -1e9
    p = ops.softmax(ops.cat((old, own), -1), axis=-1)
    capacity = keys.shape[2]
    return ops.matmul(p[..., :capacity], values) + ops.matmul(p[..., capacity:], v)


def write_chunk(cache, written, positions):
    """``cache`` with the chunk's keys and values written at each row's ``positions`` (B, c): ``written`` is
    [keys, values] of every layer in order, each (B, H, c, dh). One scatter into the whole cache per call,
    not one per layer and a restack (a select of the cache's one position per row was no faster)."""
    layers, _, b, heads, _, d_head = cache.shape
    c = positions.shape[1]
    chunk = ops.stack(written).reshape(layers, 2, b, heads, c, d_head)
    where = positions.reshape(1, 1, b, 1, c, 1).broadcast_to(chunk.shape)
    return ops.tensor_scatter_elements(cache, where, chunk, axis=4)


def cache_rows(cache, rows):
    """A cache whose row b is row ``rows[b]`` of ``cache`` (evald's context forks)."""
    return ops.gather(cache, rows, 2)
