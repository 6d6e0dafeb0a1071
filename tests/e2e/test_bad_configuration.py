"""Factories that cannot work: a clear error, and never a silent evald.

* The operator's own factories are built at start-up: if they cannot be, evald says why and
  exits 3 at once (nothing it could ever evaluate).
* Factories announced by the trainer: evald keeps serving with the checkpoints queued, says
  why (and repeats it), and exits cleanly on SIGTERM, or with 3 on --idle-exit-s.
* A data factory of the wrong shape for the task is named with what was expected and what came.
"""

from __future__ import annotations

import signal

from evald.contracts import layout, wire
from tests import faults
from tests.harness import REPO, wait_for

PAIRS = "tests.bad_factories:input_label_pairs"


def test_operator_factory_that_cannot_be_imported_exits_3_at_start(tmp_path, procs):
    ckpt = tmp_path / "ckpt"
    faults.commit(ckpt, 5)
    evald = faults.start(tmp_path, ckpt, "--model-factory", "no_such_package.model:build",
                         "--data-factory", "examples.tiny_lm.data:validation_windows")
    procs.append(evald)
    assert evald.wait(120) == 3, evald.output()[-3000:]
    log = evald.output()
    assert "cannot build the evaluation network" in log and "no_such_package" in log and "--app-dir" in log
    assert "fix the configuration and start again" in log


def test_lm_data_of_input_label_pairs_is_named_and_evald_exits_3(tmp_path, procs):
    ckpt = tmp_path / "ckpt"
    faults.commit(ckpt, 5)
    evald = faults.start(tmp_path, ckpt, "--model-factory", "examples.tiny_lm.model:build_model",
                         "--model-kwargs", '{"seq_len": 64}', "--data-factory", PAIRS)
    procs.append(evald)
    assert evald.wait(120) == 3, evald.output()[-3000:]
    log = evald.output()
    assert "the lm task expects each validation item to be one row of T+1 integer token ids" in log
    assert "got a tuple of 2 (an array of shape (64,)" in log and "(inputs, labels) pairs" in log
    assert "too many values to unpack" not in log and "Traceback" not in log


def _announce(ckpt, data_factory):
    ckpt.mkdir(parents=True, exist_ok=True)
    message = wire.RunAnnounced(run_id="faults", ckpt_dir=str(ckpt), model_factory=faults.MODEL_FACTORY,
                                data_factory=data_factory)
    layout.write_run_file(ckpt, message.encode().decode())


def test_announced_bad_factory_keeps_checkpoints_queued_and_evald_alive(tmp_path, procs):
    ckpt = tmp_path / "ckpt"
    _announce(ckpt, wire.FactorySpec("no_such_package.data:build", {}, str(REPO)))
    faults.commit(ckpt, 5)
    evald = faults.start(tmp_path, ckpt)
    procs.append(evald)
    wait_for(lambda: "checkpoint(s) waiting, none can be evaluated" in evald.output(), 120, "the reminder")
    assert "no_such_package" in evald.output()
    evald.signal(signal.SIGTERM)
    assert evald.wait(60) == 0, evald.output()[-3000:]
    assert [(r["step"], r["state"]) for r in faults.ledger_rows(ckpt)] == [(5, "queued")]


def test_announced_data_of_the_wrong_shape_never_hangs_with_idle_exit(tmp_path, procs):
    ckpt = tmp_path / "ckpt"
    _announce(ckpt, wire.FactorySpec(PAIRS, {}, str(REPO)))
    faults.commit(ckpt, 5)
    evald = faults.start(tmp_path, ckpt, "--idle-exit-s", "3")
    procs.append(evald)
    assert evald.wait(120) == 3, evald.output()[-3000:]
    log = evald.output()
    assert "(inputs, labels) pairs" in log and "checkpoints are still waiting" in log
    assert [(r["step"], r["state"]) for r in faults.ledger_rows(ckpt)] == [(5, "queued")]


def test_no_factories_at_all_is_said_and_idle_exit_is_3(tmp_path, procs):
    ckpt = tmp_path / "ckpt"
    faults.commit(ckpt, 5)
    evald = faults.start(tmp_path, ckpt, "--idle-exit-s", "3")
    procs.append(evald)
    assert evald.wait(120) == 3, evald.output()[-3000:]
    assert "no model or data factory is known" in evald.output()


def test_a_run_file_others_can_write_names_no_code_that_evald_runs(tmp_path, procs):
    ckpt = tmp_path / "ckpt"
    faults.announce(ckpt)
    (ckpt / layout.RUN_FILE).chmod(0o666)  # anyone could have put `os:system` there
    faults.commit(ckpt, 5)
    evald = faults.start(tmp_path, ckpt, "--idle-exit-s", "3")
    procs.append(evald)
    assert evald.wait(120) == 3, evald.output()[-3000:]
    log = evald.output()
    assert "refused the model factory 'examples.tiny_lm.model:build_model'" in log
    assert "group or others can write" in log and "(mode 0o666)" in log and "not imported" in log
    assert "building the evaluation network" not in log
