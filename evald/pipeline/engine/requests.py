"""What the engine is asked and what it answers: a scoring request, its token scores, a generation request,
and the counters of what ran.

May import: numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np


@dataclass(frozen=True)
class ScoreRequest:
    context: Sequence[int]
    continuation: Sequence[int]


@dataclass(frozen=True)
class TokenScores:
    logprobs: np.ndarray                 # (n,) float32: log p(continuation[i] | everything before it)
    greedy: np.ndarray                   # (n,) bool: continuation[i] is the argmax token
    top_ids: np.ndarray | None = None    # (n, k) int: the k most likely tokens, best first (top_k > 0)
    top_logprobs: np.ndarray | None = None   # (n, k) float32
    truncated: int = 0                   # context tokens dropped on the left to fit max_length

    @property
    def total(self) -> float:
        return float(np.sum(self.logprobs, dtype=np.float64))

    @property
    def is_greedy(self) -> bool:
        return bool(np.all(self.greedy))


@dataclass(frozen=True)
class GenerateRequest:
    context: Sequence[int]
    max_new_tokens: int
    stop: Callable[[list[int]], bool] | None = None   # called with the ids generated so far


@dataclass
class ScorerStats:
    requested_tokens: int = 0   # input tokens of the requests as asked (each pair alone, no cache)
    real_tokens: int = 0        # tokens run through the network that a result needed
    padded_tokens: int = 0      # every position run, padding included
    forward_passes: int = 0
