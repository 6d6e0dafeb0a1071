"""Fire-and-forget delivery of wire messages from a training process to evald.

The training thread only appends to a bounded in-memory queue (a deque append
under a lock). One daemon thread owns the ZeroMQ PUSH socket and sends with
NOBLOCK: when evald is absent, slow or dead, messages wait in ZeroMQ's
connect-side queue up to ``send_hwm`` and beyond that are dropped and counted.
Nothing here can block or raise into the training loop; the checkpoint
directory, not this channel, is what guarantees evald sees every checkpoint.
With CURVE keys (``security``) the socket talks only to the evald whose public
key it holds; a key problem disables notifications with a logged error.
"""

from __future__ import annotations

import collections
import logging
import threading

from evald.contracts.auth import SecurityConfig, secure_client
from evald.contracts.wire import Message, ensure_socket_dir

log = logging.getLogger("trainer_hooks.notifier")


class Notifier:
    def __init__(self, endpoint: str, *, queue_size: int = 1000, send_hwm: int = 1000,
                 security: SecurityConfig | None = None) -> None:
        self.endpoint = endpoint
        self.security = security or SecurityConfig()
        self.mechanism: str | None = None  # "curve" or "null" once connected; None while not (or never)
        self.sent = 0
        self.dropped = 0
        self._queue: collections.deque[bytes] = collections.deque()
        self._queue_size = queue_size
        self._send_hwm = send_hwm
        self._lock = threading.Lock()
        self._wakeup = threading.Event()
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="evald-notifier", daemon=True)
        self._thread.start()

    def send(self, message: Message) -> None:
        """Queue ``message`` for delivery; never blocks, never raises."""
        try:
            frame = message.encode()
        except Exception:  # a bug in a caller's message must not reach training
            log.exception("could not encode %s; dropped", type(message).__name__)
            self.dropped += 1
            return
        with self._lock:
            if len(self._queue) >= self._queue_size:
                self._queue.popleft()
                self.dropped += 1
            self._queue.append(frame)
        self._wakeup.set()

    def close(self, drain_timeout_s: float = 1.0) -> None:
        """Give queued messages up to ``drain_timeout_s`` to reach ZeroMQ, then stop."""
        self._closing = True
        self._wakeup.set()
        self._thread.join(timeout=drain_timeout_s + 1.0)

    def _run(self) -> None:
        try:
            import zmq

            ensure_socket_dir(self.endpoint)
            context = zmq.Context.instance()
            socket = context.socket(zmq.PUSH)
            socket.setsockopt(zmq.LINGER, 0)  # never hang the trainer's exit
            socket.setsockopt(zmq.SNDHWM, self._send_hwm)
            mechanism = secure_client(socket, self.endpoint, self.security)
            socket.connect(self.endpoint)
            self.mechanism = mechanism
        except Exception as exc:
            if "socket" in locals():
                socket.close(linger=0)
            log.error("evald notifications to %s disabled: %s (evald still finds checkpoints by watching "
                      "the directory)", self.endpoint, exc, exc_info=not isinstance(exc, ValueError))
            self._discard_forever()
            return
        try:
            while True:
                self._wakeup.wait(timeout=0.5)
                self._wakeup.clear()
                self._flush(socket, zmq)
                if self._closing:
                    break
        except Exception:
            log.exception("evald notifier stopped after an unexpected error; notifications disabled")
        finally:
            socket.close(linger=200 if self._closing else 0)

    def _flush(self, socket, zmq) -> None:
        while True:
            with self._lock:
                if not self._queue:
                    return
                frame = self._queue[0]
            try:
                socket.send(frame, zmq.NOBLOCK)
            except zmq.Again:
                # ZeroMQ's queue is full (evald absent for long): drop the oldest,
                # keep the newest; the rescan finds checkpoints anyway.
                with self._lock:
                    if self._queue:
                        self._queue.popleft()
                        self.dropped += 1
                continue
            with self._lock:
                if self._queue and self._queue[0] is frame:
                    self._queue.popleft()
            self.sent += 1

    def _discard_forever(self) -> None:
        while not self._closing:
            self._wakeup.wait(timeout=0.5)
            self._wakeup.clear()
            with self._lock:
                self.dropped += len(self._queue)
                self._queue.clear()
