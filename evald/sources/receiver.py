"""The notification socket: a ZeroMQ PULL that evald binds, read on its own thread.

Every frame is validated with the wire contract; garbage is logged, counted
and dropped, never crashes evald. ZAP is enabled (a ThreadAuthenticator with
no restrictions) even on the NULL mechanism, because libzmq then refuses the
unversioned ZMTP 1.0 handshake through which raw bytes otherwise become
"messages"; MAXMSGSIZE bounds what one peer can make evald allocate.
"""

from __future__ import annotations

import logging
import queue
import threading

from evald.contracts.wire import MAX_MESSAGE_BYTES, ProtocolError, decode, ensure_socket_dir

log = logging.getLogger("evald.receiver")

ZMQ, BAD_MESSAGE = "zmq", "bad_message"


class Receiver:
    def __init__(self, endpoint: str, out: "queue.Queue[tuple[str, object]]") -> None:
        import zmq
        from zmq.auth.thread import ThreadAuthenticator

        self.endpoint = endpoint
        self.received = 0
        self.rejected = 0
        self._out = out
        self._stop = threading.Event()
        ensure_socket_dir(endpoint)
        self._context = zmq.Context()
        self._auth = ThreadAuthenticator(self._context)
        self._auth.start()
        self._socket = self._context.socket(zmq.PULL)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        self._socket.setsockopt(zmq.RCVHWM, 10000)
        self._socket.zap_domain = b"evald"
        try:
            self._socket.bind(endpoint)
        except zmq.ZMQError as exc:
            self.close()
            raise OSError(f"cannot bind notifications endpoint {endpoint}: {exc}; is another evald "
                          f"using it? Pick another with --endpoint / EVALD_ENDPOINT") from exc
        self._thread = threading.Thread(target=self._run, name="evald-receiver", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        import zmq

        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        while not self._stop.is_set():
            try:
                if not dict(poller.poll(200)):
                    continue
                frame = self._socket.recv(zmq.NOBLOCK)
            except zmq.ZMQError:
                if self._stop.is_set():
                    return
                log.exception("notification socket error; continuing")
                continue
            try:
                message = decode(frame)
            except ProtocolError as exc:
                self.rejected += 1
                log.warning("rejected a notification on %s: %s", self.endpoint, exc)
                self._out.put((BAD_MESSAGE, str(exc)))
                continue
            self.received += 1
            self._out.put((ZMQ, message))

    def close(self) -> None:
        self._stop.set()
        if getattr(self, "_thread", None) is not None and self._thread.is_alive():
            self._thread.join(timeout=2)
        self._socket.close(linger=0) if hasattr(self, "_socket") else None
        self._auth.stop()
        self._context.term()
