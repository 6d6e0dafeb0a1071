"""A small GPT-style causal language model, byte-level (vocabulary 256).

``build_model`` is the model factory evald calls (``examples.tiny_lm.model:build_model``):
it returns a Cell mapping int32 tokens (B, T) to logits (B, T, vocab).
Graph-mode code must live in a .py file, so this module is imported, not pasted.

``TinyGPT`` also implements evald's optional cached decoding (``init_cache`` / ``extend``,
evald.pipeline.tasks.generation.CachedDecoder): a static key/value cache of (layers, 2, B, heads,
capacity, d_head), so generation prefills a context once and then runs one token per row per step. Each
layer attends a chunk to the cache's positions before its start and to the chunk's own tokens up to
each one; every layer's keys and values are scattered into the cache once, at the end (the decode
step's cost on MindSpore's CPU is moving the cache: see examples/llm_decoder/model.py). It also
implements evald's context forks (``extend_all`` / ``cache_rows``, CachedScorer), so that diverging
multi-token choices share their context's forward.
"""

from __future__ import annotations

import math

import mindspore as ms
import numpy as np
from mindspore import nn, ops


class CausalSelfAttention(nn.Cell):
    def __init__(self, d_model: int, n_heads: int, seq_len: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.d_head = d_model // n_heads
        self.qkv = nn.Dense(d_model, 3 * d_model)
        self.proj = nn.Dense(d_model, d_model)
        mask = np.triu(np.full((seq_len, seq_len), -1e9, dtype=np.float32), k=1)
        self.mask = ms.Tensor(mask)
        self.scale = 1.0 / math.sqrt(self.d_head)
        self.scores = ops.BatchMatMul(transpose_b=True)

    def construct(self, x):
        b, t, d = x.shape
        qkv = self.qkv(x).reshape(b, t, 3, self.n_heads, self.d_head).transpose(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        att = ops.matmul(q, k.transpose(0, 1, 3, 2)) * self.scale + self.mask[:t, :t]
        att = ops.softmax(att, axis=-1)
        y = ops.matmul(att, v).transpose(0, 2, 1, 3).reshape(b, t, d)
        return self.proj(y)

    def extend(self, x, old_masked, chunk_masked, keys, values):
        """Tokens ``x`` (B, c, d) against the cache ``keys``/``values`` (B, H, C, dh) as it was before the chunk
        (``old_masked`` (B, 1, 1, C): 1 at the positions the chunk does not see) and against their own keys and
        values (``chunk_masked`` (1, 1, c, c): 1 above the diagonal): their output and their keys and values
        (B, H, c, dh), which the caller writes into the cache once for every layer."""
        b, c, d = x.shape
        capacity = keys.shape[2]
        qkv = self.qkv(x).reshape(b, c, 3, self.n_heads, self.d_head).transpose(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]                                       # (B, H, c, dh)
        # two score blocks, not one over a cache with the chunk written in: no per-layer copy of the cache;
        # transpose_b: no transposed copy of the keys
        old = self.scores(q, keys) * self.scale + old_masked * -1e9
        own = self.scores(q, k) * self.scale + chunk_masked * -1e9
        att = ops.softmax(ops.cat((old, own), -1), axis=-1)
        y = ops.matmul(att[..., :capacity], values) + ops.matmul(att[..., capacity:], v)
        return self.proj(y.transpose(0, 2, 1, 3).reshape(b, c, d)), k, v


class Block(nn.Cell):
    def __init__(self, d_model: int, n_heads: int, seq_len: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm((d_model,))
        self.attn = CausalSelfAttention(d_model, n_heads, seq_len)
        self.ln2 = nn.LayerNorm((d_model,))
        self.mlp = nn.SequentialCell(nn.Dense(d_model, 4 * d_model), nn.GELU(), nn.Dense(4 * d_model, d_model))

    def construct(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))

    def extend(self, x, old_masked, chunk_masked, keys, values):
        y, k, v = self.attn.extend(self.ln1(x), old_masked, chunk_masked, keys, values)
        x = x + y
        return x + self.mlp(self.ln2(x)), k, v


class TinyGPT(nn.Cell):
    def __init__(self, vocab_size: int = 256, d_model: int = 96, n_layers: int = 2, n_heads: int = 4,
                 seq_len: int = 64) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Embedding(seq_len, d_model)
        self.blocks = nn.CellList([Block(d_model, n_heads, seq_len) for _ in range(n_layers)])
        self.ln_f = nn.LayerNorm((d_model,))
        self.head = nn.Dense(d_model, vocab_size)
        self.positions = ms.Tensor(np.arange(seq_len, dtype=np.int32))
        self.max_length = seq_len  # the longest input; benchmarks left-truncate to it (evald.pipeline.suites.scoring)
        self.n_layers, self.n_heads, self.d_head = n_layers, n_heads, d_model // n_heads

    def construct(self, tokens):
        t = tokens.shape[1]
        x = self.tok(tokens) + self.pos(self.positions[:t])
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))

    # -- evald's cached decoding (evald.pipeline.tasks.generation.CachedDecoder) ----------------------
    def init_cache(self, batch: int, capacity: int):
        return ops.zeros((self.n_layers, 2, batch, self.n_heads, capacity, self.d_head), ms.float32)

    def extend(self, tokens, start, read, cache):
        b = tokens.shape[0]
        x, cache = self._extend_hidden(tokens, start, cache)
        where = read.reshape(b, 1, 1).broadcast_to((b, 1, x.shape[2]))
        last = ops.gather_elements(x, 1, where)                                # (B, 1, d): the head runs here only
        return self.head(self.ln_f(last)).squeeze(1), cache

    def _extend_hidden(self, tokens, start, cache):
        """The chunk's final hidden states (B, c, d), before ``ln_f``, and the cache with its keys and values
        written in (shared by ``extend`` and whatever else reads a chunk's hidden states)."""
        b, c = tokens.shape
        layers, _, _, heads, capacity, d_head = cache.shape
        positions = ops.minimum(start.reshape(b, 1) + ops.arange(c).reshape(1, c).astype(start.dtype),
                                capacity - 1)                                  # padding clamps to the end
        old_masked, chunk_masked = attention_masks(start, c, capacity)
        # unstack, not cache[i, 0]: on MindSpore's CPU a strided slice of the cache copies it slowly
        # (bench/decode_step.py)
        kv = ops.unstack(cache.reshape((layers * 2,) + cache.shape[2:]), 0)
        x = self.tok(tokens) + self.pos(positions)
        written = []
        for i, block in enumerate(self.blocks):
            x, k, v = block.extend(x, old_masked, chunk_masked, kv[2 * i], kv[2 * i + 1])
            written += [k, v]
        chunk = ops.stack(written).reshape(layers, 2, b, heads, c, d_head)
        where = positions.reshape(1, 1, b, 1, c, 1).broadcast_to(chunk.shape)
        return x, ops.tensor_scatter_elements(cache, where, chunk, axis=4)   # one write of the whole cache

    # -- evald's context forks (evald.pipeline.tasks.generation.CachedScorer) -------------------------
    def extend_all(self, tokens, start, cache):
        x, cache = self._extend_hidden(tokens, start, cache)
        return self.head(self.ln_f(x)), cache

    def cache_rows(self, cache, rows):
        return ops.gather(cache, rows, 2)                                      # (layers, 2, B, H, C, dh)


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


class LMLoss(nn.Cell):
    """Mean next-token cross-entropy; ``window`` is (B, T+1) tokens."""

    def __init__(self, model: nn.Cell) -> None:
        super().__init__()
        self.model = model
        self.ce = nn.CrossEntropyLoss()

    def construct(self, window):
        inputs = window[:, :-1]
        targets = window[:, 1:]
        logits = self.model(inputs)
        return self.ce(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def build_model(vocab_size: int = 256, d_model: int = 96, n_layers: int = 2, n_heads: int = 4,
                seq_len: int = 64, seed: int = 0) -> TinyGPT:
    """The model factory. ``seed`` fixes the initial weights (evald overwrites them anyway)."""
    ms.set_seed(seed)
    return TinyGPT(vocab_size, d_model, n_layers, n_heads, seq_len)
