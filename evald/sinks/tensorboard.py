"""TensorBoard output with exactly one record per step and stream, even across crashes.

The layout follows the convention of Keras' TensorBoard callback (``train/`` and
``validation/`` runs with the same tag names): a run directory has one sub-run per
stream, ``train/`` and ``eval/``, and a tag loses its stream's prefix there, so
``train/loss`` and ``eval/loss`` are both written as ``loss`` and TensorBoard draws
training and evaluation loss on one chart. Tags of other namespaces keep their
names: ``evald/...`` (timings, lag, decisions; in ``eval/``), ``health/...`` (alerts;
in ``train/`` with the scalars that raised them) and ``sample/...``. The run summary
(stream ``summary``) and the Custom Scalars layout (stream ``layout``) go to ``eval/``.
The ledger keeps the stream-prefixed names; a metric's standard error is written as the
bounds of a margin and the sample texts as ``Samples/...`` (tensorboard_layout.py).

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

import contextlib
import logging
import os
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Iterable, Mapping

from tensorboardX.event_file_writer import EventsWriter
from tensorboardX.proto import event_pb2, summary_pb2
from tensorboardX.summary import scalar as scalar_summary
from tensorboardX.summary import text as text_summary

from evald.ledger.disk_full import REMIND_S, RETRY_S, is_full
from evald.sinks.tensorboard_layout import (LAYOUT_STREAM, LAYOUT_TAG, layout_summary, shown_eval_scalars,
                                            shown_text_tag)
from evald.ledger.ledger import Ledger, Record

log = logging.getLogger("evald.tensorboard")
FSYNC_EVERY = 500  # records per fsync: a crash before the mark is found on disk at the restart (_reconcile)
logging.getLogger("tensorboardX.x2num").setLevel(logging.ERROR)  # NaN is a legal value, not one warning a point


class EventLog:
    """One event file of this process; ``write`` appends a record, fsynced now or at ``flush``."""

    def __init__(self, logdir: Path) -> None:
        self.logdir = Path(logdir)
        self.logdir.mkdir(parents=True, exist_ok=True)
        suffix = f".{os.getpid()}.{uuid.uuid4().hex[:8]}.evald"
        self._good = 0  # bytes of whole, fsynced records: a failed write is cut back to this
        self._abandoned = False
        self._writer = EventsWriter(str(self.logdir / "events"), suffix)
        self.path = Path(self._writer._file_name)
        self._flush()

    def write(self, step: int, wall_time: float, scalars: Mapping[str, float] | None = None,
              texts: Mapping[str, str] | None = None, flush: bool = True,
              summaries: Iterable[summary_pb2.Summary] = ()) -> None:
        values = []
        for tag, value in (scalars or {}).items():
            values.extend(scalar_summary(tag, float(value)).value)  # NaN and inf are legal values
        for tag, content in (texts or {}).items():
            values.extend(text_summary(tag, content).value)
        for summary in summaries:
            values.extend(summary.value)
        if not values:
            return
        event = event_pb2.Event(wall_time=wall_time, step=int(step), summary=summary_pb2.Summary(value=values))
        self._flush(event, sync=flush)

    def flush(self) -> None:
        self._flush()

    def _flush(self, event: event_pb2.Event | None = None, sync: bool = True) -> None:
        try:
            if event is not None:
                self._writer.write_event(event)
            if not sync:
                return
            self._writer.flush()  # RecordWriter.flush fsyncs
        except OSError:
            self.abandon()
            raise
        self._good = self.path.stat().st_size

    def abandon(self) -> None:
        """After a failed write (a full disk): close, and cut the file back to its whole records."""
        if self._abandoned:
            return
        self._abandoned = True
        try:
            self._writer.close()
        except OSError:  # its flush failed before the file was closed
            with contextlib.suppress(OSError):
                self._writer._py_recordio_writer.close()
        try:
            os.truncate(self.path, self._good)
            if self._good == 0:
                self.path.unlink()
        except OSError:
            pass

    def close(self) -> None:
        self._writer.close()


SUB_RUNS = {"train": "train", "eval": "eval", "summary": "eval", LAYOUT_STREAM: "eval"}  # stream -> sub-run
STREAM_PREFIXES = {"train": "train/", "eval": "eval/"}           # dropped from tags in the sub-run


def sub_run(stream: str) -> str:
    return SUB_RUNS.get(stream, stream)


def shown_tag(stream: str, tag: str) -> str:
    """The tag as TensorBoard shows it in the stream's sub-run: ``eval/loss`` -> ``loss``."""
    prefix = STREAM_PREFIXES.get(stream)
    return tag[len(prefix):] if prefix and tag.startswith(prefix) and len(tag) > len(prefix) else tag


def shown(record: Record) -> tuple[dict[str, float], dict[str, str]]:
    """A record's scalars and texts as written in its sub-run (tensorboard_layout.py says why)."""
    def name(tag: str) -> str:
        return shown_tag(record.stream, tag)

    if record.stream == "eval":
        return (shown_eval_scalars(record.scalars, name),
                {shown_text_tag(name(k)): v for k, v in record.texts.items()})
    return {name(k): v for k, v in record.scalars.items()}, {name(k): v for k, v in record.texts.items()}


class TensorBoardSink:
    """Writes the ledger's pending records into the run directory's sub-runs."""

    def __init__(self, run_dir: Path, ledger: Ledger) -> None:
        self.run_dir = Path(run_dir)
        self.ledger = ledger
        self._logs: dict[str, EventLog] = {}  # one event file per sub-run, made at its first record
        self._failed_at = self._reminded = float("-inf")
        self._reconcile()

    def _reconcile(self) -> None:
        pending = self.ledger.pending_records()
        already = []
        for name in sorted({sub_run(r.stream) for r in pending}):
            mine = [r for r in pending if sub_run(r.stream) == name]
            steps = {r.step for r in mine}
            # Counted per (step, tag): a step evaluated again (its old result superseded) has the
            # same tags at the same step twice, and only a surplus on disk is this record.
            on_disk = tag_counts_on_disk(self.run_dir / name, steps)
            written = Counter((r.step, t) for r in self.ledger.written_records(steps)
                              if sub_run(r.stream) == name for t in _tags(r))
            for r in mine:
                if all(on_disk[(r.step, t)] > written[(r.step, t)] for t in _tags(r)):
                    already.append(r.id)
                    written.update((r.step, t) for t in _tags(r))
        if already:
            log.info("%d TensorBoard record(s) reached disk just before evald stopped; not written again",
                     len(already))
            self.ledger.mark_written([i for i in already if i is not None])

    def drain(self) -> int:
        """Write every pending record; returns how many. A full disk leaves them pending (not lost)."""
        if time.monotonic() - self._failed_at < RETRY_S:
            return 0
        if self._failed_at > float("-inf"):  # after a failure: what reached disk is found, not written again
            self._reconcile()
            self._failed_at = float("-inf")
        pending = self.ledger.pending_records()
        try:
            for start in range(0, len(pending), FSYNC_EVERY):  # one fsync a file and one transaction a chunk
                chunk = pending[start:start + FSYNC_EVERY]
                for record in chunk:
                    name = sub_run(record.stream)
                    if name not in self._logs:
                        self._logs[name] = EventLog(self.run_dir / name)
                    if record.stream == LAYOUT_STREAM:  # TensorBoard's custom_scalars layout, not a text
                        self._logs[name].write(record.step, record.wall_time, flush=False,
                                               summaries=[layout_summary(record.texts[LAYOUT_TAG])])
                        continue
                    scalars, texts = shown(record)
                    self._logs[name].write(record.step, record.wall_time, scalars, texts, flush=False)
                for event_log in self._logs.values():
                    event_log.flush()
                self.ledger.mark_written([r.id for r in chunk])  # type: ignore[misc]
        except OSError as exc:
            if not is_full(exc):
                raise
            self._full(exc)
            return 0
        return len(pending)

    def _full(self, exc: OSError) -> None:
        """Every file cut back to its whole records; new ones once there is room (a second later)."""
        for event_log in self._logs.values():
            event_log.abandon()
        self._logs.clear()
        self._failed_at = time.monotonic()
        if self._failed_at - self._reminded >= REMIND_S:
            self._reminded = self._failed_at
            log.warning("TensorBoard events in %s cannot be written (%s); the records wait in the ledger and are "
                        "written when there is room (retried every %.0fs)", self.run_dir, exc, RETRY_S)

    def close(self) -> None:
        for event_log in self._logs.values():
            event_log.close()


def _tags(record: Record) -> set[str]:
    scalars, texts = shown(record)
    return {*scalars, *texts}


def tag_counts_on_disk(logdir: Path, steps: Iterable[int] | None = None) -> Counter:
    """``{(step, tag): records}`` in ``logdir``'s event files (only ``steps`` when given)."""
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader

    wanted = None if steps is None else set(steps)
    found: Counter = Counter()
    for path in sorted(Path(logdir).glob("events.out.tfevents.*")):
        try:
            for raw in RawEventFileLoader(str(path)).Load():
                event = event_pb2.Event.FromString(raw)
                if not event.HasField("summary") or (wanted is not None and event.step not in wanted):
                    continue
                found.update((event.step, tag) for tag in {v.tag.removesuffix("/text_summary")
                                                           for v in event.summary.value})
        except Exception:  # a torn tail: what was read before it stands
            continue
    return found
