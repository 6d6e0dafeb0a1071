"""A LLaMA-style decoder, Megatron tensor-parallel on N ranks with AllReduce SUM as its only collective.

``build_model`` is the model factory evald calls (``examples.llama_tp.model:build_model``). In a
tensor-parallel eval group (``evald --device 0,1,2,3 --tensor-parallel 4``) evald sets
``EVALD_TP_DEGREE`` and ``EVALD_TP_RANK`` before calling it, and the factory builds that rank's shard:

* column-parallel ``q``, ``k``, ``v`` (this rank's heads) and ``gate``, ``up``: 1/N of the output rows;
* row-parallel ``o`` and ``down``: 1/N of the input columns, their partial outputs summed (AllReduce);
* vocabulary-parallel ``embed`` and ``head``: 1/N of the vocabulary rows. The embedding looks up the
  tokens of its vocabulary range (zeros elsewhere) and the ranks' rows are summed. The head computes
  the logits of its vocabulary range, and ``logits`` puts them into a full-vocabulary tensor of zeros
  that the ranks sum: with exactly one non-zero contributor per value the SUM is exact, an AllGather
  built from the one reduction MindSpore's CPU backend has (MAX is refused there, docs/eval-group.md);
* RMSNorm weights replicated; learned positions (replicated) instead of RoPE, to stay small.

``vocab_parallel_nll`` is the vocabulary-parallel loss for training on such a shard without
gathering the logits. The global max shift is computed without a MAX reduction: each rank writes
its local max (stop-gradient) into its own slot of an N-vector, the ranks sum it, and every rank
takes the max of the N values. Then the ranks sum exp(z - max) and the target's logit (only its
owner contributes).

With degree 1 there is no collective at all. The parameters' names and whole shapes are the same
at every degree, so a checkpoint of any layout (whole, evald's parts at any TP degree, MindFormers'
Checkpoint 2.0) fits every degree: evald gives each rank its slice (evald/pipeline/swap/tp_load.py).
"""

from __future__ import annotations

import math
import os

import mindspore as ms
import numpy as np
from mindspore import nn, ops

# Which dimension each weight is cut along across tensor-parallel ranks (None: replicated).
# Names are the parameters' paths in the network (``layers.0.q``, ``norm.weight``), as evald sees them.
CUT_DIMS = {"embed": 0, "q": 0, "k": 0, "v": 0, "o": 1, "gate": 0, "up": 0, "down": 1, "head": 0}


def cut_dim(name: str) -> int | None:
    return next((d for suffix, d in CUT_DIMS.items() if name == suffix or name.endswith("." + suffix)), None)


def tp_from_env() -> tuple[int, int]:
    """(degree, rank) as evald gives them to the model factory; (1, 0) outside a tensor-parallel group."""
    return int(os.environ.get("EVALD_TP_DEGREE", "1")), int(os.environ.get("EVALD_TP_RANK", "0"))


def slice_for(name: str, array: np.ndarray, degree: int, rank: int) -> np.ndarray:
    """Rank ``rank``'s slice of the whole weight ``array`` (Megatron's rule, CUT_DIMS)."""
    dim = cut_dim(name.rpartition(".")[2] if "." in name else name)
    if degree == 1 or dim is None:
        return array
    width = array.shape[dim] // degree
    index = [slice(None)] * array.ndim
    index[dim] = slice(rank * width, (rank + 1) * width)
    return np.ascontiguousarray(array[tuple(index)])


def _param(name: str, shape: tuple[int, ...], rng: np.random.Generator, scale: float, degree: int, rank: int
           ) -> ms.Parameter:
    """The whole weight drawn (the same draws at every degree), this rank's slice kept."""
    whole = (rng.standard_normal(shape) * scale).astype(np.float32)
    return ms.Parameter(ms.Tensor(slice_for(name, whole, degree, rank)), name=name)


class _Sum(nn.Cell):
    """Megatron's g: AllReduce SUM over the tensor-parallel ranks forward, identity backward (the value is
    replicated after it, so each rank's gradient of it is already the whole one); nothing with one rank."""

    def __init__(self, degree: int) -> None:
        super().__init__()
        self.degree = degree
        self.all_reduce = ops.AllReduce() if degree > 1 else None

    def construct(self, x):
        if self.degree > 1:
            return self.all_reduce(x)
        return x

    def bprop(self, x, out, dout):
        return (dout,)


class _Copy(nn.Cell):
    """Megatron's f: identity forward into a tensor-parallel layer, AllReduce SUM of the gradient backward
    (each rank's layer sees only its slice's share of the input's gradient)."""

    def __init__(self, degree: int) -> None:
        super().__init__()
        self.degree = degree
        self.all_reduce = ops.AllReduce() if degree > 1 else None

    def construct(self, x):
        return x

    def bprop(self, x, out, dout):
        if self.degree > 1:
            return (self.all_reduce(dout),)
        return (dout,)


class RMSNorm(nn.Cell):
    def __init__(self, name: str, hidden: int) -> None:
        super().__init__()
        self.weight = ms.Parameter(ms.Tensor(np.ones(hidden, np.float32)), name=f"{name}.weight")

    def construct(self, x):
        return x * ops.rsqrt(ops.mean(x * x, -1, keep_dims=True) + 1e-6) * self.weight


class Layer(nn.Cell):
    def __init__(self, i: int, hidden: int, heads: int, ffn: int, seq_len: int, degree: int, rank: int,
                 rng: np.random.Generator) -> None:
        super().__init__()
        p, s = f"layers.{i}.", 1.0 / math.sqrt(hidden)
        self.local_heads, self.d_head = heads // degree, hidden // heads
        self.attn_norm, self.ffn_norm = RMSNorm(p + "attn_norm", hidden), RMSNorm(p + "ffn_norm", hidden)
        self.q, self.k, self.v = (_param(p + n, (hidden, hidden), rng, s, degree, rank)
                                  for n in ("q", "k", "v"))
        self.o = _param(p + "o", (hidden, hidden), rng, s, degree, rank)
        self.gate, self.up = (_param(p + n, (ffn, hidden), rng, s, degree, rank) for n in ("gate", "up"))
        self.down = _param(p + "down", (hidden, ffn), rng, 1.0 / math.sqrt(ffn), degree, rank)
        self.mask = ms.Tensor(np.triu(np.full((seq_len, seq_len), -1e9, np.float32), k=1))
        self.scale = 1.0 / math.sqrt(self.d_head)
        self.sum, self.copy_attn, self.copy_ffn = _Sum(degree), _Copy(degree), _Copy(degree)

    def construct(self, x):
        b, t, _ = x.shape
        h = self.copy_attn(self.attn_norm(x))
        q = ops.matmul(h, self.q.T).reshape(b, t, self.local_heads, self.d_head).transpose(0, 2, 1, 3)
        k = ops.matmul(h, self.k.T).reshape(b, t, self.local_heads, self.d_head).transpose(0, 2, 1, 3)
        v = ops.matmul(h, self.v.T).reshape(b, t, self.local_heads, self.d_head).transpose(0, 2, 1, 3)
        att = ops.softmax(ops.matmul(q, k.transpose(0, 1, 3, 2)) * self.scale + self.mask[:t, :t], axis=-1)
        y = ops.matmul(att, v).transpose(0, 2, 1, 3).reshape(b, t, self.local_heads * self.d_head)
        x = x + self.sum(ops.matmul(y, self.o.T))                                    # row parallel
        h = self.copy_ffn(self.ffn_norm(x))
        z = ops.silu(ops.matmul(h, self.gate.T)) * ops.matmul(h, self.up.T)          # column parallel
        return x + self.sum(ops.matmul(z, self.down.T))                              # row parallel


class LlamaTP(nn.Cell):
    """Tokens (B, T) int32 to full-vocabulary logits (B, T, V) on every rank."""

    def __init__(self, vocab: int, hidden: int, layers: int, heads: int, ffn: int, seq_len: int, degree: int,
                 rank: int, seed: int) -> None:
        super().__init__()
        for what, size in (("vocab", vocab), ("hidden", hidden), ("heads", heads), ("ffn", ffn)):
            if size % degree:
                raise ValueError(f"{what} {size} cannot be cut into {degree} equal tensor-parallel slices")
        rng = np.random.default_rng(seed)  # the same draws at every degree: each rank keeps its slice
        self.degree, self.rank, self.vocab = degree, rank, vocab
        self.local_vocab = vocab // degree
        self.start = rank * self.local_vocab
        embed = rng.standard_normal((vocab, hidden)).astype(np.float32) * 0.02
        self.embed = ms.Parameter(ms.Tensor(slice_for("embed", embed, degree, rank)), name="embed")
        self.pos = ms.Parameter(ms.Tensor(rng.standard_normal((seq_len, hidden)).astype(np.float32) * 0.02),
                                name="pos")
        self.layers = nn.CellList([Layer(i, hidden, heads, ffn, seq_len, degree, rank, rng) for i in range(layers)])
        self.norm = RMSNorm("norm", hidden)
        head = rng.standard_normal((vocab, hidden)).astype(np.float32) / math.sqrt(hidden)
        self.head = ms.Parameter(ms.Tensor(slice_for("head", head, degree, rank)), name="head")
        self.sum, self.copy_head = _Sum(degree), _Copy(degree)

    def local_logits(self, tokens):
        local = tokens - self.start
        inside = ops.logical_and(local >= 0, local < self.local_vocab)
        rows = ops.gather(self.embed, ops.select(inside, local, ops.zeros_like(local)), 0)
        x = self.sum(rows * ops.expand_dims(inside.astype(ms.float32), -1))           # vocabulary parallel
        x = x + self.pos[:tokens.shape[1]]
        for layer in self.layers:
            x = layer(x)
        return ops.matmul(self.copy_head(self.norm(x)), self.head.T)                  # (B, T, V/N)

    def construct(self, tokens):
        local = self.local_logits(tokens)
        if self.degree == 1:
            return local
        b, t, _ = local.shape
        left = ops.zeros((b, t, self.start), ms.float32)
        right = ops.zeros((b, t, self.vocab - self.start - self.local_vocab), ms.float32)
        return self.sum(ops.concat((left, local, right), -1))                         # exact: one contributor


def vocab_parallel_nll(net: LlamaTP, local_logits, targets):
    """Mean negative log-likelihood from vocabulary-sliced logits (B, T, V/N), no MAX reduction."""
    slots = ops.zeros((net.degree,), ms.float32)
    local_max = ops.stop_gradient(local_logits.max(-1))                               # (B, T)
    one_hot = ops.one_hot(ms.Tensor(net.rank, ms.int32), net.degree, ms.Tensor(1.0, ms.float32),
                          ms.Tensor(0.0, ms.float32))
    all_max = net.sum(ops.expand_dims(local_max, -1) * one_hot + slots)               # (B, T, N), one slot each
    shift = all_max.max(-1, keepdims=True)                                             # the global max
    sum_exp = net.sum(ops.exp(local_logits - shift).sum(-1))
    local_t = targets - net.start
    inside = ops.logical_and(local_t >= 0, local_t < net.local_vocab)
    picked = ops.gather_elements(local_logits, -1, ops.expand_dims(ops.select(inside, local_t,
                                                                              ops.zeros_like(local_t)), -1))
    target = net.sum(ops.squeeze(picked, -1) * inside.astype(ms.float32))
    return (ops.log(sum_exp) + ops.squeeze(shift, -1) - target).mean()


def build_model(vocab: int = 256, hidden: int = 64, layers: int = 2, heads: int = 4, ffn: int = 128,
                seq_len: int = 64, seed: int = 0, degree: int | None = None, rank: int | None = None) -> LlamaTP:
    """The model for this tensor-parallel rank (degree and rank from evald's environment unless given)."""
    env_degree, env_rank = tp_from_env()
    return LlamaTP(vocab, hidden, layers, heads, ffn, seq_len, degree or env_degree,
                   env_rank if rank is None else rank, seed)
