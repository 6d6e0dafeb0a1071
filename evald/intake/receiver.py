"""The notification socket: a ZeroMQ PULL that evald binds, read on its own thread.

No single frame can stop this thread or make evald's main loop fall behind:

* every frame is either handed on or counted as bad, by reason; each reason gets
  at most one WARNING per ``log_interval_s``, carrying the count since the last;
* frames up to ``hard_limit_bytes`` (4x the protocol's 1 MiB) are received and
  counted; above it libzmq (MAXMSGSIZE) drops the connection;
* a socket monitor follows each connection (``Connections``). libzmq reports every
  closed connection alike, so the receiver judges from what came before: a peer that
  completed the handshake and then left is a trainer rank closing its notifier, the
  normal end (INFO); one refused at the handshake was warned then; one that closes
  before any handshake sent bytes that are not ZeroMQ (WARNING); one that comes
  straight back after leaving was dropped, for a frame over the hard limit (WARNING);
* the out queue is never waited on: ``put_nowait``, and when it is full (or,
  for train_metrics and bad-message notices, holding ``LOW_PRIORITY_ROOM`` items
  or 3/4 of its size) the item is dropped and counted by type. Every notice is a
  doorbell; the directory is the truth;
* an unexpected exception is logged and the loop goes on.

The socket is secured by evald.contracts.auth.secure_server: CURVE with an
allow-list when keys are given, else NULL behind ZAP (libzmq then refuses the
unversioned ZMTP 1.0 handshake through which raw bytes otherwise become
"messages"); plaintext on a network endpoint is refused unless allowed.

Each message says whether its sender is trusted: ``(ZMQ, message)`` when it came
over an ipc socket in evald's private (0700) socket directory or from an
allow-listed CURVE client, ``(ZMQ_UNTRUSTED, message)`` otherwise (plaintext TCP).
An untrusted message is a doorbell only; it may not choose what evald serves.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from evald.contracts.auth import CURVE, SecurityConfig, secure_server
from evald.contracts.wire import MAX_MESSAGE_BYTES, ProtocolError, TrainMetrics, decode, ensure_bindable

log = logging.getLogger("evald.receiver")

ZMQ, BAD_MESSAGE = "zmq", "bad_message"
ZMQ_UNTRUSTED = "zmq_untrusted"  # a valid message from a peer that is neither local ipc nor an allowed key
HARD_LIMIT_BYTES = 4 * MAX_MESSAGE_BYTES
RECEIVE_HWM = 1000  # frames libzmq buffers for this socket; with HARD_LIMIT_BYTES, bounds its memory
# train_metrics and bad-message notices are queued only while the queue holds fewer items than this. A
# decoded train_metrics of 10 records is about 7 KB of Python objects, so a flood's backlog stays near
# 7 MB (at 7,500, 3/4 of evald's queue, it was ~50 MB, and the allocator kept that high-water mark). A
# trainer sends a few a second; 1,000 is minutes of scalars behind a busy main loop.
LOW_PRIORITY_ROOM = 1000
_BATCH = 256  # frames read per wake-up, so the monitor and stop flag are checked in between
# A peer connecting again this soon after leaving did not leave: libzmq dropped it (PUSH reconnects
# after 100 ms by itself; a restarted trainer takes seconds to import MindSpore).
RECONNECT_WINDOW_S = 1.0


@dataclass
class Connections:
    """What the monitor said about each connection (by file descriptor), to tell why one closed.

    libzmq's handshake events carry no descriptor; handshakes complete in the order the
    connections were accepted, nearly always, so the oldest connection still handshaking
    is the one an event is about (a wrong guess only changes a log line's wording).
    """

    handshaking: list[int] = field(default_factory=list)
    established: set[int] = field(default_factory=set)
    refused: set[int] = field(default_factory=set)
    last_left_at: float | None = None

    def accepted(self, fd: int) -> None:
        self.handshaking.append(fd)

    def handshake_done(self, ok: bool) -> None:
        if self.handshaking:
            (self.established if ok else self.refused).add(self.handshaking.pop(0))

    def closed(self, fd: int) -> str:
        """Why connection ``fd`` closed: "left", "refused" or "not_zeromq"."""
        if fd in self.established:
            self.established.discard(fd)
            return "left"
        if fd in self.refused:
            self.refused.discard(fd)
            return "refused"
        if fd in self.handshaking:
            self.handshaking.remove(fd)
        return "not_zeromq"


class _Throttle:
    """At most one log line per key per interval; the next one says how many were not logged."""

    def __init__(self, interval_s: float, clock: Callable[[], float]) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._last: dict[str, float] = {}
        self.unreported: collections.Counter[str] = collections.Counter()

    def log(self, level: int, key: str, text: str, *args: object, exc_info: bool = False) -> None:
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last < self.interval_s:
            self.unreported[key] += 1
            return
        unreported = self.unreported.pop(key, 0)
        suffix = f" [{unreported} more since the last report]" if unreported else ""
        log.log(level, text + suffix, *args, exc_info=exc_info)
        self._last[key] = now


class Receiver:
    """Reads notifications into ``out`` as ``(ZMQ or ZMQ_UNTRUSTED, message)`` or ``(BAD_MESSAGE, reason)``."""

    def __init__(self, endpoint: str, out: "queue.Queue[tuple[str, object]]", *,
                 hard_limit_bytes: int = HARD_LIMIT_BYTES, receive_hwm: int = RECEIVE_HWM,
                 doorbell_reserve: int | None = None, low_priority_room: int = LOW_PRIORITY_ROOM,
                 log_interval_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic, security: SecurityConfig | None = None) -> None:
        import zmq

        self.endpoint = endpoint
        self.hard_limit_bytes = hard_limit_bytes
        self.received = 0  # valid messages decoded (queued or dropped)
        self.rejected = 0  # frames that are not valid messages
        self.rejected_by_reason: collections.Counter[str] = collections.Counter()
        self.dropped_by_type: collections.Counter[str] = collections.Counter()  # the out queue was full
        self.peer_events: collections.Counter[str] = collections.Counter()  # accepted/disconnected/refused
        self.errors = 0  # unexpected exceptions survived by the loop
        self._out = out
        # train_metrics and bad-message notices leave this many slots free for the doorbells that matter
        reserve = out.maxsize // 4 if doorbell_reserve is None else doorbell_reserve
        below_reserve = out.maxsize - reserve if out.maxsize > 0 else low_priority_room  # maxsize 0: unbounded
        self._low_priority_room = min(low_priority_room, below_reserve)
        self._throttle = _Throttle(log_interval_s, clock)
        self._clock = clock
        self._connections = Connections()
        self._stop = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._monitor = None
        self._auth = None
        self.authenticated = False
        self.untrusted = 0  # valid messages from peers that are not trusted (plaintext TCP)
        ensure_bindable(endpoint)  # a private directory, and no other program's socket unlinked
        self._local = endpoint.startswith("ipc://")  # ensure_socket_dir made sure only this user can connect
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.PULL)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.MAXMSGSIZE, hard_limit_bytes)  # larger: libzmq disconnects the peer
        self._socket.setsockopt(zmq.RCVHWM, receive_hwm)
        try:
            self._auth = secure_server(self._socket, endpoint, security or SecurityConfig())
        except Exception:
            self.close()
            raise
        # With CURVE and an allow-list, a peer that gets in is authenticated (evald.intake.trust).
        self.authenticated = self._auth.mechanism == CURVE
        try:
            self._socket.bind(endpoint)
        except zmq.ZMQError as exc:
            self.close()
            raise OSError(f"cannot bind notifications endpoint {endpoint}: {exc}; is another evald "
                          f"using it? Pick another with --endpoint / EVALD_ENDPOINT") from exc
        self._monitor = self._socket.get_monitor_socket(
            zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED
            | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
            | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
        self._thread = threading.Thread(target=self._run_recording_death, name="evald-receiver", daemon=True)
        self._failure: str | None = None

    def start(self) -> None:
        assert self._thread is not None
        self._thread.start()

    def is_alive(self) -> bool:
        """Whether the thread still runs (or was closed on purpose): the server checks it every turn."""
        return self._closed or (self._thread is not None and self._thread.is_alive())

    def failure(self) -> str | None:
        """What killed the thread, when something did."""
        return self._failure

    def stats(self) -> dict[str, object]:
        """A snapshot of the counters, for logs and tests."""
        return {"received": self.received, "untrusted": self.untrusted, "rejected": self.rejected, "errors": self.errors,
                "rejected_by_reason": dict(self.rejected_by_reason),
                "dropped_by_type": dict(self.dropped_by_type), "peer_events": dict(self.peer_events)}

    # ------------------------------------------------------------ the thread

    def _run_recording_death(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # the loop survives every Exception; this is what it could not
            self._failure = f"{type(exc).__name__}: {exc}"
            log.critical("the notification receiver on %s died: %s", self.endpoint, self._failure, exc_info=True)

    def _run(self) -> None:
        import zmq

        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        poller.register(self._monitor, zmq.POLLIN)
        while not self._stop.is_set():
            try:
                ready = dict(poller.poll(200))
                if self._monitor in ready:
                    self._read_monitor()
                if self._socket in ready:
                    self._read_frames()
            except Exception:  # noqa: BLE001 - the thread must outlive anything a frame can cause
                if self._stop.is_set():
                    return
                self.errors += 1
                self._throttle.log(logging.ERROR, "error", "unexpected error reading notifications on %s; "
                                   "continuing (%d so far)", self.endpoint, self.errors, exc_info=True)
                self._stop.wait(0.05)  # a persistent fault must not become a busy loop

    def _read_frames(self) -> None:
        import zmq

        for _ in range(_BATCH):
            try:
                frame = self._socket.recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            if frame.more:  # the parts of a multipart message arrive together: read them all, then reject
                parts = 1
                while self._socket.get(zmq.RCVMORE):
                    self._socket.recv(zmq.NOBLOCK, copy=False)
                    parts += 1
                self._reject(ProtocolError(f"a message of {parts} frames; a notification is one frame",
                                           "multipart"))
                continue
            self._handle(frame.buffer, self._local or self._auth.peer(frame).authenticated)

    def _handle(self, frame: memoryview, trusted: bool = True) -> None:
        try:
            message = decode(frame)  # refuses oversize frames before copying them
        except ProtocolError as exc:
            self._reject(exc)
            return
        self.received += 1
        if not trusted:
            self.untrusted += 1
        self._offer(message.TYPE, (ZMQ if trusted else ZMQ_UNTRUSTED, message),
                    low_priority=isinstance(message, TrainMetrics))

    def _reject(self, exc: ProtocolError) -> None:
        self.rejected += 1
        self.rejected_by_reason[exc.reason] += 1
        self._throttle.log(logging.WARNING, f"bad:{exc.reason}", "rejected a notification on %s (%s; %d so far): %s",
                           self.endpoint, exc.reason, self.rejected_by_reason[exc.reason], exc)
        self._offer(BAD_MESSAGE, (BAD_MESSAGE, str(exc)), low_priority=True)

    def _offer(self, kind: str, item: tuple[str, object], low_priority: bool) -> None:
        if low_priority and self._out.qsize() >= self._low_priority_room:
            self._drop(kind)
            return
        try:
            self._out.put_nowait(item)
        except queue.Full:
            self._drop(kind)

    def _drop(self, kind: str) -> None:
        self.dropped_by_type[kind] += 1
        self._throttle.log(logging.WARNING, f"drop:{kind}",
                           "evald's main loop is behind: dropped a %s notice (%d so far; queue at %d of %d). "
                           "Only latency is lost: the directory rescan finds checkpoints", kind,
                           self.dropped_by_type[kind], self._out.qsize(), self._out.maxsize)

    def _read_monitor(self) -> None:
        import zmq
        from zmq.utils.monitor import recv_monitor_message

        while True:
            try:
                message = recv_monitor_message(self._monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            event, value = message["event"], message["value"]
            if event == zmq.EVENT_ACCEPTED:
                self.peer_events["accepted"] += 1
                self._connections.accepted(value)
                self._came_straight_back()
            elif event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._connections.handshake_done(ok=True)
            elif event == zmq.EVENT_DISCONNECTED:
                self.peer_events["disconnected"] += 1
                self._disconnected(self._connections.closed(value))
            else:
                self._connections.handshake_done(ok=False)
                self.peer_events["refused"] += 1
                self._throttle.log(logging.WARNING, "refused",
                                   "refused a peer on %s that failed the ZeroMQ handshake (%d so far)",
                                   self.endpoint, self.peer_events["refused"])

    def _disconnected(self, why: str) -> None:
        if why == "left":  # the normal end of a trainer rank: its notifier closed
            self._connections.last_left_at = self._clock()
            self._throttle.log(logging.INFO, "disconnected", "a trainer disconnected from %s (%d so far), as its "
                               "notifier does when training ends", self.endpoint, self.peer_events["disconnected"])
        elif why == "not_zeromq":
            self.peer_events["not_zeromq"] += 1
            self._throttle.log(logging.WARNING, "not_zeromq", "a peer on %s closed its connection before the "
                               "ZeroMQ handshake: it sent bytes that are not ZeroMQ, or nothing (%d so far)",
                               self.endpoint, self.peer_events["not_zeromq"])
        else:
            log.debug("the connection of the peer refused on %s closed", self.endpoint)

    def _came_straight_back(self) -> None:
        left_at, self._connections.last_left_at = self._connections.last_left_at, None
        if left_at is None or self._clock() - left_at > RECONNECT_WINDOW_S:
            return
        self.peer_events["dropped"] += 1
        self._throttle.log(logging.WARNING, "dropped", "a peer on %s connected again %.2f s after its connection "
                           "closed: libzmq drops a connection that sends a frame over %d bytes (a notification is "
                           "at most %d), so it sent one and the frame was lost (%d so far)", self.endpoint,
                           self._clock() - left_at, self.hard_limit_bytes, MAX_MESSAGE_BYTES,
                           self.peer_events["dropped"])

    # ------------------------------------------------------------ shutdown

    def close(self) -> None:
        """Stop the thread and release the sockets; calling it again does nothing."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(timeout=5)
        for key, count in sorted(self._throttle.unreported.items()):
            log.info("notifications on %s: %d more %s events were not logged individually",
                     self.endpoint, count, key)
        self._throttle.unreported.clear()
        if self._monitor is not None:
            self._socket.disable_monitor()
            self._monitor.close(linger=0)
        if self._auth is not None:
            self._auth.close()  # the socket first, then its ZAP handler
        else:
            self._socket.close(linger=0)
        self._context.term()
