"""Issue 36 item 6: the scorer moved to evald.pipeline.engine; its old import path keeps working one release
and says so (a DeprecationWarning naming the new path)."""

from __future__ import annotations

import importlib
import sys

import pytest

pytest.importorskip("mindspore")

OLD, NEW = "evald.pipeline.suites.scoring", "evald.pipeline.engine"


def test_the_old_import_path_works_and_warns_naming_the_new_one(monkeypatch):
    monkeypatch.delitem(sys.modules, OLD, raising=False)    # imported afresh, whatever imported it before
    with pytest.warns(DeprecationWarning, match=r"evald\.pipeline\.engine"):
        old = importlib.import_module(OLD)
    new = importlib.import_module(NEW)
    for name in ("TokenScorer", "ScoreRequest", "TokenScores", "GenerateRequest", "ScorerStats", "ReadLogProbs",
                 "ForkReads", "ExtendTopK", "auto_budget", "fitted_lengths", "length_ladder", "model_max_length",
                 "shared_rows", "FIT_STEP", "FORK_CHUNK", "PREFILL_CHUNK"):
        assert getattr(old, name) is getattr(new, name), name
