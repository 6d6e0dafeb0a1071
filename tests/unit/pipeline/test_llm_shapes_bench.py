"""bench/llm_shapes.py runs at a tiny size: every workload prints its row with the keys docs/performance.md
quotes, evald gives the old path's numbers (read from git) and the floor's (rel 1e-5, the same greedy flags and
tokens), and every arm reports a time for each of its rounds, timed alike."""

from __future__ import annotations

import pytest

pytest.importorskip("mindspore")
pytest.importorskip("lm_eval")

from bench.llm_shapes import main

SCORING_KEYS = ["needed_tokens", "evald_s", "floor_s", "ratio_to_floor", "evald_tokens_per_s", "floor_tokens_per_s",
                "padding_overhead", "graphs_compiled_in_run", "old_s_scaled", "speedup_vs_old"]


def test_llm_shapes_bench_runs_at_a_tiny_size(graph_mode):  # graph_mode: tests/unit/conftest.py
    report = main(["--d-model", "32", "--layers", "1", "--heads", "2", "--vocab", "500", "--max-length", "256",
                   "--lengths", "128,256", "--mc-questions", "2", "--mc-context", "100", "--mc-choice-tokens", "5",
                   "--bpb-sets", "2", "--bpb-doc", "200", "--gen-contexts", "2", "--gen-context", "64",
                   "--gen-tokens", "8", "--old-gen-tokens", "2", "--rounds", "2"])
    same = ["max_rel_diff_vs_old", "is_greedy_equal_vs_old"]
    rounds = ["evald_rounds_s", "floor_rounds_s"]
    floor = ["max_rel_diff_vs_floor", "is_greedy_equal_vs_floor"]
    budget = ["floor_in_budget_s", "ratio_to_floor_in_budget"]
    assert list(report["mc"]) == ["requests", *SCORING_KEYS[:-2], *rounds, *floor, *budget, *SCORING_KEYS[-2:], *same]
    assert list(report["mcx"]) == ["requests", *SCORING_KEYS[:-2], *rounds, *floor, *SCORING_KEYS[-2:], *same]
    assert list(report["bpb"]) == ["windows", *SCORING_KEYS[:-2], *rounds, *floor, *budget, *SCORING_KEYS[-2:]]
    assert list(report["gen"]) == ["contexts", "new_tokens", "evald_s", "cached_floor_s", "ratio_to_floor",
                                   "evald_new_tokens_per_s", "padding_overhead", "graphs_compiled_in_run", "decoding",
                                   *rounds, "tokens_equal_vs_floor", "old_s_scaled", "speedup_vs_old",
                                   "old_tokens_equal"]
    for workload in ("mc", "mcx", "bpb"):   # the same numbers as the floor's exact shapes
        assert report[workload]["max_rel_diff_vs_floor"] < 1e-5 and report[workload]["is_greedy_equal_vs_floor"]
    assert report["gen"]["tokens_equal_vs_floor"]
    for row in (report[w] for w in ("mc", "mcx", "bpb", "gen")):   # every round timed, evald's and the floor's
        assert len(row["evald_rounds_s"]) == len(row["floor_rounds_s"]) == 2 and min(row["floor_rounds_s"]) > 0
    for workload in ("mc", "mcx"):
        assert report[workload]["max_rel_diff_vs_old"] < 1e-4
        assert report[workload]["is_greedy_equal_vs_old"]
    assert report["gen"]["old_tokens_equal"]
    assert report["mc"]["requests"] == 8 and report["mcx"]["needed_tokens"] == 2 * 99 + 8 * 5
    assert report["gen"]["new_tokens"] == 16
    for row in (report[w] for w in ("mc", "mcx", "bpb", "gen")):
        assert row["evald_s"] > 0 and row["old_s_scaled"] > 0 and row["graphs_compiled_in_run"] == 0
    assert report["graphs_at_end"] == report["graphs_at_start"]
