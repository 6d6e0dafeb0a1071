"""The scorer's old import path: ``TokenScorer`` and its types moved to evald.pipeline.engine (issue 36), the
engine below its clients. This module re-exports them for one release.

May import: the pipeline's engine.
"""

from evald.pipeline.engine import (AUTO_MEMORY_SHARE, FIT_STEP, FORK_CHUNK, FORK_ROWS, LADDER_RATIO,  # noqa: F401
                                   PREFILL_CHUNK, ExtendTopK, ForkReads, GenerateRequest, ReadLogProbs, ScoreRequest,
                                   ScorerStats, TokenScorer, TokenScores, auto_budget, fitted_lengths, length_ladder,
                                   model_max_length, shared_rows)
