"""uvicorn in a background thread of evald, with its own event loop; evald starts and stops it.

evald binds the socket itself (a clear error when the address is taken; port 0 picks a free one) and
hands it to ``uvicorn.Server.run(sockets=...)`` in a thread. uvicorn installs signal handlers only in
the main thread, so evald's own handlers (which only set flags) stay in charge; shutdown sets the
server's ``should_exit`` and joins the thread.

Slow clients: uvicorn closes idle keep-alive connections (``timeout_keep_alive``) and answers 503
beyond ``limit_concurrency``; h11 bounds the header size. uvicorn has no deadline for a connection
that never finishes its request headers (slowloris), so ``GuardedH11Protocol`` adds one: a
connection that has not started a request ``header_timeout_s`` after it opened (or after its last
response) is closed. A slow body is cut by the app (evald.serve.app, 408).

Loopback: without a token only a loopback address may listen. The host is resolved here, as the socket
would resolve it (``getaddrinfo``: IPv6 when it holds a colon, else IPv4, the first address, as uvicorn binds),
the address judged by the standard ``ipaddress`` module (``127.0.0.0/8``, ``::1``, IPv4's loopback mapped
into IPv6), and that very address is bound: a name such as ``localhost`` that resolves beyond loopback, or
``::``, is refused without a token, and any spelling of a loopback address is accepted.

May import: config (is_loopback), and serve.app's Starlette app (passed in).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from evald.config.options import is_loopback

log = logging.getLogger("evald.serve")


class ServeError(RuntimeError):
    """The endpoint cannot start (address taken, bad token file); evald refuses to start."""


class GuardedH11Protocol(H11Protocol):
    header_timeout_s = 10.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm()

    def _arm(self) -> None:
        self.loop.call_later(self.header_timeout_s, self._expire, self.cycle)

    def _expire(self, cycle_then: Any) -> None:
        if self.cycle is cycle_then and self.transport is not None and not self.transport.is_closing():
            self.transport.close()  # no new request began in time


def resolve(host: str, port: int) -> tuple[socket.AddressFamily, tuple]:
    """The family and socket address binding ``host`` gives: the first of ``getaddrinfo``'s answers."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        answers = socket.getaddrinfo(host, port, family, socket.SOCK_STREAM, 0, socket.AI_PASSIVE)
    except (OSError, UnicodeError) as exc:
        raise ServeError(f"--serve {host}:{port}: cannot resolve {host!r} ({getattr(exc, 'strerror', None) or exc})"
                         f"; give an address such as 127.0.0.1") from None
    if not answers:
        raise ServeError(f"--serve {host}:{port}: {host!r} resolves to no address")
    found_family, _, _, _, address = answers[0]
    return found_family, address


def bind(host: str, port: int, *, beyond_loopback: bool = False) -> socket.socket:
    """A listening socket on ``host:port``; without ``beyond_loopback`` (no token), a loopback address only."""
    family, address = resolve(host, port)
    if not beyond_loopback and not is_loopback(str(address[0])):
        raise ServeError(f"--serve {host}:{port} would listen on {address[0]}, beyond loopback: set serve.token_file "
                         f"(a 0600 file holding the bearer token clients must send), or listen on 127.0.0.1")
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise ServeError(f"--serve {host}:{port}: cannot listen there ({exc.strerror}); pick another port, or "
                         f"port 0 for a free one") from None
    bound = str(sock.getsockname()[0])
    if not beyond_loopback and not is_loopback(bound):   # what the kernel says it bound, the last word
        sock.close()
        raise ServeError(f"--serve {host}:{port} listens on {bound}, beyond loopback: set serve.token_file")
    sock.listen(2048)
    sock.setblocking(False)
    return sock


class HttpThread:
    def __init__(self, app: Any, host: str, port: int, *, keep_alive_s: int, limit_concurrency: int,
                 header_timeout_s: float, beyond_loopback: bool = False) -> None:
        """``beyond_loopback``: the app requires a token, so any address may listen; else loopback only."""
        self.host = host
        self.sock = bind(host, port, beyond_loopback=beyond_loopback)
        self.port = self.sock.getsockname()[1]
        protocol = type("GuardedH11", (GuardedH11Protocol,), {"header_timeout_s": header_timeout_s})
        config = uvicorn.Config(app, http=protocol, lifespan="off", log_level="warning", access_log=False,
                                timeout_keep_alive=keep_alive_s, limit_concurrency=limit_concurrency,
                                timeout_graceful_shutdown=2, ws="none")
        self.server = uvicorn.Server(config)
        self._error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="evald-serve-http", daemon=True)

    def _run(self) -> None:
        try:
            self.server.run(sockets=[self.sock])
        except BaseException as exc:  # noqa: BLE001 - reported by failure(), the main loop stops evald
            self._error = exc

    def start(self, timeout: float = 30.0) -> None:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise ServeError(f"the HTTP endpoint on {self.url} did not start: {self.failure()}")
            time.sleep(0.01)
        log.info("serving the checkpoint in the network on %s (OpenAI-compatible: /v1/completions, /v1/models)",
                 self.url)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def is_alive(self) -> bool:
        return self.thread.is_alive()

    def failure(self) -> str | None:
        return repr(self._error) if self._error is not None else None

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()
