"""A small GPT-style causal language model, byte-level (vocabulary 256).

``build_model`` is the model factory evald calls (``examples.tiny_lm.model:build_model``):
it returns a Cell mapping int32 tokens (B, T) to logits (B, T, vocab).
Graph-mode code must live in a .py file, so this module is imported, not pasted.

``TinyGPT`` also implements evald's optional cached decoding (``init_cache`` / ``extend``,
evald.pipeline.tasks.generation.CachedDecoder): a static key/value cache of (layers, 2, B, heads,
capacity, d_head), written at each token's position with a scatter, so generation prefills a context
once and then runs one token per row per step; and evald's context forks (``extend_all`` / ``cache_rows``,
CachedScorer), so that diverging multi-token choices share their context's forward.
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

    def construct(self, x):
        b, t, d = x.shape
        qkv = self.qkv(x).reshape(b, t, 3, self.n_heads, self.d_head).transpose(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        att = ops.matmul(q, k.transpose(0, 1, 3, 2)) * self.scale + self.mask[:t, :t]
        att = ops.softmax(att, axis=-1)
        y = ops.matmul(att, v).transpose(0, 2, 1, 3).reshape(b, t, d)
        return self.proj(y)

    def extend(self, x, positions, keys, values):
        """Tokens ``x`` (B, c, d) at ``positions`` (B, c) against a cache ``keys``/``values`` (B, H, C, dh):
        their output and the cache with their keys and values written in."""
        b, c, d = x.shape
        capacity = keys.shape[2]
        qkv = self.qkv(x).reshape(b, c, 3, self.n_heads, self.d_head).transpose(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]                                       # (B, H, c, dh)
        where = positions.reshape(b, 1, c, 1).broadcast_to((b, self.n_heads, c, self.d_head))
        keys = ops.tensor_scatter_elements(keys, where, k, axis=2)
        values = ops.tensor_scatter_elements(values, where, v, axis=2)
        later = ops.arange(capacity).reshape(1, 1, 1, capacity) > positions.reshape(b, 1, c, 1)
        att = ops.matmul(q, keys.transpose(0, 1, 3, 2)) * self.scale + later.astype(ms.float32) * -1e9
        att = ops.softmax(att, axis=-1)
        y = ops.matmul(att, values).transpose(0, 2, 1, 3).reshape(b, c, d)
        return self.proj(y), keys, values


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

    def extend(self, x, positions, keys, values):
        y, keys, values = self.attn.extend(self.ln1(x), positions, keys, values)
        x = x + y
        return x + self.mlp(self.ln2(x)), keys, values


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

    def _extend_hidden(self, tokens, start, cache):
        """The chunk's final hidden states (B, c, d) and the cache with its keys and values written in."""
        b, c = tokens.shape
        capacity = cache.shape[4]
        positions = ops.minimum(start.reshape(b, 1) + ops.arange(c).reshape(1, c).astype(start.dtype),
                                capacity - 1)                                  # padding clamps to the end
        x = self.tok(tokens) + self.pos(positions)
        layers = []
        for i, block in enumerate(self.blocks):
            x, keys, values = block.extend(x, positions, cache[i, 0], cache[i, 1])
            layers.append(ops.stack((keys, values)))
        return x, ops.stack(layers)

    def extend(self, tokens, start, read, cache):
        x, cache = self._extend_hidden(tokens, start, cache)
        b = tokens.shape[0]
        where = read.reshape(b, 1, 1).broadcast_to((b, 1, x.shape[2]))
        last = ops.gather_elements(x, 1, where)                                # (B, 1, d): the head runs here only
        return self.head(self.ln_f(last)).squeeze(1), cache

    # -- evald's context forks (evald.pipeline.tasks.generation.CachedScorer) -------------------------
    def extend_all(self, tokens, start, cache):
        x, cache = self._extend_hidden(tokens, start, cache)
        return self.head(self.ln_f(x)), cache

    def cache_rows(self, cache, rows):
        return ops.gather(cache, rows, 2)                                      # (layers, 2, B, H, C, dh)


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
