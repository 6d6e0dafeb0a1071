"""An LLM-shaped decoder (LLaMA-style: RMSNorm, rotary positions, SwiGLU, no biases) with evald's
cached decoding, for benchmarks at LLM shapes (bench/llm_shapes.py) and as the reference
implementation of evald.pipeline.tasks.generation.CachedDecoder.

``build_model`` is the model factory evald calls (``examples.llm_decoder.model:build_model``): it
returns a Cell mapping int32 tokens (B, T) to logits (B, T, vocab) for T <= max_length, and
implementing

* ``init_cache(batch, capacity)``: zeros of (layers, 2, batch, heads, capacity, d_head), float32;
* ``extend(tokens, start, read, cache)``: (B, c) tokens at positions ``start[b] + i`` (clamped to
  capacity - 1, so padding never indexes out of range); each layer attends every query to the cache's
  positions before ``start[b]`` and to the chunk's tokens up to its own (the positions up to its own),
  and the chunk's keys and values of every layer are scattered into the cache once, at the end; the
  head runs at chunk index ``read[b]`` only. Returns ((B, vocab) logits, new cache);
* ``extend_all(tokens, start, cache)``: the same with the head at every position ((B, c, vocab) logits),
  and ``cache_rows(cache, rows)``: the cache's rows ``rows`` (evald's context forks,
  evald.pipeline.tasks.generation.CachedScorer);
* ``hidden_states(tokens)`` / ``extend_hidden(tokens, start, cache)`` and ``apply_head(hidden)``: the trunk
  and the head apart (evald.pipeline.tasks.generation.HeadSplit), so that evald runs the 32,000-wide head
  only at the positions it reads (``forward = apply_head(hidden_states(tokens))``).

The decode step's cost on MindSpore's CPU is moving the cache, not arithmetic (a step is ~10 MFLOP):
the cache is read by one unstack (a strided slice ``cache[i, 0]`` per layer copied it several times
slower), the scores use ``transpose_b`` (no transposed copy of the keys), and there is one write of
the cache per call instead of a scatter per layer and a restack (bench/decode_step.py, docs/performance.md).
That cache arithmetic is examples/kv_cache.py, shared with examples/tiny_lm; this file holds the model.

The full forward and ``extend`` share every weight and the same per-position arithmetic, so the
cached logits equal the full forward's up to float rounding (tests/unit/pipeline/test_llm_decoder.py).
Independent of examples/llama_tp (a tensor-parallel model for eval groups).
"""

from __future__ import annotations

import math

import mindspore as ms
import numpy as np
from mindspore import nn, ops

from examples import kv_cache


class RMSNorm(nn.Cell):
    def __init__(self, d_model: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = ms.Parameter(ms.Tensor(np.ones(d_model, np.float32)), name="weight")
        self.eps = eps

    def construct(self, x):
        return x * ops.rsqrt((x * x).mean(-1, keep_dims=True) + self.eps) * self.weight


def rotate(x, cos, sin):
    """Rotary embedding of x (B, H, c, dh) with cos/sin (B, 1, c, dh/2) at each token's position."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return ops.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), -1)


class Attention(nn.Cell):
    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads, self.d_head = n_heads, d_model // n_heads
        self.wq = nn.Dense(d_model, d_model, has_bias=False)
        self.wk = nn.Dense(d_model, d_model, has_bias=False)
        self.wv = nn.Dense(d_model, d_model, has_bias=False)
        self.wo = nn.Dense(d_model, d_model, has_bias=False)
        self.scale = 1.0 / math.sqrt(self.d_head)
        self.scores = ops.BatchMatMul(transpose_b=True)

    def heads(self, x, cos, sin):
        b, c, _ = x.shape
        split = lambda t: t.reshape(b, c, self.n_heads, self.d_head).transpose(0, 2, 1, 3)  # noqa: E731
        return rotate(split(self.wq(x)), cos, sin), rotate(split(self.wk(x)), cos, sin), split(self.wv(x))

    def attend(self, q, keys, values, masked):
        b, _, c, _ = q.shape
        att = ops.matmul(q, keys.transpose(0, 1, 3, 2)) * self.scale + masked * -1e9
        y = ops.matmul(ops.softmax(att, axis=-1), values)
        return self.wo(y.transpose(0, 2, 1, 3).reshape(b, c, self.n_heads * self.d_head))

    def construct(self, x, cos, sin, masked):
        q, k, v = self.heads(x, cos, sin)
        return self.attend(q, k, v, masked)

    def extend(self, x, cos, sin, old_masked, chunk_masked, keys, values):
        """The chunk ``x`` (B, c, d) against the cache ``keys``/``values`` (B, H, C, dh) as it was before the
        chunk (``old_masked`` (B, 1, 1, C): 1 at the positions the chunk does not see) and against its own keys
        and values (``chunk_masked`` (1, 1, c, c): 1 above the diagonal): the output and the chunk's keys and
        values (B, H, c, dh), which the caller writes into the cache once for every layer."""
        q, k, v = self.heads(x, cos, sin)
        b, _, c, _ = q.shape
        y = kv_cache.attend_chunk(q, k, v, keys, values, old_masked, chunk_masked, self.scale, self.scores)
        return self.wo(y.transpose(0, 2, 1, 3).reshape(b, c, self.n_heads * self.d_head)), k, v


class Block(nn.Cell):
    def __init__(self, d_model: int, n_heads: int, d_ffn: int) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(d_model)
        self.attn = Attention(d_model, n_heads)
        self.ffn_norm = RMSNorm(d_model)
        self.gate = nn.Dense(d_model, d_ffn, has_bias=False)
        self.up = nn.Dense(d_model, d_ffn, has_bias=False)
        self.down = nn.Dense(d_ffn, d_model, has_bias=False)

    def ffn(self, x):
        h = self.ffn_norm(x)
        return self.down(ops.silu(self.gate(h)) * self.up(h))

    def construct(self, x, cos, sin, masked):
        x = x + self.attn(self.attn_norm(x), cos, sin, masked)
        return x + self.ffn(x)

    def extend(self, x, cos, sin, old_masked, chunk_masked, keys, values):
        y, k, v = self.attn.extend(self.attn_norm(x), cos, sin, old_masked, chunk_masked, keys, values)
        x = x + y
        return x + self.ffn(x), k, v


class LlamaDecoder(nn.Cell):
    def __init__(self, vocab_size: int = 32000, d_model: int = 512, n_layers: int = 8, n_heads: int = 8,
                 d_ffn: int | None = None, max_length: int = 2048, rope_base: float = 10000.0) -> None:
        super().__init__()
        d_ffn = d_ffn or int(8 * d_model / 3 + 63) // 64 * 64
        self.embed = nn.Embedding(vocab_size, d_model)
        self.blocks = nn.CellList([Block(d_model, n_heads, d_ffn) for _ in range(n_layers)])
        self.norm = RMSNorm(d_model)
        self.head = nn.Dense(d_model, vocab_size, has_bias=False)
        d_head = d_model // n_heads
        angles = np.outer(np.arange(max_length), rope_base ** (-np.arange(0, d_head, 2) / d_head))
        self.cos_table = ms.Tensor(np.cos(angles).astype(np.float32))      # (max_length, d_head / 2)
        self.sin_table = ms.Tensor(np.sin(angles).astype(np.float32))
        self.max_length, self.vocab_size = max_length, vocab_size
        self.n_layers, self.n_heads, self.d_head = n_layers, n_heads, d_head

    def rotary(self, positions):
        """cos, sin (B, 1, c, dh/2) at ``positions`` (B, c)."""
        return ops.gather(self.cos_table, positions, 0).expand_dims(1), ops.gather(self.sin_table, positions, 0).expand_dims(1)

    def construct(self, tokens):
        return self.apply_head(self.hidden_states(tokens))

    # -- evald's head split (evald.pipeline.tasks.generation.HeadSplit): the head only where it is read ------
    def hidden_states(self, tokens):
        """The final hidden states (B, T, d) of the full forward, before the final norm and the head."""
        _, t = tokens.shape
        positions = ops.arange(t).reshape(1, t).astype(ms.int32)
        cos, sin = self.rotary(positions)
        masked = (ops.arange(t).reshape(1, t) > ops.arange(t).reshape(t, 1)).astype(ms.float32)
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, cos, sin, masked)
        return x

    def apply_head(self, hidden):
        """The logits (..., vocab) of hidden states (..., d): the final norm and the head, position by position."""
        return self.head(self.norm(hidden))

    # -- evald's cached decoding (evald.pipeline.tasks.generation.CachedDecoder) ----------------------
    def init_cache(self, batch: int, capacity: int):
        return kv_cache.init_cache(self.n_layers, batch, self.n_heads, capacity, self.d_head)

    def extend(self, tokens, start, read, cache):
        b = tokens.shape[0]
        x, cache = self.extend_hidden(tokens, start, cache)
        last = ops.gather_elements(x, 1, read.reshape(b, 1, 1).broadcast_to((b, 1, x.shape[2])))
        return self.apply_head(last).squeeze(1), cache

    def extend_hidden(self, tokens, start, cache):
        """The chunk's final hidden states (B, c, d), before the final norm, and the cache with its keys and
        values written in (shared by ``extend`` and whatever else reads a chunk's hidden states)."""
        c, capacity = tokens.shape[1], cache.shape[4]
        positions = kv_cache.chunk_positions(start, c, capacity)
        cos, sin = self.rotary(positions)
        old_masked, chunk_masked = kv_cache.attention_masks(start, c, capacity)
        kv = kv_cache.layer_caches(cache)
        x = self.embed(tokens)
        written = []
        for i, block in enumerate(self.blocks):
            x, k, v = block.extend(x, cos, sin, old_masked, chunk_masked, kv[2 * i], kv[2 * i + 1])
            written += [k, v]
        return x, kv_cache.write_chunk(cache, written, positions)

    # -- evald's context forks (evald.pipeline.tasks.generation.CachedScorer) -------------------------
    def extend_all(self, tokens, start, cache):
        x, cache = self.extend_hidden(tokens, start, cache)
        return self.apply_head(x), cache

    def cache_rows(self, cache, rows):
        return kv_cache.cache_rows(cache, rows)


def build_model(vocab_size: int = 32000, d_model: int = 512, n_layers: int = 8, n_heads: int = 8,
                d_ffn: int | None = None, max_length: int = 2048, seed: int = 0) -> LlamaDecoder:
    """The model factory. ``seed`` fixes the initial weights (evald overwrites them anyway)."""
    ms.set_seed(seed)
    np.random.seed(seed)
    return LlamaDecoder(vocab_size, d_model, n_layers, n_heads, d_ffn, max_length)
