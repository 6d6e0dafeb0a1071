"""evald's two sockets: the notification receiver (PULL) and the control publisher (PUB).

Each endpoint is locked first (evald.daemon.locks), so a second evald on the same endpoint is
refused with the pid of the first instead of silently sharing its messages. Both sockets
get the same security: CURVE with an allow-list of trainer keys, or NULL on a local
socket (plaintext TCP only when the operator allows it; docs/authentication.md).
"""

from __future__ import annotations

import logging
import os
import queue
from dataclasses import dataclass
from typing import Any

from evald.config import EvaldConfig
from evald.contracts.auth import SecurityConfig
from evald.contracts.wire import default_control_endpoint, default_endpoint, default_socket_dir
from evald.daemon.locks import Lock, endpoint_lock_path

log = logging.getLogger("evald")


@dataclass
class Channels:
    receiver: Any
    control: Any
    locks: list[Lock]


def notification_endpoint(config: EvaldConfig) -> str:
    return config.endpoint or default_endpoint()


def security_of(config: EvaldConfig) -> SecurityConfig:
    """Both sockets' security, from the operator's options."""
    allowed = tuple(p for p in (config.allowed_keys or "").split(os.pathsep) if p)
    return SecurityConfig(server_key=config.server_key, allowed_keys=allowed, allow_plaintext=config.allow_plaintext)


def bind(config: EvaldConfig, events: "queue.Queue[tuple[str, Any]]") -> Channels:
    """Lock both endpoints, bind the receiver (started) and the control publisher."""
    from evald.sinks.control import ControlPublisher
    from evald.intake.receiver import Receiver

    endpoint = notification_endpoint(config)
    control_endpoint = config.control_endpoint or default_control_endpoint()
    locks = []
    for where, flag in ((endpoint, "--endpoint"), (control_endpoint, "--control-endpoint")):
        locks.append(Lock(endpoint_lock_path(where, default_socket_dir()), f"endpoint {where}",
                          f"give this one another {flag} (or EVALD_SOCKET_DIR)"))
    security = security_of(config)
    receiver = Receiver(endpoint, events, security=security)
    receiver.start()
    control = ControlPublisher(control_endpoint, security=security)
    log.info("listening for notifications on %s; control state on %s", endpoint, control_endpoint)
    return Channels(receiver, control, locks)
