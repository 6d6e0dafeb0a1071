"""A step evaluated again (its old result superseded) writes a second point with the same tags at the
same step. After a crash, the sink's start-up reconciliation must tell the new record from the old one:
counted per (step, tag), not by whether the tag exists at that step."""

from __future__ import annotations

import sqlite3

from evald.ledger.ledger import Ledger, Record
from evald.sinks.tensorboard import TensorBoardSink
from tests.harness import raw_scalar_steps


def test_a_pending_re_evaluation_is_written_and_one_already_on_disk_is_not_written_twice(tmp_path):
    ledger = Ledger(tmp_path / "ledger.sqlite")
    ledger.add_records([Record("eval", 10, 1.0, {"eval/loss": 3.378}, {})])
    sink = TensorBoardSink(tmp_path, ledger)
    sink.drain()
    sink.close()
    ledger.add_records([Record("eval", 10, 1.0, {"eval/loss": 3.339}, {})])  # the re-evaluation, pending
    sink = TensorBoardSink(tmp_path, ledger)   # a restart: reconcile, then drain
    sink.drain()
    sink.close()
    assert raw_scalar_steps(tmp_path, "eval/loss") == [10, 10]   # not lost as "already on disk"
    # the same record on disk but not marked written (a kill between the fsync and the mark)
    db = sqlite3.connect(tmp_path / "ledger.sqlite")
    db.execute("UPDATE records SET written=0 WHERE id=(SELECT MAX(id) FROM records)")
    db.commit()
    db.close()
    sink = TensorBoardSink(tmp_path, ledger)
    sink.drain()
    sink.close()
    assert raw_scalar_steps(tmp_path, "eval/loss") == [10, 10]   # not written twice
    assert ledger.pending_records() == []
    ledger.close()
