"""Early stopping beyond the noise, with a real evald on real checkpoints.

A bigram model's checkpoints (tests/noise_models.py) make the eval loss fall for five
evaluations, then sit on a plateau that still creeps down by about a tenth of its standard
error per evaluation, with checkpoint-to-checkpoint noise of about a third of it: what a
long run's tail looks like. With ``--patience 3``:

* ``--min-delta 0`` keeps seeing "improvements" on the plateau and stops late, or never;
* ``--min-delta 2se`` stops once, at the step the test predicts by applying the documented rule
  to the values and standard errors evald recorded (docs/early-stopping.md).
Every decision's text in TensorBoard states the values and standard errors it compared.
"""

from __future__ import annotations

import json
import math
import sqlite3

import numpy as np

from evald.contracts import layout, wire
from tests import faults
from tests.harness import REPO, run_dir, text_events
from tests.noise_models import bigram_table

STEPS = [10 * (i + 1) for i in range(20)]


def stage(ckpt) -> None:
    ckpt.mkdir(parents=True)
    best = bigram_table()
    rng = np.random.default_rng(0)
    direction = rng.standard_normal(best.shape).astype(np.float32)
    scale = [2.5, 1.8, 1.3, 0.9, 0.6] + list(np.linspace(0.5, 0.3, 15))   # fall, then creep
    for step, a in zip(STEPS, scale):
        noise = 0.3 * rng.standard_normal(best.shape).astype(np.float32) if step > 50 else 0.0
        layout.write_checkpoint(ckpt, step, {"table.embedding_table": best + a * direction + noise}, run_id="noisy")
    announce = wire.RunAnnounced(
        run_id="noisy", ckpt_dir=str(ckpt),
        model_factory=wire.FactorySpec("tests.noise_models:build_bigram", {}, str(REPO)),
        data_factory=wire.FactorySpec("examples.tiny_lm.data:validation_windows", {"seq_len": 32}, str(REPO)))
    layout.write_run_file(ckpt, announce.encode().decode())


def evaluate(tmp_path, procs, min_delta: str):
    ckpt = tmp_path / f"ckpt-{min_delta}"
    stage(ckpt)
    evald = faults.start(tmp_path, ckpt, "--lag-policy", "all", "--patience", "3", f"--min-delta={min_delta}",
                         "--idle-exit-s", "3", "--subset-size", "256", "--batch-size", "32", name=f"evald-{min_delta}",
                         fast=False)
    procs.append(evald)
    assert evald.wait(300) == 0, evald.output()[-3000:]
    db = sqlite3.connect(run_dir(ckpt) / "ledger.sqlite")
    recorded = {step: json.loads(m) for step, m in db.execute("SELECT step, metrics FROM steps ORDER BY step")}
    db.close()
    decisions = dict(text_events(run_dir(ckpt), "evald/decision/text_summary"))
    return recorded, decisions


def predicted_stop(recorded, k: float, patience: int = 3) -> int | None:
    """docs/early-stopping.md: improved when below the best by more than k * sqrt(se^2 + se_best^2)."""
    best = best_se = None
    wait = 0
    for step in STEPS:
        value, se = recorded[step]["eval/loss"], recorded[step]["eval/loss_se"]
        if best is None or value < best - k * math.hypot(se, best_se):
            best, best_se, wait = value, se, 0
        else:
            wait += 1
            if wait >= patience:
                return step
    return None


def test_on_a_noisy_plateau_2se_stops_once_where_predicted_and_0_does_not(tmp_path, procs):
    recorded, decisions = evaluate(tmp_path, procs, "2se")
    assert sorted(recorded) == STEPS and all(recorded[s]["eval/loss_se"] > 0 for s in STEPS)
    stop = predicted_stop(recorded, 2)
    assert stop is not None and 60 <= stop <= 100, stop           # soon after the plateau begins (step 60)
    stops = [step for step, text in decisions.items() if text.startswith("STOP: ")]
    assert stops == [stop], (stops, stop)                           # once, where predicted
    said = decisions[stop]
    assert "±" in said and "by more than 2se = " in said and "patience 3 exhausted" in said
    for step in STEPS[1:]:                                          # every decision shows what it compared
        assert "±" in decisions[step] and "2se = " in decisions[step], decisions[step]

    zero, zero_decisions = evaluate(tmp_path, procs, "0")
    assert {s: zero[s]["eval/loss"] for s in STEPS} == {s: recorded[s]["eval/loss"] for s in STEPS}  # same run
    zero_stops = [step for step, text in zero_decisions.items() if text.startswith("STOP: ")]
    assert zero_stops == ([] if predicted_stop(zero, 0) is None else [predicted_stop(zero, 0)])
    assert not zero_stops or zero_stops[0] > stop + 30               # late, or never
    flaps = [s for s in STEPS if s > stop and zero_decisions[s].startswith("eval/loss improved")]
    assert len(flaps) >= 3, flaps                                    # noise taken for progress
    print(f"NOISE-REPORT 2se stops at {stop}; min_delta 0 stops at {zero_stops or 'never'} with {len(flaps)} "
          f"'improvements' after {stop}; loss at {stop}: {recorded[stop]['eval/loss']:.4f} "
          f"± {recorded[stop]['eval/loss_se']:.4f}")
