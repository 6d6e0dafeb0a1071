"""``evald status`` and ``evald retry`` beside a live evald, and failures tried again when the
configuration that judged them changed (issue 11, section 2). Real processes and files."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess

import pytest

from tests import faults
from tests.harness import PYTHON, REPO, base_env, raw_scalar_steps, run_dir, wait_for


def evald_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "evald", *args], capture_output=True, text=True, cwd=REPO,
                          env=base_env(), timeout=120)


@pytest.mark.smoke
def test_status_and_retry_beside_a_running_evald(tmp_path, procs):
    ckpt = tmp_path / "ckpt"
    faults.announce(ckpt)
    for step in (10, 20, 30):
        faults.commit(ckpt, step)
    faults.save_ckpts([{"path": str(tmp_path / "good40.ckpt"), "seed": 40, "step_num": 40}], tmp_path)
    good30 = tmp_path / "good30.safetensors"
    shutil.copyfile(faults.weights_path(ckpt, 30), good30)
    faults.truncate(faults.weights_path(ckpt, 30))             # fails when evaluated
    (ckpt / "junk.ckpt").write_bytes(b"not a checkpoint at all")  # rejected: no step can be read
    evald = faults.start(tmp_path, ckpt, "--lag-policy", "all", "--tuning", '{"foreign_settle_s": 0}')
    procs.append(evald)
    wait_for(lambda: faults.ledger_states(ckpt) == {"evaluated": 2, "failed": 1}
             and "junk.ckpt" in faults.ledger_files(ckpt), 240, "10 and 20 evaluated, 30 failed, junk rejected")

    rows_before = faults.ledger_rows(ckpt)
    shown = evald_cli("status", "--ckpt-dir", str(ckpt), "--json")
    assert shown.returncode == 0, shown.stderr
    status = json.loads(shown.stdout)
    assert faults.ledger_rows(ckpt) == rows_before  # read-only
    counts = {state: n for state, n in status["checkpoints"].items() if n}
    assert counts == faults.ledger_states(ckpt) == {"evaluated": 2, "failed": 1}
    assert status["served_by"]["pid"] == evald.popen.pid
    assert status["run_dir"] == str(run_dir(ckpt)) and status["run_id"] == "faults"
    [failure] = status["failures"]
    assert failure["step"] == 30 and failure["state"] == "failed" and failure["reason"]
    [rejected] = status["rejected_files"]
    assert rejected["file"] == "junk.ckpt" and rejected["reason"]
    # nothing waits (30 failed; it is under failures): no lag (issue 18 item 16)
    assert status["lag"]["steps"] == 0 and status["last_evaluation"]["step"] in (10, 20)
    assert status["best"]["step"] in (10, 20) and status["stop"] is None
    table = evald_cli("status", "--ckpt-dir", str(ckpt)).stdout
    assert f"served by evald pid {evald.popen.pid}" in table and "failed 1" in table and "junk.ckpt" in table

    # The causes are fixed; the running evald is told through the ledger alone.
    shutil.copyfile(good30, faults.weights_path(ckpt, 30))
    os.replace(tmp_path / "good40.ckpt", ckpt / "junk.ckpt")   # now a checkpoint of step 40
    asked = evald_cli("retry", "--ckpt-dir", str(ckpt), "10")
    assert asked.returncode == 1 and "not failed, left alone: 10" in asked.stdout
    retried = evald_cli("retry", "--ckpt-dir", str(ckpt))
    assert retried.returncode == 0, retried.stderr
    assert "re-queued 1 step(s): 30" in retried.stdout and "1 rejected file(s) to be judged again: junk.ckpt" \
        in retried.stdout and f"evald pid {evald.popen.pid} serves this run" in retried.stdout
    wait_for(lambda: faults.ledger_states(ckpt) == {"evaluated": 4}, 240, "30 and 40 evaluated by the running evald")
    assert faults.ledger_by_key(ckpt)["junk.ckpt"]["step"] == 40
    assert evald.popen.poll() is None  # no restart was needed
    evald.signal(signal.SIGTERM)
    assert evald.wait(120) == 0, evald.output()[-3000:]
    assert raw_scalar_steps(run_dir(ckpt), "eval/loss") == [10, 20, 30, 40]
    after = json.loads(evald_cli("status", "--ckpt-dir", str(ckpt), "--json").stdout)
    assert after["served_by"] is None and after["failures"] == [] and after["rejected_files"] == []
    assert "not served" in evald_cli("status", "--run-dir", str(run_dir(ckpt))).stdout


def test_a_new_foreign_steps_per_epoch_judges_again_what_the_old_one_rejected(tmp_path, procs):
    ckpt = tmp_path / "ckpt"
    faults.announce(ckpt)
    faults.save_ckpts([{"path": str(ckpt / "noinfo-2_3.ckpt"), "seed": 9, "step_num": None}], tmp_path)
    args = ("--tuning", '{"foreign_settle_s": 0}', "--idle-exit-s", "2")
    first = faults.start(tmp_path, ckpt, *args)
    procs.append(first)
    assert first.wait(240) == 0, first.output()[-3000:]
    rejected = faults.ledger_files(ckpt)["noinfo-2_3.ckpt"]
    assert rejected["status"] == "rejected" and "--foreign-steps-per-epoch" in rejected["reason"]

    # As the error message says: add --foreign-steps-per-epoch (same ledger, and JSON logs this time).
    second = faults.start(tmp_path, ckpt, *args, "--foreign-steps-per-epoch", "6", "--log-format", "json",
                          name="evald-second")
    procs.append(second)
    assert second.wait(240) == 0, second.output()[-3000:]
    row = faults.ledger_by_key(ckpt)["noinfo-2_3.ckpt"]
    assert (row["step"], row["state"]) == (9, "evaluated")  # (2-1)*6 + 3
    lines = [line for line in second.output().splitlines() if line.strip()]
    entries = [json.loads(line) for line in lines]  # every line is one JSON object
    said = [e for e in entries if "--foreign-steps-per-epoch changed from None to 6" in e["message"]]
    assert said and said[0]["level"] == "WARNING" and said[0]["logger"] == "evald"
    [done] = [e for e in entries if e.get("state") == "evaluated"]
    assert done["step"] == 9 and done["key"] == "noinfo-2_3.ckpt" and done["evaluate_s"] >= 0
    assert "eval/loss" in done["metrics"] and done["time"].endswith("Z")


def test_a_fixed_model_factory_evaluates_what_the_broken_one_failed(tmp_path, procs):
    ckpt = tmp_path / "ckpt"
    faults.announce(ckpt)
    for step in (10, 20):
        faults.commit(ckpt, step)
    wrong = ("--model-factory", "examples.tiny_lm.model:build_model", "--model-kwargs", '{"d_model": 64}')
    first = faults.start(tmp_path, ckpt, *wrong, "--lag-policy", "all", "--idle-exit-s", "2")
    procs.append(first)
    assert first.wait(240) == 0, first.output()[-3000:]
    assert faults.ledger_states(ckpt) == {"failed": 2}

    second = faults.start(tmp_path, ckpt, "--lag-policy", "all", "--idle-exit-s", "2", name="evald-second")
    procs.append(second)
    assert second.wait(240) == 0, second.output()[-3000:]
    assert faults.ledger_states(ckpt) == {"evaluated": 2}
    said = second.output()  # the failures judged by the old configuration are superseded, not forgotten
    assert "the evaluation changed" in said and "evaluated again" in said and "superseded: 10, 20" in said
    import sqlite3

    db = sqlite3.connect(faults.ledger_path(ckpt))
    old = db.execute("SELECT step, evaluation, state, superseded_by FROM cells ORDER BY step").fetchall()
    db.close()
    assert [(s, e, st) for s, e, st, _ in old] == [(10, "validation", "failed"), (20, "validation", "failed")]
    assert raw_scalar_steps(run_dir(ckpt), "eval/loss") == [10, 20]
