"""TensorBoard output: each sub-run's event file shows one current value per (tag, step), even across
crashes and whatever order the points come in.

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
committed with the state change it reports. A sub-run's events are a view of its records
(tensorboard_view.py): a pending record that moves each of its tags forward is appended
(tensorboardX's synchronous record writer, fsynced per chunk; its ``SummaryWriter`` queues
in memory and a SIGKILL loses the queue); any other record (a step below a tag's latest:
backfill, retry, a restart's queued cells) makes the sink REWRITE the sub-run's file from all
its records, in step order. TensorBoard's server drops a tag's points from a step written
below its latest, so the rewritten file, read as one in-order stream, replaces what it showed.

A rewrite is atomic for a reader: the new file is written under a name TensorBoard does not
read (``.evald-*.tmp``), fsynced, renamed to an event file name that sorts after every event
file of the sub-run (TensorBoard reads a directory's files in name order, so the old files'
last points come before the new file's first), and only then are evald's older files
(``*.evald``) removed; files of other writers are left alone. A crash at any point leaves the
old files, the new one, or both (both: the newer file, read last, wins), and the records not
marked written; at start-up every sub-run with records is rewritten once from the ledger, so
nothing is lost and nothing is counted twice. Rewriting costs one pass over the sub-run's
records (docs/performance.md).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
import struct
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Iterable, Mapping

from tensorboardX.proto import event_pb2, summary_pb2
from tensorboardX.summary import _clean_tag
from tensorboardX.summary import text as text_summary

from evald.ledger.disk_full import REMIND_S, RETRY_S, is_full
from evald.ledger.ledger import Ledger, Record
from evald.sinks import tensorboard_view as view
from evald.sinks.tensorboard_layout import LAYOUT_STREAM, LAYOUT_TAG, layout_summary
from evald.sinks.tensorboard_view import SUB_RUNS, shown, shown_tag, sub_run  # noqa: F401 - the sink's names

log = logging.getLogger("evald.tensorboard")
FSYNC_EVERY = 500  # records per fsync when appending
EVALD_SUFFIX = ".evald"  # evald's own event files end so; only those are replaced by a rewrite
logging.getLogger("tensorboardX.x2num").setLevel(logging.ERROR)  # NaN is a legal value, not one warning a point


class EventLog:
    """One event file of this process: made whole (its first ``events`` fsynced) before TensorBoard
    can see it, named to sort after every event file in ``logdir``; ``write`` appends a record,
    fsynced now or at ``flush``."""

    def __init__(self, logdir: Path, events: Iterable[view.Event] = ()) -> None:
        self.logdir = Path(logdir)
        self.logdir.mkdir(parents=True, exist_ok=True)
        self._good = 0  # bytes of whole, fsynced records: a failed write is cut back to this
        self._abandoned = False
        self.path = self.logdir / f".evald-{uuid.uuid4().hex}.tmp"  # no "tfevents": TensorBoard skips it
        self._file = open(self.path, "wb")
        try:
            self._file.write(_framed(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2")
                                     .SerializeToString()))
            first = True
            for event in events:
                if first:  # a restart marker at the first step, for readers that purge on one
                    self._file.write(_framed(event_pb2.Event(wall_time=event.wall_time, step=event.step, session_log=(
                        event_pb2.SessionLog(status=event_pb2.SessionLog.START))).SerializeToString()))
                    first = False
                self.write_event(event, flush=False)
            self._sync()
            final = self.logdir / _next_name(self.logdir)
            os.rename(self.path, final)
            self.path = final
            _fsync_dir(self.logdir)
        except OSError:
            self.abandon()
            raise
        self._good = self.path.stat().st_size

    def write_event(self, event: view.Event, flush: bool = True) -> None:
        summaries = [layout_summary(event.layout)] if event.layout is not None else []
        self.write(event.step, event.wall_time, event.scalars, event.texts, flush=flush, summaries=summaries)

    def write(self, step: int, wall_time: float, scalars: Mapping[str, float] | None = None,
              texts: Mapping[str, str] | None = None, flush: bool = True,
              summaries: Iterable[summary_pb2.Summary] = ()) -> None:
        values = []
        for tag, value in (scalars or {}).items():  # what tensorboardX's scalar() makes, without its checks
            values.append(summary_pb2.Summary.Value(tag=_clean_tag(tag), simple_value=float(value)))  # NaN is legal
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
                self._file.write(_framed(event.SerializeToString()))
            if not sync:
                return
            self._sync()
        except OSError:
            self.abandon()
            raise
        self._good = self.path.stat().st_size

    def abandon(self) -> None:
        """After a failed write (a full disk): close, and cut the file back to its whole records (a
        file not yet whole, still under its temporary name, is removed)."""
        if self._abandoned:
            return
        self._abandoned = True
        with contextlib.suppress(OSError):
            self._file.close()
        try:
            if self._good == 0:
                self.path.unlink()
            else:
                os.truncate(self.path, self._good)
        except OSError:
            pass

    def _sync(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        if not self._abandoned:
            self._file.close()


try:  # a C CRC-32C when installed (google-crc32c); tensorboardX's pure-Python one costs ~1 us a byte
    from google_crc32c import value as _crc32c
except ImportError:  # pragma: no cover - depends on the environment
    from tensorboardX.crc32c import crc32c as _crc32c


def _masked_crc(data: bytes) -> int:
    crc = _crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _framed(data: bytes) -> bytes:
    """One TFRecord: length, its masked CRC-32C, the data, its masked CRC-32C (little-endian)."""
    header = struct.pack("<Q", len(data))
    return header + struct.pack("<I", _masked_crc(header)) + data + struct.pack("<I", _masked_crc(data))


_NAME = re.compile(r"^events\.out\.tfevents\.([0-9]+)\.")


def _next_name(logdir: Path) -> str:
    """``events.out.tfevents.<seconds>.<host>.<pid>.<random>.evald``, sorting after every event file here
    (its seconds field raised past theirs when the clock or a same-second name would not)."""
    names = [p.name for p in logdir.iterdir() if "tfevents" in p.name]
    stamp = int(time.time())
    tail = f".{socket.gethostname()}.{os.getpid()}.{uuid.uuid4().hex[:8]}{EVALD_SUFFIX}"
    name = f"events.out.tfevents.{stamp:010d}{tail}"
    newest = max(names, default="")
    if name <= newest:
        match = _NAME.match(newest)
        stamp = max(stamp, int(match.group(1)) if match else 0) + 1
        name = f"events.out.tfevents.{stamp:010d}{tail}"
    return name


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class TensorBoardSink:
    """Writes the ledger's pending records into the run directory's sub-runs; a sink (evald.sinks.sink)."""

    name = "TensorBoard events"

    def __init__(self, run_dir: Path, ledger: Ledger) -> None:
        self.run_dir = Path(run_dir)
        self.ledger = ledger
        self._logs: dict[str, EventLog] = {}     # sub-run -> this process's (current) event file
        self._order: dict[str, view.Order] = {}  # sub-run -> the highest step of each tag in its file
        self._stale: set[str] = set()            # sub-runs to rewrite before anything is appended
        self._failed_at = self._reminded = float("-inf")
        self._startup()

    def _startup(self) -> None:
        """Every sub-run with records is rewritten once from the ledger (at the first ``drain``): records
        that reached disk just before a kill (fsynced, not yet marked written) are not doubled, a torn
        tail is gone, and the files of earlier processes become one in-order file."""
        self._stale = {sub_run(stream) for stream in self.ledger.record_streams()}
        pending = len(self.ledger.pending_records())
        if pending:
            log.info("%d TensorBoard record(s) were waiting at start-up; %s rewritten from the ledger (those that "
                     "reached disk before evald stopped are not written twice)", pending,
                     ", ".join(sorted(self._stale)))

    def tick(self, state: object = None) -> None:
        """The sink's turn (evald.sinks.sink.RunState): the outbox is the ledger this sink was given."""
        self.drain()

    def drain(self) -> int:
        """Write every pending record; returns how many. A full disk leaves them pending (not lost)."""
        if time.monotonic() - self._failed_at < RETRY_S:
            return 0
        self._failed_at = float("-inf")
        pending = self.ledger.pending_records()
        try:
            for name, records in view.by_sub_run(pending).items():
                order = self._order.get(name)
                if name in self._stale or order is None or not all(_move(order, r) for r in records):
                    self._rewrite(name)  # from every record of the sub-run, these included
                    self.ledger.mark_written([r.id for r in records])  # type: ignore[misc]
                    continue
                for start in range(0, len(records), FSYNC_EVERY):  # one fsync and one transaction a chunk
                    chunk = records[start:start + FSYNC_EVERY]
                    for record in chunk:
                        self._append(name, record)
                    self._logs[name].flush()
                    self.ledger.mark_written([r.id for r in chunk])  # type: ignore[misc]
            for name in sorted(self._stale):  # no pending record, but not yet rewritten (start-up, a full disk)
                self._rewrite(name)
        except OSError as exc:
            if not is_full(exc):
                raise
            self._full(exc)
            return 0
        return len(pending)

    def _append(self, name: str, record: Record) -> None:
        if name not in self._logs:
            self._logs[name] = EventLog(self.run_dir / name)
        if record.stream == LAYOUT_STREAM:  # TensorBoard's custom_scalars layout, not a text
            self._logs[name].write(record.step, record.wall_time, flush=False,
                                   summaries=[layout_summary(record.texts[LAYOUT_TAG])])
            return
        scalars, texts = shown(record)
        self._logs[name].write(record.step, record.wall_time, scalars, texts, flush=False)

    def _rewrite(self, name: str) -> None:
        """The sub-run's file made again from all its records (tensorboard_view.events), then evald's
        older files removed; afterwards records are appended to the new file while they move forward."""
        self._stale.add(name)  # until it succeeds: a failed rewrite is tried again before any append
        records = self.ledger.records(view.streams_of(name, [name]))
        written = view.events(records)
        old = self._logs.pop(name, None)
        if old is not None:
            old.close()
        new = EventLog(self.run_dir / name, written)
        for path in (self.run_dir / name).glob("events.out.tfevents.*" + EVALD_SUFFIX):
            if path != new.path:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
        _fsync_dir(self.run_dir / name)
        self._logs[name] = new
        self._order[name] = view.Order(written)
        self._stale.discard(name)
        log.debug("TensorBoard %s rewritten in step order: %d event(s) from %d record(s)", name, len(written),
                  len(records))

    def _full(self, exc: OSError) -> None:
        """Every file cut back to its whole records; rewritten from the ledger once there is room."""
        for name, event_log in self._logs.items():
            event_log.abandon()
            self._stale.add(name)
        self._logs.clear()
        self._failed_at = time.monotonic()
        if self._failed_at - self._reminded >= REMIND_S:
            self._reminded = self._failed_at
            log.warning("TensorBoard events in %s cannot be written (%s); the records wait in the ledger and are "
                        "written when there is room (retried every %.0fs)", self.run_dir, exc, RETRY_S)

    def close(self) -> None:
        for event_log in self._logs.values():
            event_log.close()


def _move(order: view.Order, record: Record) -> bool:
    """Whether ``record`` can be appended after what ``order`` has seen (and note it if so)."""
    if not order.appendable(record):
        return False
    order.note(record)
    return True


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
