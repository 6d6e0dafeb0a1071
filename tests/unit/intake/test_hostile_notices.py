"""Issue 19, kind 4: notices of checkpoints that do not exist leave no ledger row and no log flood.

5,000 notifications naming absent ``step_`` directories whose step is out of range left 5,000 rows and
5,001 ERROR lines (the range check ran before the existence check, then wrote a row); from a plaintext
TCP peer, 300 notices left 300 rows. Now: no row for an entry that does not exist (so what one peer can
add to the ledger is bounded by what is on disk), and repeated rejections are logged rate-limited with a
count of those not logged."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from evald.config import EvaldConfig
from evald.intake.intake import Intake
from evald.ledger.ledger import Ledger
from tests import faults


@pytest.fixture
def intake(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    ledger = Ledger(tmp_path / "ledger.sqlite")
    yield Intake(ckpt, ledger, dataclasses.replace(EvaldConfig(), lag_policy="all"))
    ledger.close()


def _rows(intake: Intake) -> int:
    return len(intake.ledger.files()) + len(intake.ledger.step_numbers())


@pytest.mark.parametrize("found_via", ["zmq", "rescan", "watchdog"])
def test_notices_of_absent_entries_leave_no_row_whatever_their_step(intake, caplog, found_via):
    names = [f"step_{'9' * 30}{i}" for i in range(2000)] + [
        f"x-{i}_{'9' * 40}.ckpt" for i in range(300)] + [f"step_{'9' * 20}-part-00000-of-00002"]
    if found_via != "watchdog":  # one the kernel saw appear and vanish is accounted for as deleted, by design
        names += [f"step_{i:09d}" for i in range(500)]
    with caplog.at_level(logging.INFO):
        for name in names:
            intake.found(name, found_via)
    assert _rows(intake) == 0
    assert len(caplog.records) <= 1


def test_repeated_rejections_are_logged_rate_limited_with_a_count(intake, caplog):
    for step in range(1, 41):
        path = faults.commit(intake.ckpt_dir, step)
        (path / "MANIFEST.json").chmod(0o644)
        path.chmod(0o755)
        (path / "MANIFEST.json").write_text("{not json")
    with caplog.at_level(logging.ERROR):
        for step in range(1, 41):
            assert intake.found(f"step_{step:09d}", "rescan")
    assert _rows(intake) == 80  # each real bad entry is recorded once (its file row and its failed step)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) <= 11, len(errors)
    assert "not logged" in errors[-1].getMessage() or len(errors) <= 10
    intake.flush_rejection_log(force=True)
    assert "30 more rejected" in caplog.records[-1].getMessage()


def test_an_out_of_range_step_that_exists_is_rejected_once(intake):
    name = f"step_{'9' * 30}"
    (intake.ckpt_dir / name).mkdir()
    assert intake.found(name, "rescan")
    assert [(n, s, st) for n, s, st, _ in intake.ledger.files()] == [(name, None, "rejected")]
    assert intake.ledger.step_numbers() == []


def test_a_link_to_an_entry_whose_name_is_not_utf8_is_recorded_not_raised(intake):
    """Found by the generated-tree property test: the duplicate's reason quoted the target's name,
    which sqlite could not store (UnicodeEncodeError out of the intake)."""
    import os

    odd = os.fsdecode(b"step_00000001\xff")
    faults.commit(intake.ckpt_dir, 1).rename(intake.ckpt_dir / odd)
    os.symlink(odd, intake.ckpt_dir / "step_000000005")
    for name in sorted(os.listdir(intake.ckpt_dir)):
        intake.found(name, "rescan")
    assert len(intake.ledger.files()) == 2
