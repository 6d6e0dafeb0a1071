"""Every committed checkpoint accounted for at its own step, with a real evald and TensorBoard's reader.

Two runs cover every kind of skip: ``--lag-policy every-k`` (k=2) over steps 10..80 where step 40
is corrupt and step 60 is deleted after evald queued it (not every-k, failed, deleted before
evaluation), and ``--lag-policy latest`` over a burst (superseded). For every committed step,
EventAccumulator finds exactly one of: its ``loss`` point, or one ``evald/skipped`` text starting
with the right category; ``evald/lag_steps`` is at every step; and ``evald status --step N``
tells the same story from the ledger alone.
"""

from __future__ import annotations

import json
import shutil
import subprocess

from evald.contracts import layout
from tests import faults
from tests.harness import PYTHON, REPO, base_env, run_dir, scalar_points, text_events, wait_for


def told_in_tensorboard(ckpt) -> tuple[dict[int, float], dict[int, list[str]], dict[int, float]]:
    run = run_dir(ckpt)
    losses = {step: value for step, _, value in scalar_points(run, "eval/loss")}
    skips: dict[int, list[str]] = {}
    for step, text in text_events(run, "evald/skipped/text_summary"):
        skips.setdefault(step, []).append(text)
    lags = {step: value for step, _, value in scalar_points(run, "evald/lag_steps")}
    return losses, skips, lags


def status_of(ckpt, step) -> dict:
    out = subprocess.run([PYTHON, "-m", "evald", "status", "--ckpt-dir", str(ckpt), "--step", str(step), "--json"],
                         capture_output=True, text=True, cwd=REPO, env=base_env(), timeout=120)
    assert out.returncode == 0, out.stderr
    [info] = json.loads(out.stdout)
    return info


def test_every_kind_of_skip_is_one_text_at_its_own_step(tmp_path, procs):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    steps = [10, 20, 30, 40, 50, 60, 70, 80]
    for step in steps:
        faults.commit(ckpt, step)
    faults.flip_bit(faults.weights_path(ckpt, 40))
    layout.write_run_end(ckpt, json.dumps({"v": 1, "type": "run_finished", "run_id": "faults",
                                           "ckpt_dir": str(ckpt), "final_step": 80, "reason": "completed"}))
    evald = faults.start(tmp_path, ckpt, "--lag-policy", "every-k", "--every-k", "2", "--idle-exit-s", "5")
    procs.append(evald)
    # no factories known yet, so everything waits: delete step 60 once it is queued, then announce them
    wait_for(lambda: faults.ledger_by_key(ckpt).get(layout.step_dir_name(60), {}).get("state") == "queued",
             120, "step 60 queued", interval=0.02)
    shutil.rmtree(ckpt / layout.step_dir_name(60))
    faults.announce(ckpt)
    assert evald.wait(240) == 0, evald.output()[-3000:]

    losses, skips, lags = told_in_tensorboard(ckpt)
    assert sorted(losses) == [20, 80]
    expected = {10: "not every-k: checkpoint #1", 30: "not every-k: checkpoint #3", 50: "not every-k: checkpoint #5",
                70: "not every-k: checkpoint #7", 40: "failed: step_000000040: ",
                60: "deleted before evaluation: step_000000060: "}
    assert sorted(skips) == sorted(expected)
    for step, start in expected.items():
        [text] = skips[step]                                   # exactly one text
        assert text.startswith(start), (step, text)
    assert "xxh3-128" in skips[40][0] and "deleted before it could be evaluated" in skips[60][0]
    assert not set(losses) & set(skips)                                        # never both at one step
    assert sorted(set(losses) | set(skips)) == steps and sorted(lags) == steps   # every committed step

    evaluated = status_of(ckpt, 20)
    assert evaluated["state"] == "evaluated" and evaluated["metrics"]["eval/loss_se"] > 0
    assert evaluated["provenance"]["weights_sha256"] and evaluated["provenance"]["swap_check"].startswith("verified")
    assert status_of(ckpt, 60)["tensorboard"]["evald/skipped"] == skips[60][0]
    assert status_of(ckpt, 30)["tensorboard"]["evald/skipped"] == skips[30][0]
    assert status_of(ckpt, 35)["state"] is None                 # never committed: no record, said plainly


def test_superseded_checkpoints_are_told_at_their_steps(tmp_path, procs):
    ckpt = tmp_path / "ckpt"
    faults.announce(ckpt)
    for step in (10, 20, 30):
        faults.commit(ckpt, step)
    evald = faults.start(tmp_path, ckpt, "--lag-policy", "latest", "--idle-exit-s", "2")
    procs.append(evald)
    assert evald.wait(180) == 0, evald.output()[-3000:]
    losses, skips, lags = told_in_tensorboard(ckpt)
    assert sorted(losses) == [30] and sorted(skips) == [10, 20] and sorted(lags) == [10, 20, 30]
    assert [len(texts) for texts in skips.values()] == [1, 1]
    assert skips[10][0] == "superseded by step 30 (lag policy latest)" and lags[10] == 20.0 and lags[30] == 0.0
    text = subprocess.run([PYTHON, "-m", "evald", "status", "--ckpt-dir", str(ckpt), "--step", "10"],
                          capture_output=True, text=True, cwd=REPO, env=base_env(), timeout=120).stdout
    assert "step 10: skipped" in text and "superseded by step 30" in text and "lag         20 steps" in text
