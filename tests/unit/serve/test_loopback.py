"""Loopback without a token, beyond it with one (issue 35, still open from the third round): the rule is
decided on the address evald actually binds, by the standard ``ipaddress`` module, not by comparing the host
with three strings. Any spelling of a loopback address may go without a token; an address beyond loopback,
``::`` and a name that resolves beyond loopback need one."""

from __future__ import annotations

import ipaddress
import json
import queue
import socket

import pytest

from evald.cli.main import parse_config
from evald.config import ConfigError
from tests.networks import NoNetworkYet
from evald.daemon.serving import Serving

LOOPBACK = ["127.0.0.1:0", "127.0.0.2:0", "127.1:0", "2130706433:0", "localhost:0", "[::1]:0",
            "[0:0:0:0:0:0:0:1]:0", "[::ffff:7f00:1]:0"]
BEYOND = ["0.0.0.0:8000", "[::]:8000", "[fe80::1]:8000", "10.1.2.3:8000", "[::ffff:a01:203]:8000",
          "[0:0:0:0:0:0:0:0]:8000"]


def _loopback(address: str) -> bool:
    parsed = ipaddress.ip_address(address.split("%")[0])
    return (getattr(parsed, "ipv4_mapped", None) or parsed).is_loopback


@pytest.mark.parametrize("listen", LOOPBACK)
def test_any_spelling_of_a_loopback_address_listens_there_without_a_token(listen):
    try:
        config = parse_config(["--serve", listen], {}).config
    except ConfigError as exc:
        pytest.fail(f"{listen} refused: {exc}")
    serving = Serving(config, NoNetworkYet(), queue.Queue())
    try:
        bound = serving.http.sock.getsockname()[0]
        assert _loopback(bound), (listen, bound)
    finally:
        serving.http.sock.close()


@pytest.mark.parametrize("listen", BEYOND)
def test_an_address_beyond_loopback_needs_a_token(listen):
    with pytest.raises(ConfigError, match="beyond loopback: set serve.token_file"):
        parse_config(["--serve", listen], {})


def test_a_name_that_resolves_beyond_loopback_needs_a_token(monkeypatch):
    """/etc/hosts may say what it likes of ``localhost`` (or any name): the address it resolves to decides.
    The resolver is told here that localhost is 0.0.0.0 (every interface)."""
    real = socket.getaddrinfo

    def resolver(host, *args, **kwargs):
        if host == "localhost":
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("0.0.0.0", args[0] if args else 0))]
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", resolver)
    config = parse_config(["--serve", "localhost:0"], {}).config   # a name: decided when it is bound
    from evald.serve.http_thread import ServeError

    with pytest.raises(ServeError, match="would listen on 0.0.0.0, beyond loopback: set serve.token_file"):
        Serving(config, NoNetworkYet(), queue.Queue())


def test_a_name_beyond_loopback_with_a_token_is_bound_where_it_resolves(monkeypatch, tmp_path):
    import os

    token = tmp_path / "token"
    token.write_text("a-token-long-enough-1234\n")
    os.chmod(token, 0o600)
    real = socket.getaddrinfo
    monkeypatch.setattr(socket, "getaddrinfo", lambda host, *a, **k: real("127.0.0.3" if host == "evald-host"
                                                                          else host, *a, **k))
    config = parse_config(["--serve", json.dumps({"listen": "evald-host:0", "token_file": str(token)})], {}).config
    serving = Serving(config, NoNetworkYet(), queue.Queue())
    try:
        assert serving.http.sock.getsockname()[0] == "127.0.0.3"
    finally:
        serving.http.sock.close()
