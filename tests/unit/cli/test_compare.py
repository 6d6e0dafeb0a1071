"""``evald compare`` in process, on per-sample files written as the contract says: the paired interval and
McNemar against independent references (scipy, a plain numpy bootstrap), identities, missing steps, runs."""

from __future__ import annotations

import json
import math
import time

import numpy as np
import pytest
from scipy import stats

from evald.cli.main import main
from tests.sample_outputs import IDENTITY, identity_hash, write_task_samples

N = 200


def _scores(seed: int = 0):
    rng = np.random.default_rng(seed)
    hard = rng.random(N)
    a = (hard < 0.45).astype(int)
    b = (np.clip(hard + rng.normal(0, 0.2, N), 0, 1) < 0.55).astype(int)
    return a, b


def _run(tmp_path, name: str = "exp1", identity=IDENTITY, steps=(100, 200), seed: int = 0):
    run = tmp_path / name
    a, b = _scores(seed)
    ids = list(range(1000, 1000 + 3 * N, 3))  # a seeded subset: not 0..n-1
    for step, acc in zip(steps, (a, b)):
        norm = np.where(np.arange(N) % 7 == 0, 1 - acc, acc)
        write_task_samples(run, "fast", "hellaswag", step, identity, {"acc": acc.tolist(), "acc_norm": norm.tolist()},
                           doc_ids=ids)
        write_task_samples(run, "fast", "arc_easy", step, identity, {"acc": acc[:50].tolist()}, doc_ids=ids[:50])
    return run, a, b


def _compare(capsys, *argv) -> tuple[int, str, str]:
    code = main(["compare", *map(str, argv)])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_the_paired_interval_and_mcnemar_equal_independent_references(tmp_path, capsys):
    run, a, b = _run(tmp_path)
    code, out, err = _compare(capsys, 100, 200, "--run-dir", run, "--task", "hellaswag", "--resamples", 4000,
                              "--seed", 3, "--json")
    assert code == 0, err
    report = json.loads(out)
    (task,) = report["tasks"]
    assert (task["suite"], task["task"], task["n"]) == ("fast", "hellaswag", N)
    acc = next(m for m in task["metrics"] if m["metric"] == "acc")
    assert acc["value_a"] == pytest.approx(a.mean()) and acc["value_b"] == pytest.approx(b.mean())
    assert acc["difference"] == pytest.approx(b.mean() - a.mean())
    # the reference: a paired bootstrap written here, with the same seed and resamples
    idx = np.random.default_rng(3).integers(0, N, size=(4000, N))
    boot = b[idx].mean(axis=1) - a[idx].mean(axis=1)
    assert acc["ci_low"] == pytest.approx(np.quantile(boot, 0.025), abs=1e-12)
    assert acc["ci_high"] == pytest.approx(np.quantile(boot, 0.975), abs=1e-12)
    # McNemar with scipy's binomial test on the discordant documents
    a_only, b_only = int(((a == 1) & (b == 0)).sum()), int(((a == 0) & (b == 1)).sum())
    assert (acc["mcnemar"]["a_only"], acc["mcnemar"]["b_only"]) == (a_only, b_only) and a_only + b_only > 10
    assert acc["mcnemar"]["p_exact"] == pytest.approx(stats.binomtest(min(a_only, b_only), a_only + b_only).pvalue,
                                                      rel=1e-9)
    d = b - a
    assert acc["se"] == pytest.approx(d.std(ddof=1) / math.sqrt(N))
    assert acc["mde"] == pytest.approx((stats.norm.ppf(0.975) + stats.norm.ppf(0.8)) * acc["se"])
    assert (report["alpha"], report["power"], report["seed"], report["resamples"]) == (0.05, 0.8, 3, 4000)
    assert [m["metric"] for m in task["metrics"]] == ["acc", "acc_norm"]
    code, again, _ = _compare(capsys, 100, 200, "--run-dir", run, "--task", "hellaswag", "--resamples", 4000,
                              "--seed", 3, "--json")
    assert again == out  # seeded: the same output


def test_the_text_report_names_each_task_its_interval_level_and_the_mde_settings(tmp_path, capsys):
    run, a, b = _run(tmp_path)
    code, out, err = _compare(capsys, 100, 200, "--run-dir", run, "--resamples", 500)
    assert code == 0, err
    assert "fast/arc_easy: 50 documents" in out and f"fast/hellaswag: {N} documents" in out
    assert "95% paired bootstrap (500 resamples, seed 0)" in out and "alpha=0.05" in out and "power 0.8" in out
    line = next(row for row in out.splitlines() if row.strip().startswith("acc ") and "hellaswag" not in row)
    assert "exact p=" in line and "mid-p=" in line
    assert f"{b[:50].mean() - a[:50].mean():+.4f}" in out


def test_an_identity_mismatch_is_refused_naming_what_differs(tmp_path, capsys):
    run, _, _ = _run(tmp_path)
    changed = {**IDENTITY, "tokenizer": "cd" * 16, "num_fewshot": 5}
    _, b = _scores()
    newer = time.time_ns() + 10**9  # written after the others
    write_task_samples(run, "fast", "hellaswag", 200, changed, {"acc": b.tolist()}, mtime_ns=newer)
    code, out, err = _compare(capsys, 100, 200, "--run-dir", run, "--task", "hellaswag")
    assert code == 2 and out == ""
    assert "fast/hellaswag: step 100 and step 200 were scored under different identities" in err
    assert "num_fewshot: 0 vs 5" in err and 'tokenizer: "abababab' in err
    assert f"--identity {identity_hash(IDENTITY)[:12]} compares those" in err  # both have the superseded one
    code, out, err = _compare(capsys, 100, 200, "--run-dir", run, "--task", "hellaswag", "--identity",
                              identity_hash(IDENTITY)[:8], "--resamples", 100)
    assert code == 0, err
    assert f"identity {identity_hash(IDENTITY)[:12]}" in out


def test_across_runs_the_same_identity_compares_and_another_is_refused(tmp_path, capsys):
    run1, a, _ = _run(tmp_path, "exp1", seed=0)
    run2, _, b = _run(tmp_path, "exp2", steps=(300, 400), seed=1)
    code, out, err = _compare(capsys, 100, 400, "--run-dir", run1, "--b-run-dir", run2, "--task", "hellaswag",
                              "--json", "--resamples", 100)
    assert code == 0, err
    report = json.loads(out)
    assert (report["a"]["label"], report["b"]["label"]) == ("exp1@100", "exp2@400")
    assert report["tasks"][0]["metrics"][0]["difference"] == pytest.approx(b.mean() - a.mean())
    run3, _, _ = _run(tmp_path, "exp3", identity={**IDENTITY, "lm_eval": "0.4.14"})
    code, _, err = _compare(capsys, 100, 200, "--run-dir", run1, "--b-run-dir", run3, "--task", "hellaswag")
    assert code == 2 and "exp1@100 and exp3@200 were scored under different identities" in err
    assert 'lm_eval: "0.4.13" vs "0.4.14"' in err


def test_a_missing_step_or_task_is_named_with_the_steps_that_exist(tmp_path, capsys):
    run, _, _ = _run(tmp_path)
    code, _, err = _compare(capsys, 100, 250, "--run-dir", run)
    assert code == 2
    assert f"step 250 has no per-sample outputs in {run / 'samples'}; steps that have some: 100, 200" in err
    code, _, err = _compare(capsys, 100, 200, "--run-dir", run, "--suite", "slow")
    assert code == 2 and "step 100 has no per-sample outputs for suite slow" in err and "some: none" in err
    (run / "samples" / "fast" / "arc_easy" / "step_200.").parent.mkdir(exist_ok=True)
    for f in (run / "samples" / "fast" / "arc_easy").glob("step_200.*"):
        f.unlink()
    code, _, err = _compare(capsys, 100, 200, "--run-dir", run)
    assert code == 2 and "fast/arc_easy: step 100 has per-sample outputs, step 200 has none" in err
    code, _, err = _compare(capsys, 100, 200, "--run-dir", tmp_path / "nope")
    assert code == 2 and "is not a run directory" in err
    code, _, err = _compare(capsys, 100, 200, "--run-dir", run, "--alpha", 1.5)
    assert code == 2 and "--alpha and --power must be in (0, 1)" in err


def test_damaged_files_and_a_sidecar_that_disagrees_are_reported(tmp_path, capsys):
    run, a, b = _run(tmp_path)
    write_task_samples(run, "fast", "arc_easy", 200, IDENTITY, {"acc": b[:50].tolist()},
                       doc_ids=range(2000, 2050))
    code, _, err = _compare(capsys, 100, 200, "--run-dir", run, "--task", "arc_easy")
    assert code == 2 and "hold different documents under one identity (50 only in the first" in err
    write_task_samples(run, "fast", "arc_easy", 200, IDENTITY, {"acc": b[:50].tolist()},
                       doc_ids=range(1000, 1150, 3), aggregated={"acc": 0.99})
    code, out, err = _compare(capsys, 100, 200, "--run-dir", run, "--task", "arc_easy", "--resamples", 50)
    assert code == 0, err
    assert "note: acc: step 200's sidecar reports 0.99, its per-sample outputs give" in out
    samples = next((run / "samples" / "fast" / "arc_easy").glob("step_200.*.jsonl.gz"))
    samples.write_bytes(b"\x1f\x8b broken")
    code, _, err = _compare(capsys, 100, 200, "--run-dir", run, "--task", "arc_easy")
    assert code == 2 and str(samples) in err


def test_no_document_changed_shows_no_mde_in_the_report(tmp_path, capsys):
    """Issue 26 item 9: with the same value on every document at both steps, the report printed
    "MDE 0.0000"; it shows "-" with a note saying why, and the JSON has null."""
    run = tmp_path / "same"
    same = [0, 1, 1, 0, 1] * 10
    for step in (100, 200):
        write_task_samples(run, "fast", "arc_easy", step, IDENTITY, {"acc": same})
    code, out, err = _compare(capsys, 100, 200, "--run-dir", run)
    assert code == 0, err
    header, row = [r for r in out.splitlines() if r.strip().startswith(("metric ", "acc "))]
    assert row[header.index(" MDE "):].split()[0] == "-", out    # the table's columns are aligned
    assert "no document's value changed" in out
    code, out, err = _compare(capsys, 100, 200, "--run-dir", run, "--json")
    [metric] = json.loads(out)["tasks"][0]["metrics"]
    assert metric["mde"] is None and metric["se"] == 0
