"""Intake in-process: one training step, one row, whichever files carry it and whoever finds them."""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np

from evald.config import EvaldConfig
from evald.contracts import layout
from evald.intake.intake import Intake
from evald.ledger.ledger import DUPLICATE, EVALUATED, QUEUED, REJECTED, SKIPPED, USED, Record

WEIGHTS = {"w": np.ones(4, np.float32)}


def intake_for(ckpt, ledger, **options):
    config = dataclasses.replace(EvaldConfig(), **options)
    return Intake(ckpt, ledger, config)


def foreign(ckpt, name):
    (ckpt / name).write_bytes(b"a MindSpore .ckpt; its step is in its epoch-1 name")
    os.utime(ckpt / name, (1, 1))  # long settled
    return name


def files(ledger):
    return {name: (step, status) for name, step, status, _ in ledger.files()}


def test_model_checkpoint_and_evald_files_of_one_step_give_one_row_and_the_verified_one_is_read(setup):
    ckpt, ledger = setup
    intake = intake_for(ckpt, ledger)
    intake.found(foreign(ckpt, "tiny-1_10.ckpt"), "watchdog")
    layout.write_checkpoint(ckpt, 10, WEIGHTS, run_id="r")
    for via in ("zmq", "watchdog", "rescan"):  # every source finds it; it is judged once
        intake.found("step_000000010", via)
    [row] = ledger.steps()
    assert (row.step, row.state, row.source, row.kind) == (10, QUEUED, "step_000000010", "evald")
    assert files(ledger) == {"tiny-1_10.ckpt": (10, DUPLICATE), "step_000000010": (10, USED)}


def test_once_a_step_is_evaluated_another_file_of_it_is_a_duplicate_with_the_reason(setup):
    ckpt, ledger = setup
    intake = intake_for(ckpt, ledger)
    layout.write_checkpoint(ckpt, 10, WEIGHTS, run_id="r")
    intake.found("step_000000010", "rescan")
    ledger.start(10)
    ledger.finish(10, EVALUATED, metrics={"eval/loss": 1.0}, record=Record("eval", 10, 1.0, {"eval/loss": 1.0}, {}))
    intake.found(foreign(ckpt, "tiny-1_10.ckpt"), "watchdog")
    assert len(ledger.steps()) == 1 and ledger.step(10).source == "step_000000010"
    [(name, step, status, reason)] = [f for f in ledger.files() if f[0] == "tiny-1_10.ckpt"]
    assert status == DUPLICATE and "read from step_000000010 (evaluated)" in reason


def test_a_manifest_that_disagrees_with_its_directory_is_rejected_at_the_directorys_step(setup):
    ckpt, ledger = setup
    intake = intake_for(ckpt, ledger)
    layout.write_checkpoint(ckpt, 20, WEIGHTS, run_id="r")
    os.rename(ckpt / "step_000000020", ckpt / "step_000000030")  # a copy by hand under another name
    layout.write_checkpoint(ckpt, 20, WEIGHTS, run_id="r")
    intake.found("step_000000030", "rescan")
    intake.found("step_000000020", "rescan")
    assert [(s.step, s.state) for s in ledger.steps()] == [(20, QUEUED), (30, "failed")]
    assert "its manifest says step 20 but the directory is step 30" in ledger.step(30).reason


def test_links_are_duplicates_inside_the_directory_and_rejected_outside(setup, tmp_path):
    ckpt, ledger = setup
    intake = intake_for(ckpt, ledger)
    layout.write_checkpoint(ckpt, 10, WEIGHTS, run_id="r")
    os.symlink(ckpt / "step_000000010", ckpt / "step_000000011")
    outside = tmp_path / "elsewhere"
    layout.write_checkpoint(outside, 12, WEIGHTS, run_id="r")
    os.symlink(outside / "step_000000012", ckpt / "step_000000012")
    for name in ("step_000000010", "step_000000011", "step_000000012"):
        intake.found(name, "rescan")
    # the inner link is the same checkpoint again; the outer one is never read, and its step says why
    assert [(s.step, s.state) for s in ledger.steps()] == [(10, QUEUED), (12, "failed")]
    assert files(ledger)["step_000000011"] == (11, DUPLICATE)
    assert files(ledger)["step_000000012"] == (12, REJECTED)
    reason = {n: r for n, _, _, r in ledger.files()}["step_000000012"]
    assert "outside the checkpoint directory" in reason


def test_every_k_decides_on_arrival_in_step_order_and_never_skips_the_final_step(setup):
    ckpt, ledger = setup
    intake = intake_for(ckpt, ledger, lag_policy="every-k", every_k=2)
    intake.final_step = 50
    for step in (10, 20, 30, 40, 50):
        layout.write_checkpoint(ckpt, step, WEIGHTS, run_id="r")
        intake.found(layout.step_dir_name(step), "rescan")
    states = {s.step: s.state for s in ledger.steps()}
    assert states == {10: SKIPPED, 20: QUEUED, 30: SKIPPED, 40: QUEUED, 50: QUEUED}
    assert "not a multiple of 2" in ledger.step(30).reason


def test_a_foreign_file_still_being_written_waits_to_settle(setup):
    ckpt, ledger = setup
    intake = intake_for(ckpt, ledger, tuning=dataclasses.replace(EvaldConfig().tuning, foreign_settle_s=5.0))
    (ckpt / "tiny-1_7.ckpt").write_bytes(b"half")
    now = os.stat(ckpt / "tiny-1_7.ckpt").st_mtime
    assert intake.found("tiny-1_7.ckpt", "watchdog", now=now + 1) is False and intake.settling
    intake.recheck_settled(now=now + 2)
    assert ledger.steps() == []
    intake.recheck_settled(now=now + 7)
    assert [s.step for s in ledger.steps()] == [7] and not intake.settling


def test_temp_names_and_evalds_own_files_are_never_checkpoints(setup):
    ckpt, ledger = setup
    intake = intake_for(ckpt, ledger)
    for name in (".step_000000010.tmp-ab12", "x.ckpt.tmp", "RUN.json", "RUN_END.json", "evald", "notes.txt"):
        (ckpt / name).write_text(json.dumps({}))
        assert intake.found(name, "rescan") is False
    assert ledger.steps() == [] and ledger.files() == []
