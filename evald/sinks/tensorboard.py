"""TensorBoard output with exactly one point per step, even across crashes and restarts.

tensorboardX's ``SummaryWriter`` queues events in memory and a SIGKILL loses
them, while its ``flush()`` does not drain the queue. So evald writes with
tensorboardX's synchronous ``EventsWriter`` instead, and puts all values of one
evaluation into ONE event record, fsynced before the ledger marks the
checkpoint evaluated. A record is either wholly on disk or (torn by a crash)
rejected by its CRC, so a step is never half-written. On start-up
``steps_on_disk`` reads the existing event files back, so a checkpoint whose
points reached disk just before a crash is recognised instead of written
twice. Every process writes its own file (unique suffix), never appending to
another's.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Mapping

from tensorboardX.event_file_writer import EventsWriter
from tensorboardX.proto import event_pb2, summary_pb2
from tensorboardX.summary import scalar as scalar_summary
from tensorboardX.summary import text as text_summary


class EventLog:
    def __init__(self, logdir: Path) -> None:
        self.logdir = Path(logdir)
        self.logdir.mkdir(parents=True, exist_ok=True)
        suffix = f".{os.getpid()}.{uuid.uuid4().hex[:8]}.evald"
        self._writer = EventsWriter(str(self.logdir / "events"), suffix)
        self.path = Path(self._writer._file_name)
        self._writer.flush()

    def write(self, step: int, wall_time: float, scalars: Mapping[str, float] | None = None,
              texts: Mapping[str, str] | None = None) -> None:
        """One durable record holding every value for ``step``."""
        values = []
        for tag, value in (scalars or {}).items():
            values.extend(scalar_summary(tag, float(value)).value)
        for tag, content in (texts or {}).items():
            values.extend(text_summary(tag, content).value)
        if not values:
            return
        event = event_pb2.Event(wall_time=wall_time, step=int(step), summary=summary_pb2.Summary(value=values))
        self._writer.write_event(event)
        self._writer.flush()  # RecordWriter.flush fsyncs

    def close(self) -> None:
        self._writer.close()


def steps_on_disk(logdir: Path, tag: str) -> dict[int, dict[str, float]]:
    """``{step: {tag: value}}`` for every event in ``logdir``'s files that holds ``tag``.

    Read with TensorBoard's own raw loader (no reservoir sampling, no purge
    logic), tolerating a torn last record.
    """
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader

    found: dict[int, dict[str, float]] = {}
    for path in sorted(Path(logdir).glob("events.out.tfevents.*")):
        try:
            for raw in RawEventFileLoader(str(path)).Load():
                event = event_pb2.Event.FromString(raw)
                if not event.HasField("summary"):
                    continue
                tags = {v.tag: v.simple_value for v in event.summary.value if v.HasField("simple_value")}
                if tag in tags:
                    found[event.step] = tags
        except Exception:  # a torn tail: what was read before it stands
            continue
    return found
