"""The scorer's stand-in for a suite's dry run: lm-eval asks for every request of the suite once, at build
time, and this answers with zeros, recording the rows each call would run (no forward, no graph), so that
the scorer's bucket lengths can be fitted to the suite's own rows before its graphs compile.

Why a dry run through lm-eval, not a guess from the documents: the rows are what lm-eval asks for (few-shot
contexts, rolling windows, shared contexts and forks as the scorer makes them), and only lm-eval knows them.

May import: the engine's request types (evald.pipeline.engine).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from evald.pipeline.engine import GenerateRequest, ScoreRequest, TokenScores


SAMPLED_ROWS = 4   # the suite's rows kept for the check of the model's cached path (engine.cache_check)


class PlanningScorer:
    """Records ``scorer.plan_rows`` / ``plan_generate`` of every call in ``rows`` and answers each request
    with zero log-probabilities (not greedy) or an empty generation: numbers nobody reads. ``samples`` keeps
    the tokens of the suite's first few distinct requests (context and continuation; a generation's
    context), on which the warm-up checks the model's cached path against its full forward."""

    def __init__(self, scorer: Any) -> None:
        self.scorer = scorer
        self.rows: list[int] = []
        self.samples: list[list[int]] = []

    def _sample(self, tokens: list[int]) -> None:
        if len(self.samples) < SAMPLED_ROWS and tokens not in self.samples:
            self.samples.append(tokens)

    @property
    def max_length(self) -> int:
        return int(self.scorer.max_length)

    def score(self, requests: Sequence[ScoreRequest]) -> list[TokenScores]:
        self.rows += self.scorer.plan_rows(requests)
        for r in requests[:SAMPLED_ROWS]:
            self._sample([int(t) for t in [*r.context, *r.continuation]])
        return [TokenScores(np.zeros(len(r.continuation), np.float32), np.zeros(len(r.continuation), bool))
                for r in requests]

    def generate(self, requests: Sequence[GenerateRequest], eos_id: int | None = None) -> list[list[int]]:
        self.rows += self.scorer.plan_generate(requests)
        for r in requests[:SAMPLED_ROWS]:
            self._sample([int(t) for t in r.context])
        return [[] for _ in requests]
