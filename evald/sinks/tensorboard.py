"""TensorBoard output with exactly one record per step and stream, even across crashes.

The layout follows the convention of Keras' TensorBoard callback (``train/`` and
``validation/`` runs with the same tag names): a run directory has one sub-run per
stream, ``train/`` and ``eval/``, and a tag loses its stream's prefix there, so
``train/loss`` and ``eval/loss`` are both written as ``loss`` and TensorBoard draws
training and evaluation loss on one chart. Tags of other namespaces keep their
names: ``evald/...`` (timings, lag, decisions; in ``eval/``), ``health/...`` (alerts;
in ``train/`` with the scalars that raised them) and ``sample/...``. The run summary
(stream ``summary``) goes to ``eval/``. The ledger keeps the stream-prefixed names.

The ledger's outbox (``records``) holds every record evald has decided to write,
committed with the state change it reports. This sink writes pending records with
tensorboardX's synchronous ``EventsWriter`` (tensorboardX's ``SummaryWriter`` queues
in memory and a SIGKILL loses the queue), ONE event per record, fsynced, then marks
them written. A kill between the fsync and the mark leaves a record pending that is
already on disk: at start-up, pending records are looked up in the event files with
TensorBoard's own raw loader (a torn last record fails its CRC and does not count),
and only the missing ones are written. Each evald process writes its own file.
"""

from __future__ import annotations

import logging
import os
import uuid
from pathlib import Path
from typing import Iterable, Mapping

from tensorboardX.event_file_writer import EventsWriter
from tensorboardX.proto import event_pb2, summary_pb2
from tensorboardX.summary import scalar as scalar_summary
from tensorboardX.summary import text as text_summary

from evald.ledger import Ledger, Record

log = logging.getLogger("evald.tensorboard")


class EventLog:
    """One event file of this process; each ``write`` is one fsynced record."""

    def __init__(self, logdir: Path) -> None:
        self.logdir = Path(logdir)
        self.logdir.mkdir(parents=True, exist_ok=True)
        suffix = f".{os.getpid()}.{uuid.uuid4().hex[:8]}.evald"
        self._writer = EventsWriter(str(self.logdir / "events"), suffix)
        self.path = Path(self._writer._file_name)
        self._writer.flush()

    def write(self, step: int, wall_time: float, scalars: Mapping[str, float] | None = None,
              texts: Mapping[str, str] | None = None) -> None:
        values = []
        for tag, value in (scalars or {}).items():
            values.extend(scalar_summary(tag, float(value)).value)  # NaN and inf are legal values
        for tag, content in (texts or {}).items():
            values.extend(text_summary(tag, content).value)
        if not values:
            return
        event = event_pb2.Event(wall_time=wall_time, step=int(step), summary=summary_pb2.Summary(value=values))
        self._writer.write_event(event)
        self._writer.flush()  # RecordWriter.flush fsyncs

    def close(self) -> None:
        self._writer.close()


SUB_RUNS = {"train": "train", "eval": "eval", "summary": "eval"}  # stream -> sub-run directory
STREAM_PREFIXES = {"train": "train/", "eval": "eval/"}           # dropped from tags in the sub-run


def sub_run(stream: str) -> str:
    return SUB_RUNS.get(stream, stream)


def shown_tag(stream: str, tag: str) -> str:
    """The tag as TensorBoard shows it in the stream's sub-run: ``eval/loss`` -> ``loss``."""
    prefix = STREAM_PREFIXES.get(stream)
    return tag[len(prefix):] if prefix and tag.startswith(prefix) and len(tag) > len(prefix) else tag


class TensorBoardSink:
    """Writes the ledger's pending records into the run directory's sub-runs."""

    def __init__(self, run_dir: Path, ledger: Ledger) -> None:
        self.run_dir = Path(run_dir)
        self.ledger = ledger
        self._logs: dict[str, EventLog] = {}  # one event file per sub-run, made at its first record
        self._reconcile()

    def _reconcile(self) -> None:
        pending = self.ledger.pending_records()
        already = []
        for name in sorted({sub_run(r.stream) for r in pending}):
            mine = [r for r in pending if sub_run(r.stream) == name]
            on_disk = tags_on_disk(self.run_dir / name, {r.step for r in mine})
            already += [r.id for r in mine if _tags(r) <= on_disk.get(r.step, set())]
        if already:
            log.info("%d TensorBoard record(s) reached disk just before evald stopped; not written again",
                     len(already))
            self.ledger.mark_written([i for i in already if i is not None])

    def drain(self) -> int:
        """Write every pending record; returns how many."""
        pending = self.ledger.pending_records()
        for record in pending:
            name = sub_run(record.stream)
            if name not in self._logs:
                self._logs[name] = EventLog(self.run_dir / name)
            self._logs[name].write(record.step, record.wall_time,
                                   {shown_tag(record.stream, k): v for k, v in record.scalars.items()},
                                   {shown_tag(record.stream, k): v for k, v in record.texts.items()})
            self.ledger.mark_written([record.id])  # type: ignore[list-item]
        return len(pending)

    def close(self) -> None:
        for event_log in self._logs.values():
            event_log.close()


def _tags(record: Record) -> set[str]:
    return {shown_tag(record.stream, tag) for tag in (*record.scalars, *record.texts)}


def tags_on_disk(logdir: Path, steps: Iterable[int] | None = None) -> dict[int, set[str]]:
    """``{step: tags}`` of every record in ``logdir``'s event files (only ``steps`` when given)."""
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader

    wanted = None if steps is None else set(steps)
    found: dict[int, set[str]] = {}
    for path in sorted(Path(logdir).glob("events.out.tfevents.*")):
        try:
            for raw in RawEventFileLoader(str(path)).Load():
                event = event_pb2.Event.FromString(raw)
                if not event.HasField("summary") or (wanted is not None and event.step not in wanted):
                    continue
                found.setdefault(event.step, set()).update(v.tag.removesuffix("/text_summary")
                                                           for v in event.summary.value)
        except Exception:  # a torn tail: what was read before it stands
            continue
    return found
