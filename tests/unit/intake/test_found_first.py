"""Issue 18 item 17: which source found a step first, and that the others found it too.

The trainer commits a snapshot (a rename) and then rings the doorbell, so the watchdog
often sees it a few milliseconds before the notification arrives; the log said only
"found via watchdog", which read as if the notifications were lost. Intake now says which
source was first and, when another one reports the same entry, that it did and how much
later. A real ledger and a real evald-layout checkpoint."""

from __future__ import annotations

import logging

import numpy as np

from evald.config import EvaldConfig
from evald.contracts import layout
from evald.intake.intake import Intake
from evald.ledger.ledger import Ledger


def _intake(tmp_path) -> tuple[Intake, Ledger]:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    ledger = Ledger(tmp_path / "ledger.sqlite")
    return Intake(ckpt, ledger, EvaldConfig()), ledger


def test_the_first_source_is_recorded_and_a_later_notification_is_told(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="evald.intake.intake")
    intake, ledger = _intake(tmp_path)
    name = layout.write_checkpoint(intake.ckpt_dir, 10, {"w": np.ones(3, np.float32)}, run_id="r").name
    assert intake.found(name, "watchdog", now=100.0)
    assert not intake.found(name, "zmq", now=100.004)  # already judged: no second row
    assert ledger.step(10).found_via == "watchdog"
    lines = [r.getMessage() for r in caplog.records]
    assert any("found step 10" in line and "via watchdog (first)" in line for line in lines), lines
    assert any("step 10" in line and "also via zmq" in line and "4 ms after watchdog" in line for line in lines), lines


def test_a_notification_first_is_credited_to_zeromq(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="evald.intake.intake")
    intake, ledger = _intake(tmp_path)
    name = layout.write_checkpoint(intake.ckpt_dir, 20, {"w": np.ones(3, np.float32)}, run_id="r").name
    assert intake.found(name, "zmq", now=50.0)
    intake.found(name, "watchdog", now=50.2)
    intake.found(name, "rescan", now=60.0)
    intake.found(name, "rescan", now=90.0)  # a rescan sees every entry again and again: told once
    assert ledger.step(20).found_via == "zmq"
    told = [(r.levelno, r.getMessage()) for r in caplog.records if "also via" in r.getMessage()]
    assert [level for level, _ in told] == [logging.INFO], told  # the rescan's line is DEBUG only
