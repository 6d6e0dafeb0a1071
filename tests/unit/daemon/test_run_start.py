"""Run's constructor records what it is given and touches nothing; ``start`` opens, ``close`` closes what opened."""

from __future__ import annotations

import queue
import sqlite3
import threading

import pytest

from evald.daemon.run import Run
from evald.daemon.run_dir import LEDGER_FILE
from evald.ledger.ledger import LedgerVersionError
from tests.harness import wait_for
from tests.unit.daemon.rig import MeanWeightPipeline, config, stage


def _run(tmp_path, run_dir) -> Run:
    ckpt = stage(tmp_path / "ckpt", 10)
    return Run(config(tmp_path, None, ckpt_dir=str(ckpt)), ckpt, run_dir, control=None, receiver=None,
               events=queue.Queue(), pipeline=MeanWeightPipeline())


def test_the_constructor_does_no_io_and_start_opens_what_close_closes(tmp_path):
    run_dir = tmp_path / "run"
    threads = threading.active_count()
    run = _run(tmp_path, run_dir)
    assert not run_dir.exists() and threading.active_count() == threads  # no file, no thread
    run_dir.mkdir()
    run.start()
    try:
        assert (run_dir / LEDGER_FILE).exists() and threading.active_count() > threads  # the watcher runs
        assert [row.step for row in run.ledger.steps()] == [10]  # the rescan at start found the checkpoint
    finally:
        run.close()
    wait_for(lambda: threading.active_count() == threads, 10, "the watcher's threads ended")


def test_a_start_that_fails_half_way_closes_what_it_opened(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    run = _run(tmp_path, run_dir)
    with sqlite3.connect(run_dir / LEDGER_FILE) as db:  # a ledger of a schema this evald does not read
        db.execute("PRAGMA user_version = 999")
    with pytest.raises(LedgerVersionError):
        run.start()
    run.close()  # nothing half-open is left, and closing twice is harmless
    run.close()
