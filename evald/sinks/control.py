"""The control channel: evald's sticky decision, published on a ZeroMQ PUB socket.

PUB drops what it sends before a subscriber has joined, so the current state is
re-published every ``republish_s``: a rank that starts or restarts late still
gets it within one period. Subscribers keep only the newest (CONFLATE).
The socket is a CURVE server when keys are given (only allow-listed trainers
receive the state, and a trainer accepts it only from evald's key); see
evald.contracts.auth.

``ControlSink`` is the run's sink (evald.sinks.sink) on a publisher the server owns: the decisions'
state with the retention leases (evald.sinks.leases), published at once when a decision, the best step,
the final step or a step's state changes, with fresh leases every leases.REFRESH_S otherwise.
"""

from __future__ import annotations

import logging
import time

from evald.contracts.auth import SecurityConfig, secure_server
from evald.contracts.wire import ControlState, ensure_bindable
from evald.sinks.leases import Leases
from evald.sinks.sink import RunState

log = logging.getLogger("evald.control")


class ControlPublisher:
    def __init__(self, endpoint: str, republish_s: float = 1.0, security: SecurityConfig | None = None) -> None:
        import zmq

        self.endpoint = endpoint
        self.republish_s = republish_s
        self._zmq = zmq
        ensure_bindable(endpoint)
        self._socket: zmq.Socket = zmq.Context.instance().socket(zmq.PUB)
        self._socket.setsockopt(zmq.LINGER, 0)
        try:
            self._auth = secure_server(self._socket, endpoint, security or SecurityConfig())
        except Exception:
            self._socket.close(linger=0)
            raise
        try:
            self._socket.bind(endpoint)
        except zmq.ZMQError as exc:
            self._auth.close()
            raise OSError(f"cannot bind control endpoint {endpoint}: {exc}; pick another with "
                          f"--control-endpoint / EVALD_CONTROL_ENDPOINT") from exc
        self.state: ControlState | None = None
        self._last_sent = 0.0

    def update(self, state: ControlState) -> None:
        self.state = state
        self._send()

    def tick(self) -> None:
        if self.state is not None and time.monotonic() - self._last_sent >= self.republish_s:
            self._send()

    def _send(self) -> None:
        try:
            self._socket.send(self.state.encode(), self._zmq.NOBLOCK)  # type: ignore[union-attr]
        except self._zmq.Again:
            pass
        self._last_sent = time.monotonic()

    def close(self) -> None:
        self._auth.close()  # the socket first, then its ZAP handler


class ControlSink:
    """The control state of one run, published on the server's ControlPublisher (which outlives the run)."""

    name = "control channel"

    def __init__(self, publisher: ControlPublisher, leases: Leases) -> None:
        self.publisher, self.leases = publisher, leases
        self._published_for: tuple | None = None

    def tick(self, state: RunState) -> None:
        decisions = state.decisions
        # what the state names, except the leases: a change publishes now (the leases with it); the leases
        # alone are refreshed every REFRESH_S, since finding a checkpoint commits too often to publish each
        news = (state.run_id, decisions.seq, decisions.best_step, state.final_step, state.lag_policy,
                tuple(sorted(state.ledger.counts().items())))
        if news != self._published_for or self.leases.due():
            self._published_for = news
            self.leases.longest_load_s = state.longest_load_s
            control = self.leases.control_state(decisions.control_state(), run_id=state.run_id, seq=decisions.seq,
                                                lag_policy=state.lag_policy, final_step=state.final_step,
                                                best_step=decisions.best_step)
            if control is not None:
                self.publisher.update(control)
        self.publisher.tick()

    def close(self) -> None:
        pass   # the publisher is the server's: a restarted run publishes on it again
