"""The real ``python -m evald compare`` on a run directory a real evald made (it evaluated two steps of a
real checkpoint directory, then exited), found by --ckpt-dir as ``evald status`` finds it.

The suites' per-sample outputs are written here by evald's own writer (evald.ledger.samples; the format:
docs/benchmarks.md) from chosen per-document values: it stands in for a suite evaluation (which
tests/e2e/test_suites_e2e.py runs), not for anything ``evald compare`` reads or does."""

from __future__ import annotations

import json
import signal
import subprocess

import numpy as np
from scipy import stats

from tests import faults
from tests.harness import PYTHON, REPO, base_env, run_dir, wait_for
from tests.sample_outputs import IDENTITY, write_task_samples


def evald_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "evald", *args], capture_output=True, text=True, cwd=REPO,
                          env=base_env(), timeout=300)


def test_evald_compare_on_a_run_directory_made_by_a_real_evald(tmp_path, procs):
    ckpt = tmp_path / "ckpt"
    faults.announce(ckpt)
    for step in (10, 20):
        faults.commit(ckpt, step)
    evald = faults.start(tmp_path, ckpt, "--lag-policy", "all")
    procs.append(evald)
    wait_for(lambda: faults.ledger_states(ckpt) == {"evaluated": 2}, 240, "steps 10 and 20 evaluated")
    evald.signal(signal.SIGTERM)
    assert evald.wait(120) == 0, evald.output()[-3000:]
    run = run_dir(ckpt)

    rng = np.random.default_rng(17)
    hard = rng.random(300)
    a = (hard < 0.40).astype(int)
    b = (np.clip(hard + rng.normal(0, 0.25, 300), 0, 1) < 0.52).astype(int)
    for step, acc in ((10, a), (20, b)):
        write_task_samples(run, "fast", "mc4", step, IDENTITY, {"acc": acc.tolist()}, doc_ids=range(7, 907, 3))

    shown = evald_cli("compare", "10", "20", "--ckpt-dir", str(ckpt), "--json", "--resamples", "3000")
    assert shown.returncode == 0, shown.stderr
    [task] = json.loads(shown.stdout)["tasks"]
    [acc] = task["metrics"]
    boot = np.random.default_rng(0).integers(0, 300, size=(3000, 300))
    diffs = b[boot].mean(axis=1) - a[boot].mean(axis=1)
    assert np.allclose([acc["ci_low"], acc["ci_high"]], np.quantile(diffs, [0.025, 0.975]), rtol=0, atol=1e-12)
    a_only, b_only = int(((a == 1) & (b == 0)).sum()), int(((a == 0) & (b == 1)).sum())
    assert abs(acc["mcnemar"]["p_exact"] - stats.binomtest(min(a_only, b_only), a_only + b_only).pvalue) < 1e-12
    assert task["n"] == 300 and abs(acc["difference"] - (b.mean() - a.mean())) < 1e-12

    text = evald_cli("compare", "10", "20", "--ckpt-dir", str(ckpt))
    assert text.returncode == 0 and "fast/mc4: 300 documents" in text.stdout
    missing = evald_cli("compare", "10", "30", "--ckpt-dir", str(ckpt))
    assert missing.returncode == 2
    assert missing.stderr.strip().startswith(f"evald compare: step 30 has no per-sample outputs in {run / 'samples'}")
