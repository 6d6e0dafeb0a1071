"""A step evaluated again (its old result superseded) has the same tags at the same step twice in the
ledger's outbox. The event file shows ONE value per (tag, step), the newest (issue 26: TensorBoard's
server keeps one anyway, and which one depended on the order it read them); after a crash between
the fsync and the mark, the start-up rewrite neither loses the new value nor writes it twice."""

from __future__ import annotations

import sqlite3

from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
from tensorboard.compat.proto import event_pb2
from tensorboard.util import tensor_util

from evald.ledger.ledger import Ledger, Record
from evald.sinks.tensorboard import TensorBoardSink


def raw_points(run, sub_run: str, tag: str) -> list[tuple[int, float]]:
    """Every (step, value) of ``tag`` in the sub-run's event files, read raw (nothing purged)."""
    out = []
    for path in sorted((run / sub_run).glob("events.out.tfevents.*")):
        for raw in RawEventFileLoader(str(path)).Load():
            event = event_pb2.Event.FromString(raw)
            out += [(event.step, round(float(tensor_util.make_ndarray(v.tensor)) if v.HasField("tensor")
                                       else v.simple_value, 4)) for v in event.summary.value if v.tag == tag]
    return out


def test_a_pending_re_evaluation_is_written_and_one_already_on_disk_is_not_written_twice(tmp_path):
    ledger = Ledger(tmp_path / "ledger.sqlite")
    ledger.add_records([Record("eval", 10, 1.0, {"eval/loss": 3.378}, {})])
    sink = TensorBoardSink(tmp_path, ledger)
    sink.drain()
    sink.close()
    ledger.add_records([Record("eval", 10, 1.0, {"eval/loss": 3.339}, {})])  # the re-evaluation, pending
    sink = TensorBoardSink(tmp_path, ledger)   # a restart: rewritten, then drained
    sink.drain()
    sink.close()
    assert raw_points(tmp_path, "eval", "Loss") == [(10, 3.339)]   # the new value, the old one gone
    # the same record on disk but not marked written (a kill between the fsync and the mark)
    db = sqlite3.connect(tmp_path / "ledger.sqlite")
    db.execute("UPDATE records SET written=0 WHERE id=(SELECT MAX(id) FROM records)")
    db.commit()
    db.close()
    sink = TensorBoardSink(tmp_path, ledger)
    sink.drain()
    sink.close()
    assert raw_points(tmp_path, "eval", "Loss") == [(10, 3.339)]   # not written twice
    assert ledger.pending_records() == []
    ledger.close()


def test_a_re_evaluation_while_running_replaces_the_old_value_in_the_file(tmp_path):
    ledger = Ledger(tmp_path / "ledger.sqlite")
    sink = TensorBoardSink(tmp_path, ledger)
    for step, loss in ((10, 3.0), (20, 2.0), (10, 2.5)):
        ledger.add_records([Record("eval", step, 1.0, {"eval/loss": loss}, {})])
        sink.drain()
    sink.close()
    assert raw_points(tmp_path, "eval", "Loss") == [(10, 2.5), (20, 2.0)]
    assert len(list((tmp_path / "eval").glob("events.out.tfevents.*"))) == 1  # the old file replaced
    assert not list((tmp_path / "eval").glob(".evald-*"))                    # no temporary file left
    ledger.close()
