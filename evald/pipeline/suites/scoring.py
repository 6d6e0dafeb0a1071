"""The scorer's old import path, kept one release: ``TokenScorer`` and its types moved to
evald.pipeline.engine (issue 36), the engine below its clients. Importing this module warns (a
DeprecationWarning naming the new path) and re-exports them; it goes in the next release.

May import: the pipeline's engine.
"""

import warnings

from evald.pipeline.engine import (AUTO_MEMORY_SHARE, FIT_STEP, FORK_CHUNK, FORK_ROWS, LADDER_RATIO,  # noqa: F401
                                   PREFILL_CHUNK, ExtendTopK, ForkReads, GenerateRequest, ReadLogProbs, ScoreRequest,
                                   ScorerStats, TokenScorer, TokenScores, auto_budget, fitted_lengths, length_ladder,
                                   model_max_length, shared_rows)

warnings.warn("evald.pipeline.suites.scoring is deprecated: the scorer moved to evald.pipeline.engine (import "
              "TokenScorer, ScoreRequest, GenerateRequest, ... from there); this old path goes in the next release",
              DeprecationWarning, stacklevel=2)
