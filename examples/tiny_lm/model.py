"""A small GPT-style causal language model, byte-level (vocabulary 256).

``build_model`` is the model factory evald calls (``examples.tiny_lm.model:build_model``):
it returns a Cell mapping int32 tokens (B, T) to logits (B, T, vocab).
Graph-mode code must live in a .py file, so this module is imported, not pasted.

``TinyGPT`` also implements evald's optional cached decoding (``init_cache`` / ``extend``,
evald.pipeline.tasks.generation.CachedDecoder): a static key/value cache of (layers, 2, B, heads,
capacity, d_head), so generation prefills a context once and then runs one token per row per step. Each
layer attends a chunk to the cache's positions before its start and to the chunk's own tokens up to
each one; every layer's keys and values are scattered into the cache once, at the end (the decode
step's cost on MindSpore's CPU is moving the cache: examples/kv_cache.py, shared with
examples/llm_decoder, holds that arithmetic). It also
implements evald's context forks (``extend_all`` / ``cache_rows``, CachedScorer), so that diverging
multi-token choices share their context's forward, and the head split (``hidden_states`` / ``extend_hidden``
and ``apply_head``, HeadSplit), so that evald runs the head only at the positions it reads.
"""

from __future__ import annotations

import math

import mindspore as ms
import numpy as np
from mindspore import nn, ops

from examples import kv_cache


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
        qkv = self.qkv(x).reshape(b, c, 3, self.n_heads, self.d_head).transpose(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]                                       # (B, H, c, dh)
        y = kv_cache.attend_chunk(q, k, v, keys, values, old_masked, chunk_masked, self.scale, self.scores)
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
        return self.apply_head(self.hidden_states(tokens))

    # -- evald's head split (evald.pipeline.tasks.generation.HeadSplit): the head only where it is read ------
    def hidden_states(self, tokens):
        """The final hidden states (B, T, d) of the full forward, before ``ln_f`` and the head."""
        t = tokens.shape[1]
        x = self.tok(tokens) + self.pos(self.positions[:t])
        for block in self.blocks:
            x = block(x)
        return x

    def apply_head(self, hidden):
        """The logits (..., vocab) of hidden states (..., d): ``ln_f`` and the head, position by position."""
        return self.head(self.ln_f(hidden))

    # -- evald's cached decoding (evald.pipeline.tasks.generation.CachedDecoder) ----------------------
    def init_cache(self, batch: int, capacity: int):
        return kv_cache.init_cache(self.n_layers, batch, self.n_heads, capacity, self.d_head)

    def extend(self, tokens, start, read, cache):
        b = tokens.shape[0]
        x, cache = self.extend_hidden(tokens, start, cache)
        where = read.reshape(b, 1, 1).broadcast_to((b, 1, x.shape[2]))
        last = ops.gather_elements(x, 1, where)                                # (B, 1, d): the head runs here only
        return self.apply_head(last).squeeze(1), cache

    def extend_hidden(self, tokens, start, cache):
        """The chunk's final hidden states (B, c, d), before ``ln_f``, and the cache with its keys and values
        written in (shared by ``extend`` and whatever else reads a chunk's hidden states)."""
        c, capacity = tokens.shape[1], cache.shape[4]
        positions = kv_cache.chunk_positions(start, c, capacity)
        old_masked, chunk_masked = kv_cache.attention_masks(start, c, capacity)
        kv = kv_cache.layer_caches(cache)
        x = self.tok(tokens) + self.pos(positions)
        written = []
        for i, block in enumerate(self.blocks):
            x, k, v = block.extend(x, old_masked, chunk_masked, kv[2 * i], kv[2 * i + 1])
            written += [k, v]
        return x, kv_cache.write_chunk(cache, written, positions)

    # -- evald's context forks (evald.pipeline.tasks.generation.CachedScorer) -------------------------
    def extend_all(self, tokens, start, cache):
        x, cache = self.extend_hidden(tokens, start, cache)
        return self.apply_head(x), cache

    def cache_rows(self, cache, rows):
        return kv_cache.cache_rows(cache, rows)


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
