"""Issue 3, foreign producers: MindSpore's own ModelCheckpoint files, found with no notification.

* a real ``Model.train`` run of the demo model checkpointed only by ``ModelCheckpoint``
  (``.ckpt`` with optimizer state, temp file + rename) while evald watches: every file is
  evaluated with the NETWORK weights (checked against evald-layout copies of the same weights);
* the step rule: ``step_num`` in the contents, else the name ``PREFIX-E_S`` with E == 1, else
  ``--foreign-steps-per-epoch``; otherwise a failure whose reason says what to set;
* a foreign file written slowly in place (no temp name) is not read before it settles.
"""

from __future__ import annotations

import json

import math
import signal
from pathlib import Path

import pytest

from evald.contracts import layout
from tests import faults
from tests.harness import PYTHON, Proc, base_env, raw_scalar_steps, run_dir, scalar_points, wait_for


def _losses(logdir: Path) -> dict[int, float]:
    points = scalar_points(logdir, "eval/loss")
    steps = [s for s, _, _ in points]
    assert len(steps) == len(set(steps)), f"duplicated points: {steps}"
    return {s: v for s, _, v in points}


def _final(rows: list[dict]) -> bool:
    return all(r["state"] in ("evaluated", "skipped", "failed", "deleted") for r in rows)


@pytest.mark.smoke
def test_model_checkpoint_files_written_during_training_are_evaluated(tmp_path, procs):
    ckpt = tmp_path / "ckpt"
    faults.announce(ckpt)  # evald-layout reference copies (below) need the factories; nothing is sent
    evald = faults.start(tmp_path, ckpt, "--lag-policy", "all", "--tuning", '{"foreign_settle_s": 1}')
    procs.append(evald)
    wait_for(lambda: "serving " in evald.output(), 120, "evald attached")
    trainer = Proc([PYTHON, "-m", "tests.faults", "foreign-train", "--ckpt-dir", str(ckpt), "--prefix", "tinylm",
                    "--epochs", "2", "--steps-per-epoch", "6", "--save-steps", "3", "--append-step",
                    "--ref-dir", str(ckpt), "--ref-offset", "1000", "--step-sleep", "0.2"],
                   base_env(), tmp_path / "foreign-train.log")
    procs.append(trainer)
    assert trainer.wait(300) == 0, trainer.output()[-3000:]
    names = ["tinylm-1_3.ckpt", "tinylm-1_6.ckpt", "tinylm-2_3.ckpt", "tinylm-2_6.ckpt"]
    assert all((ckpt / n).is_file() for n in names)
    wait_for(lambda: len(faults.ledger_rows(ckpt)) >= 8 and _final(faults.ledger_rows(ckpt)), 180,
             "all eight checkpoints handled")
    evald.signal(signal.SIGTERM)
    assert evald.wait(60) == 0, evald.output()[-3000:]

    rows = faults.ledger_by_key(ckpt)
    foreign = {k: r for k, r in rows.items() if r["kind"] == "foreign"}
    assert sorted(foreign) == names  # no .tmp, no .meta, nothing else
    # step_num in the contents: epoch 2's files are global steps 9 and 12 with no other hint
    assert [foreign[n]["step"] for n in names] == [3, 6, 9, 12]
    assert all(r["state"] == "evaluated" and r["source"] in ("watchdog", "rescan") for r in foreign.values())
    assert sorted(k for k in rows if k not in foreign) == [layout.step_dir_name(s) for s in (1003, 1006, 1009, 1012)]
    losses = _losses(run_dir(ckpt))
    for step in (3, 6, 9, 12):  # the network's weights, not the Adam moments saved beside them
        assert losses[step] == pytest.approx(losses[1000 + step], rel=1e-5), (step, losses)
    # trained weights: far below a uniform guess (what the Adam moments gave: exactly ln 256)
    assert all(losses[s] < math.log(256) - 1 for s in (3, 6, 9, 12)), losses
    assert "Traceback" not in evald.output() and "cannot read" not in evald.output()


def test_foreign_step_rules_and_a_slow_in_place_writer(tmp_path, procs):
    ckpt = tmp_path / "ckpt"
    faults.announce(ckpt)
    source = tmp_path / "src" / "slow-source.ckpt"
    source.parent.mkdir()
    faults.save_ckpts([
        {"path": str(ckpt / "noinfo-1_4.ckpt"), "seed": 4},                  # name, epoch 1 -> 4
        {"path": str(ckpt / "noinfo-2_3.ckpt"), "seed": 8},                  # name, epoch 2 -> needs spe
        {"path": str(ckpt / "withinfo-3_2.ckpt"), "seed": 99, "step_num": 99},  # contents win -> 99
        # Model.train-style names with optimizer state beside the weights, step only in the contents
        {"path": str(ckpt / "wrapped.ckpt"), "seed": 12, "step_num": 12, "prefix": "network.model.",
         "moments": True},
        {"path": str(ckpt / "nostep.ckpt"), "seed": 5},                      # no step anywhere
        {"path": str(source), "seed": 20},
    ], tmp_path)
    for step in (12, 20):  # evald-layout copies of the same weights, to compare the losses
        faults.commit(ckpt, 1000 + step, faults.weights_for_step(step))

    # Run 1: --foreign-steps-per-epoch 5, and a foreign writer that writes in place, slowly.
    settle = 2.5
    first = faults.start(tmp_path, ckpt, "--lag-policy", "all", "--foreign-steps-per-epoch", "5",
                         "--tuning", json.dumps({"foreign_settle_s": settle}))
    procs.append(first)
    wait_for(lambda: "evaluation network ready" in first.output(), 180, "evald evaluating")
    slow = Proc([PYTHON, "-m", "tests.faults", "slow-copy", str(source), str(ckpt / "slow-1_20.ckpt"),
                 "--pause", "1.5"], base_env(), tmp_path / "slow-copy.log")
    procs.append(slow)
    assert slow.wait(60) == 0, slow.output()
    completed = float(slow.output().split("complete")[1].split()[0])
    wait_for(lambda: faults.ledger_by_key(ckpt).get("slow-1_20.ckpt", {}).get("state") == "evaluated", 60,
             "the slowly written file evaluated")
    wait_for(lambda: _final(faults.ledger_rows(ckpt)) and len(faults.ledger_rows(ckpt)) == 7, 60, "all handled")
    first.signal(signal.SIGTERM)
    assert first.wait(60) == 0, first.output()[-3000:]

    rows = faults.ledger_by_key(ckpt)
    steps = {k: r["step"] for k, r in rows.items() if r["kind"] == "foreign"}
    assert steps == {"noinfo-1_4.ckpt": 4, "noinfo-2_3.ckpt": 8, "withinfo-3_2.ckpt": 99, "wrapped.ckpt": 12,
                     "slow-1_20.ckpt": 20}
    nostep = faults.ledger_files(ckpt)["nostep.ckpt"]  # no step anywhere: rejected, no step invented
    assert nostep["status"] == "rejected" and nostep["step"] is None and "no step in the name" in nostep["reason"]
    assert all(r["state"] == "evaluated" for r in rows.values()), rows
    # never read half-written: found only once it had kept still for tuning.foreign_settle_s
    assert rows["slow-1_20.ckpt"]["seen_at"] >= completed + settle - 0.1
    assert "cannot read" not in first.output()
    losses = _losses(run_dir(ckpt))
    assert losses[12] == pytest.approx(losses[1012], rel=1e-5)  # weights picked out of the optimizer state
    assert losses[20] == pytest.approx(losses[1020], rel=1e-5)  # the slow file, read whole

    # Run 2 (its own log dir): without --foreign-steps-per-epoch an epoch-2 name is not a step.
    second_logdir = tmp_path / "second"
    second = faults.start(tmp_path, ckpt, "--logdir", str(second_logdir), "--lag-policy", "all",
                          "--tuning", '{"foreign_settle_s": 0}', "--idle-exit-s", "2", name="evald-second")
    procs.append(second)
    assert second.wait(180) == 0, second.output()[-3000:]
    rows = faults.ledger_by_key(ckpt, second_logdir)
    epoch_two = faults.ledger_files(ckpt, second_logdir)["noinfo-2_3.ckpt"]
    assert epoch_two["status"] == "rejected" and "noinfo-2_3.ckpt" not in rows
    assert "--foreign-steps-per-epoch" in epoch_two["reason"] and "append_info" in epoch_two["reason"]
    assert {k: r["step"] for k, r in rows.items() if r["state"] == "evaluated" and r["kind"] == "foreign"} == {
        "noinfo-1_4.ckpt": 4, "withinfo-3_2.ckpt": 99, "wrapped.ckpt": 12, "slow-1_20.ckpt": 20}


def test_idle_exit_waits_for_a_foreign_file_to_settle(tmp_path, procs):
    ckpt = tmp_path / "ckpt"
    faults.announce(ckpt)
    faults.save_ckpts([{"path": str(ckpt / "late-1_7.ckpt"), "seed": 7}], tmp_path)
    (ckpt / "late-1_7.ckpt").touch()  # just written: it must keep still for 3 s before it is read
    evald = faults.start(tmp_path, ckpt, "--tuning", '{"foreign_settle_s": 3}', "--idle-exit-s", "1")
    procs.append(evald)
    assert evald.wait(180) == 0, evald.output()[-3000:]
    [row] = faults.ledger_rows(ckpt)
    assert (row["key"], row["step"], row["state"]) == ("late-1_7.ckpt", 7, "evaluated")


def test_model_checkpoint_beside_evald_callback_gives_one_point_per_step(tmp_path, endpoints, procs):
    """MindSpore's ModelCheckpoint and EvaldCallback writing into one directory: each step has two
    files, and gets one evaluation and one TensorBoard point, read from evald's own checkpoint."""
    from tests.harness import start_evald, start_trainer

    ckpt = tmp_path / "ckpt"
    evald = start_evald(tmp_path, endpoints, ["--lag-policy", "all", "--tuning", '{"foreign_settle_s": 0.5}'])
    procs.append(evald)
    trainer = start_trainer(tmp_path, ckpt, endpoints, steps=60, every=20, extra=["--model-checkpoint"])
    procs.append(trainer)
    assert trainer.wait(300) == 0, trainer.output()[-3000:]
    assert evald.wait(180) == 0, evald.output()[-3000:]
    assert sorted(p.name for p in ckpt.glob("tinylm-1_*.ckpt")) == ["tinylm-1_20.ckpt", "tinylm-1_40.ckpt",
                                                                     "tinylm-1_60.ckpt"]
    assert raw_scalar_steps(run_dir(ckpt), "eval/loss") == [20, 40, 60]
    rows = faults.ledger_rows(ckpt)
    assert [(r["step"], r["key"], r["state"]) for r in rows] == [
        (s, layout.step_dir_name(s), "evaluated") for s in (20, 40, 60)]
    files = faults.ledger_files(ckpt)
    assert all(files[f"tinylm-1_{s}.ckpt"]["status"] == "duplicate" for s in (20, 40, 60)), files
