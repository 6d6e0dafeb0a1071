"""bench/decode_step.py runs at a tiny size for both example models: the old models (read from git) and the
new ones give the same logits up to float rounding, and every arm reports a time."""

from __future__ import annotations

import pytest

pytest.importorskip("mindspore")

from bench.decode_step import main


@pytest.mark.parametrize("model", ["llm_decoder", "tiny_lm"])
def test_decode_step_bench_runs_at_a_tiny_size(graph_mode, model):  # graph_mode: tests/unit/conftest.py
    report = main(["--model", model, "--d-model", "32", "--layers", "2", "--heads", "2", "--vocab", "64",
                   "--capacity", "16", "--batches", "1,2", "--steps", "2", "--forwards", "1", "--rounds", "1"])
    assert report["max_abs_logit_diff_old_vs_new"] < 1e-4
    assert set(report["batches"]) == {1, 2}
    for row in report["batches"].values():
        assert row["old_step_ms"] > 0 and row["new_step_ms"] > 0 and row["full_forward_ms"] > 0
