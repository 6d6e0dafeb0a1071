"""Issue 5 with real processes: evald stops the trainer at the announced step, keeps its patience
count across restarts, and an earlier run's stop does not stop a new run."""

from __future__ import annotations

import json
import re
import sqlite3

import pytest

from evald.contracts import layout
from tests.harness import committed_steps, hook_stats, run_dir, start_evald, start_trainer


def decisions_state(ckpt):
    """The decision state evald committed with its last evaluation."""
    db = sqlite3.connect(run_dir(ckpt) / "ledger.sqlite")
    row = db.execute("SELECT value FROM kv WHERE key='decisions'").fetchone()
    db.close()
    return json.loads(row[0]) if row else None


@pytest.mark.parametrize("loop", [pytest.param("model", marks=pytest.mark.smoke), "custom"])
def test_patience_stops_training_at_the_announced_step(tmp_path, endpoints, procs, loop):
    ckpt = tmp_path / "ckpt"
    # min_delta 10 makes every later evaluation "no improvement": patience 1 stops at the 2nd one.
    evald = start_evald(tmp_path, endpoints, ["--lag-policy", "all", "--patience", "1", "--min-delta", "10",
                                              "--stop-margin-steps", "40"])
    procs.append(evald)
    # in lockstep with evald (tests/paced_trainer.py): it cannot train past the stop before evald has decided it
    trainer = start_trainer(tmp_path, ckpt, endpoints, steps=400, every=10, loop=loop,
                            program=["tests.paced_trainer", "--lockstep"])
    procs.append(trainer)
    assert trainer.wait(400) == 0, trainer.output()[-3000:]
    assert evald.wait(180) == 0, evald.output()[-3000:]

    announced = int(re.search(r"training stops at step (\d+)", evald.output()).group(1))
    stopped = re.search(r"evald asked to stop training: stopping at step (\d+)", trainer.output())
    assert stopped and int(stopped.group(1)) == announced, trainer.output()[-2000:]
    assert "paced: evald done with step 10 before the snapshot at step 20" in trainer.output()  # in lockstep
    assert announced < 400
    assert committed_steps(ckpt)[-1] == announced  # the final lightweight checkpoint
    summary = json.loads((run_dir(ckpt) / "summary.json").read_text())
    assert summary["stopped_early"] and summary["final_step"] == announced
    assert "patience 1 exhausted" in summary["training_end_reason"]
    assert summary["best_step"] == 10
    assert json.loads((run_dir(ckpt) / "best.json").read_text())["step"] == 10  # in the run directory


@pytest.mark.slow  # three evald processes in turn; the state's round trip is in test_crash_replay.py
def test_restarted_evald_continues_the_patience_count(tmp_path, endpoints, procs):
    ckpt = tmp_path / "ckpt"
    trainer = start_trainer(tmp_path, ckpt, endpoints, steps=40, every=10, loop="custom", cpu=None)
    procs.append(trainer)
    assert trainer.wait(300) == 0
    steps = committed_steps(ckpt)
    assert steps == [10, 20, 30, 40]
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    for step in steps[2:]:  # reveal checkpoints one restart at a time
        (ckpt / layout.step_dir_name(step)).rename(hidden / layout.step_dir_name(step))
    args = ["--ckpt-dir", str(ckpt), "--endpoint", "none", "--idle-exit-s", "2", "--lag-policy", "all",
            "--patience", "3", "--min-delta", "10", "--generation", '{"prompts": 0}']
    waits = []
    for reveal in [None, 30, 40]:
        if reveal is not None:
            (hidden / layout.step_dir_name(reveal)).rename(ckpt / layout.step_dir_name(reveal))
        evald = start_evald(tmp_path, endpoints, args, name=f"evald{reveal}", cpu=None)
        procs.append(evald)
        assert evald.wait(180) == 0, evald.output()[-3000:]
        waits.append(decisions_state(ckpt)["early_stop"]["wait"])
    assert waits == [1, 2, 3]  # a fresh count would restart at 0 with each evald
    control = decisions_state(ckpt)["control"]
    assert control["stop_at_step"] is not None and "patience 3 exhausted" in control["stop_reason"]


def test_stop_for_an_earlier_run_is_ignored(tmp_path, endpoints, procs):
    ckpt_a = tmp_path / "a"
    evald = start_evald(tmp_path, endpoints, ["--lag-policy", "all", "--patience", "1", "--min-delta", "10",
                                              "--stop-margin-steps", "40", "--serve-forever"])
    procs.append(evald)
    first = start_trainer(tmp_path, ckpt_a, endpoints, steps=400, every=10, loop="custom", name="first",
                          extra=["--run-id", "run-a"], program=["tests.paced_trainer", "--lockstep"])
    procs.append(first)
    assert first.wait(400) == 0, first.output()[-3000:]
    assert "evald asked to stop training" in first.output()
    assert "paced: evald done with step 10 before the snapshot at step 20" in first.output()  # in lockstep
    # evald keeps publishing run-a's stop; a new run on the same control channel must not obey it.
    second = start_trainer(tmp_path, tmp_path / "b", endpoints, steps=60, every=30, loop="custom",
                           name="second", extra=["--run-id", "run-b"])
    procs.append(second)
    assert second.wait(300) == 0
    assert "evald asked to stop training" not in second.output()
    assert committed_steps(tmp_path / "b") == [30, 60]
    stats = hook_stats(second.output())
    assert stats["control_messages_ignored"] > 0  # run-a's stop did arrive, and was ignored
    assert "ignored a run_announced message: it is for" in evald.output()
