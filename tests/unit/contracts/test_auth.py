"""CURVE authentication of the evald channels, on real loopback TCP sockets.

Each "host" has its own key directory (evald-host, trainer-host, an intruder, a rogue evald)
and each side its own ZeroMQ context. Every receive is bounded by a poll timeout, every socket
has LINGER 0. "Nothing received" is asserted only after a positive control on the same server
went through and the bad client's own monitor reported its handshake failed (never succeeded).
"""

from __future__ import annotations

import itertools
import logging
import os
import random
import socket as pysocket
import stat
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import zmq
import zmq.auth
from zmq.utils.monitor import recv_monitor_message

from evald.cli import keys as key_bundles
from evald.contracts import auth
from evald.contracts.auth import SecurityConfig, SecurityError

REPO = Path(__file__).resolve().parents[3]
LOOPBACK = "tcp://127.0.0.1:*"
BOUND_S = 10.0  # upper bound for things that must happen; a failing test fails, it does not hang
FAILED = {zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
          zmq.EVENT_HANDSHAKE_FAILED_AUTH}
_monitor_ids = itertools.count()


@dataclass
class Hosts:
    keys: dict
    server: SecurityConfig        # evald with its key and the allow-list
    trainer: SecurityConfig       # the authorised trainer
    intruder: SecurityConfig      # a key pair evald never allowed
    wrong_server: SecurityConfig  # the trainer's own key, but told the wrong evald public key
    no_key: SecurityConfig        # a plaintext client
    rogue_server: SecurityConfig  # another process with its own server key (admits the trainer)


@pytest.fixture
def hosts(tmp_path) -> Hosts:
    keys = key_bundles.create_key_bundles(tmp_path / "keys")
    _, intruder_secret = auth.generate_keypair(tmp_path / "intruder-host", "intruder")
    rogue_public, rogue_secret = auth.generate_keypair(tmp_path / "rogue-host", "rogue")
    return Hosts(
        keys=keys,
        server=SecurityConfig(server_key=str(keys["server_key"]), allowed_keys=(str(keys["allowed_keys"]),)),
        trainer=SecurityConfig(client_key=str(keys["client_key"]),
                               server_public_key=str(keys["server_public_key"])),
        intruder=SecurityConfig(client_key=str(intruder_secret), server_public_key=str(keys["server_public_key"])),
        wrong_server=SecurityConfig(client_key=str(keys["client_key"]), server_public_key=str(rogue_public)),
        no_key=SecurityConfig(allow_plaintext=True),
        rogue_server=SecurityConfig(server_key=str(rogue_secret), allowed_keys=(str(keys["allowed_keys"]),)),
    )


class Client:
    def __init__(self, socket: zmq.Socket, monitor: zmq.Socket) -> None:
        self.socket, self.monitor = socket, monitor
        self.events: list[int] = []

    def _read_events(self, timeout_ms: int) -> None:
        while self.monitor.poll(timeout_ms):
            self.events.append(recv_monitor_message(self.monitor)["event"])
            timeout_ms = 0

    def handshake(self) -> str:
        """'succeeded' or 'failed', as the client's own monitor reports its first handshake."""
        deadline = time.monotonic() + BOUND_S
        while time.monotonic() < deadline:
            self._read_events(100)
            if zmq.EVENT_HANDSHAKE_SUCCEEDED in self.events:
                return "succeeded"
            if FAILED & set(self.events):
                return "failed"
        pytest.fail("no CURVE handshake outcome within the bound")

    def never_succeeded(self) -> bool:
        self._read_events(0)
        return zmq.EVENT_HANDSHAKE_SUCCEEDED not in self.events


class Net:
    """A server context (evald's host) and a client context (the trainers' hosts)."""

    def __init__(self) -> None:
        self.server_ctx, self.client_ctx, self.auths = zmq.Context(), zmq.Context(), []

    def serve(self, kind: int, security: SecurityConfig, ctx: zmq.Context | None = None):
        sock = (ctx or self.server_ctx).socket(kind)
        sock.linger = 0
        server_auth = auth.secure_server(sock, LOOPBACK, security)
        self.auths.append(server_auth)
        sock.bind(LOOPBACK)
        return server_auth, sock.last_endpoint.decode()

    def client(self, kind: int, endpoint: str, security: SecurityConfig) -> Client:
        sock = self.client_ctx.socket(kind)
        sock.linger = 0
        if kind == zmq.SUB:
            sock.subscribe(b"")
        auth.secure_client(sock, endpoint, security)
        address = f"inproc://monitor-{next(_monitor_ids)}"
        sock.monitor(address, zmq.EVENT_ALL)
        monitor = self.client_ctx.socket(zmq.PAIR)
        monitor.linger = 0
        monitor.connect(address)
        sock.connect(endpoint)
        return Client(sock, monitor)

    def close(self) -> None:
        for server_auth in self.auths:
            server_auth.close()
        self.server_ctx.destroy(linger=0)
        self.client_ctx.destroy(linger=0)


@pytest.fixture
def net():
    n = Net()
    yield n
    n.close()


def receive(sock: zmq.Socket, timeout_s: float = BOUND_S):
    return sock.recv(copy=False) if sock.poll(int(timeout_s * 1000)) else None


def drain(sock: zmq.Socket, quiet_ms: int = 300) -> list[bytes]:
    out = []
    while sock.poll(quiet_ms):
        out.append(sock.recv())
    return out


def publish_until_received(pub: zmq.Socket, sub: zmq.Socket, payload: bytes) -> bytes:
    """PUB drops what it sends before the SUB has joined, so keep publishing (as evald does)."""
    deadline = time.monotonic() + BOUND_S
    while time.monotonic() < deadline:
        pub.send(payload)
        if sub.poll(50):
            return sub.recv()
    pytest.fail("the subscriber received nothing within the bound")


# --- key files -----------------------------------------------------------------------------------

def test_generated_keys_are_private_loadable_and_never_overwritten(tmp_path):
    old_umask = os.umask(0)  # even with a permissive umask the secret must come out 0600
    try:
        public, secret = auth.generate_keypair(tmp_path / "k", "evald")
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "k").stat().st_mode) == 0o700
    assert sorted(p.name for p in (tmp_path / "k").iterdir()) == ["evald.key", "evald.key_secret"]
    pub_z85, sec_z85 = zmq.auth.load_certificate(secret)  # pyzmq's own reader understands them
    assert zmq.auth.load_certificate(public) == (pub_z85, None)
    assert auth.load_secret_key(secret) == (pub_z85, sec_z85)
    assert zmq.curve_public(sec_z85) == pub_z85
    before = secret.read_bytes()
    with pytest.raises(FileExistsError, match="refusing to overwrite"):
        auth.generate_keypair(tmp_path / "k", "evald")
    assert secret.read_bytes() == before


def test_loading_refuses_exposed_secret_and_swapped_files(tmp_path):
    public, secret = auth.generate_keypair(tmp_path / "k", "evald")
    os.chmod(secret, 0o640)
    with pytest.raises(SecurityError) as err:
        auth.load_secret_key(secret)
    assert str(secret) in str(err.value) and f"chmod 600 {secret}" in str(err.value)
    os.chmod(secret, 0o600)
    with pytest.raises(SecurityError, match="SECRET key; give the public"):
        auth.load_public_key(secret)
    with pytest.raises(SecurityError, match="only a public key"):
        auth.load_secret_key(public)
    with pytest.raises(SecurityError, match="cannot read secret key file"):
        auth.load_secret_key(tmp_path / "missing.key_secret")
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    os.chmod(shared, 0o755)
    with pytest.raises(SecurityError, match="chmod 700"):
        auth.generate_keypair(shared, "x")
    with pytest.raises(SecurityError, match="no client public keys"):
        auth.load_allowed_keys([str(shared)])  # empty: the refused generate_keypair wrote nothing


def test_keys_command_sorts_keys_per_host_and_explains_distribution(tmp_path, capsys):
    assert key_bundles.keys_command(str(tmp_path / "keys")) == 0
    out = capsys.readouterr().out
    evald_host, trainer_host = tmp_path / "keys" / "evald-host", tmp_path / "keys" / "trainer-host"
    files = sorted(str(p.relative_to(tmp_path / "keys")) for p in (tmp_path / "keys").rglob("*") if p.is_file())
    assert files == ["evald-host/allowed/trainer.key", "evald-host/evald.key_secret", "group.key",
                     "trainer-host/evald.key", "trainer-host/trainer.key_secret"]
    for printed in (evald_host / "evald.key_secret", evald_host / "allowed", trainer_host / "trainer.key_secret",
                    trainer_host / "evald.key", tmp_path / "keys" / "group.key"):
        assert str(printed) in out
    for name in ("--server-key", "--allowed-keys", "client_key=", "server_public_key=", "EVALD_SERVER_KEY",
                 "EVALD_ALLOWED_KEYS", "EVALD_CLIENT_KEY", "EVALD_SERVER_PUBLIC_KEY"):
        assert name in out
    # the halves match: each host holds the other's public key
    assert auth.load_public_key(trainer_host / "evald.key") == auth.load_secret_key(evald_host / "evald.key_secret")[0]
    assert auth.load_allowed_keys([str(evald_host / "allowed")]) == {
        auth.load_secret_key(trainer_host / "trainer.key_secret")[0].decode(): "trainer"}
    assert key_bundles.keys_command(str(tmp_path / "keys")) == 1
    assert "refusing to overwrite" in capsys.readouterr().err


# --- the one validation ----------------------------------------------------------------------------

def test_plaintext_on_tcp_is_refused_unless_allowed_and_then_loud(caplog, hosts):
    with pytest.raises(SecurityError, match="refusing plaintext.*--allow-plaintext"):
        SecurityConfig().mechanism("tcp://10.0.0.5:5555", "server")
    with pytest.raises(SecurityError, match="refusing plaintext.*allow_plaintext=True"):
        SecurityConfig().mechanism("tcp://10.0.0.5:5555", "client")
    with caplog.at_level(logging.WARNING, logger="evald.auth"):
        assert SecurityConfig().mechanism("ipc:///tmp/evald-x/notify.sock", "server") == auth.NULL
        assert not caplog.records
        assert SecurityConfig(allow_plaintext=True).mechanism("tcp://10.0.0.5:5555", "server") == auth.NULL
    assert "PLAINTEXT on tcp://10.0.0.5:5555" in caplog.text and "forge" in caplog.text
    assert hosts.server.mechanism("tcp://10.0.0.5:5555", "server") == auth.CURVE
    assert hosts.trainer.mechanism("tcp://10.0.0.5:5555", "client") == auth.CURVE


def test_half_configured_keys_are_refused(hosts):
    with pytest.raises(SecurityError, match="needs both --server-key and --allowed-keys"):
        SecurityConfig(server_key=hosts.server.server_key).mechanism("tcp://127.0.0.1:1", "server")
    with pytest.raises(SecurityError, match="needs both"):
        SecurityConfig(allowed_keys=hosts.server.allowed_keys, allow_plaintext=True).mechanism("ipc:///x", "server")
    with pytest.raises(SecurityError, match="only server_public_key= was given"):
        SecurityConfig(server_public_key=hosts.trainer.server_public_key).mechanism("tcp://h:1", "client")


@pytest.mark.parametrize("endpoint", ["tcp://*:5555", "tcp://0.0.0.0:5555"])
def test_binding_all_interfaces_warns_loudly(caplog, hosts, endpoint):
    with caplog.at_level(logging.WARNING, logger="evald.auth"):
        hosts.server.mechanism(endpoint, "server")
    assert "ALL network interfaces" in caplog.text and "lo" in caplog.text


def test_config_from_environment_with_explicit_values_winning(hosts):
    env = {auth.ENV_SERVER_KEY: "/e/evald.key_secret", auth.ENV_ALLOWED_KEYS: f"/e/allowed{os.pathsep}/e/x.key",
           auth.ENV_CLIENT_KEY: "/t/trainer.key_secret", auth.ENV_SERVER_PUBLIC_KEY: "/t/evald.key",
           auth.ENV_ALLOW_PLAINTEXT: "1"}
    assert SecurityConfig.from_env(env) == SecurityConfig("/e/evald.key_secret", ("/e/allowed", "/e/x.key"),
                                                          "/t/trainer.key_secret", "/t/evald.key", True)
    explicit = SecurityConfig.from_env(env, allowed_keys=Path("/other"), allow_plaintext=False, client_key=None)
    assert explicit.allowed_keys == ("/other",) and not explicit.allow_plaintext
    assert explicit.client_key == "/t/trainer.key_secret"
    assert SecurityConfig.from_env({}) == SecurityConfig()


def test_module_imports_without_zmq():
    code = "import sys, evald.contracts.auth; assert 'zmq' not in sys.modules, 'zmq imported eagerly'"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=REPO, timeout=60)


# --- real sockets on loopback TCP ------------------------------------------------------------------

def test_authorised_trainer_is_heard_and_identified(net, hosts):
    server_auth, endpoint = net.serve(zmq.PULL, hosts.server)
    trainer = net.client(zmq.PUSH, endpoint, hosts.trainer)
    trainer.socket.send(b'{"hello": 1}')
    frame = receive(server_auth.socket)
    assert frame is not None and frame.bytes == b'{"hello": 1}'
    peer = server_auth.peer(frame)
    trainer_public = auth.load_secret_key(hosts.trainer.client_key)[0].decode()
    assert peer == auth.Peer(authenticated=True, key=trainer_public, name="trainer")


def test_authorised_trainer_receives_control(net, hosts):
    server_auth, endpoint = net.serve(zmq.PUB, hosts.server)
    trainer = net.client(zmq.SUB, endpoint, hosts.trainer)
    assert publish_until_received(server_auth.socket, trainer.socket, b"stop at 7") == b"stop at 7"


BAD_CLIENTS = ["no_key", "wrong_server", "intruder"]


def test_unauthorised_clients_get_no_message_accepted(net, hosts):
    server_auth, endpoint = net.serve(zmq.PULL, hosts.server)
    bad = {name: net.client(zmq.PUSH, endpoint, getattr(hosts, name)) for name in BAD_CLIENTS}
    for name, client in bad.items():
        client.socket.send(f"forged by {name}".encode(), zmq.NOBLOCK)
    for name, client in bad.items():
        assert client.handshake() == "failed", name
    good = net.client(zmq.PUSH, endpoint, hosts.trainer)
    good.socket.send(b"genuine")
    frame = receive(server_auth.socket)
    assert frame is not None and frame.bytes == b"genuine"  # the server works ...
    assert drain(server_auth.socket) == []                   # ... and heard nobody else
    assert all(client.never_succeeded() for client in bad.values())
    assert server_auth.zap.refused >= 1  # the intruder was turned away by the allow-list


def test_unauthorised_subscribers_receive_no_control(net, hosts):
    server_auth, endpoint = net.serve(zmq.PUB, hosts.server)
    bad = {name: net.client(zmq.SUB, endpoint, getattr(hosts, name)) for name in BAD_CLIENTS}
    for name, client in bad.items():
        assert client.handshake() == "failed", name
    good = net.client(zmq.SUB, endpoint, hosts.trainer)
    assert publish_until_received(server_auth.socket, good.socket, b"stop at 9") == b"stop at 9"
    for _ in range(5):
        server_auth.socket.send(b"stop at 9")
    assert len(drain(good.socket)) == 5
    for name, client in bad.items():
        assert receive(client.socket, timeout_s=0.2) is None, name
        assert client.never_succeeded(), name


def test_a_rogue_publisher_is_never_heard(net, hosts):
    rogue_auth, rogue_endpoint = net.serve(zmq.PUB, hosts.rogue_server)
    believer = net.client(zmq.SUB, rogue_endpoint, hosts.wrong_server)  # trusts the rogue's key
    trainer = net.client(zmq.SUB, rogue_endpoint, hosts.trainer)        # trusts the real evald only
    # positive control: the rogue publishes and would be heard by whoever trusts its key
    assert publish_until_received(rogue_auth.socket, believer.socket, b"stop at 0") == b"stop at 0"
    assert trainer.handshake() == "failed"
    for _ in range(5):
        rogue_auth.socket.send(b"stop at 0")
    assert receive(trainer.socket, timeout_s=0.3) is None and trainer.never_succeeded()
    # a plaintext publisher is not heard either
    plain_auth, plain_endpoint = net.serve(zmq.PUB, SecurityConfig(allow_plaintext=True))
    trainer_to_plain = net.client(zmq.SUB, plain_endpoint, hosts.trainer)
    assert trainer_to_plain.handshake() == "failed"
    for _ in range(5):
        plain_auth.socket.send(b"stop at 0")
    assert receive(trainer_to_plain.socket, timeout_s=0.3) is None and trainer_to_plain.never_succeeded()


def test_plaintext_tcp_refused_by_default_works_when_allowed(net, hosts):
    sock = net.server_ctx.socket(zmq.PULL)
    sock.linger = 0
    with pytest.raises(SecurityError, match="refusing plaintext"):
        auth.secure_server(sock, LOOPBACK, SecurityConfig())
    assert sock.last_endpoint == b""  # refused before anything was bound
    sock.close()
    push = net.client_ctx.socket(zmq.PUSH)
    push.linger = 0
    with pytest.raises(SecurityError, match="refusing plaintext"):
        auth.secure_client(push, "tcp://127.0.0.1:5555", SecurityConfig())
    push.close()
    server_auth, endpoint = net.serve(zmq.PULL, SecurityConfig(allow_plaintext=True))
    client = net.client(zmq.PUSH, endpoint, SecurityConfig(allow_plaintext=True))
    client.socket.send(b"plain")
    frame = receive(server_auth.socket)
    assert frame is not None and frame.bytes == b"plain"
    assert server_auth.peer(frame) == auth.Peer(authenticated=False)


@pytest.mark.parametrize("server", ["plaintext", "curve"])
def test_raw_bytes_are_not_messages(net, hosts, server):
    security = hosts.server if server == "curve" else SecurityConfig(allow_plaintext=True)
    client_security = hosts.trainer if server == "curve" else SecurityConfig(allow_plaintext=True)
    server_auth, endpoint = net.serve(zmq.PULL, security)
    host, port = endpoint[len("tcp://"):].rsplit(":", 1)
    rng = random.Random(0)
    for _ in range(10):  # a first byte other than 0xFF is what libzmq would read as ZMTP 1.0
        garbage = bytes([rng.randrange(1, 255)]) + rng.randbytes(4095)
        with pysocket.create_connection((host, int(port)), timeout=BOUND_S) as raw:
            raw.sendall(garbage)
    client = net.client(zmq.PUSH, endpoint, client_security)
    client.socket.send(b"genuine")
    received = []
    while not received or received[-1] != b"genuine":
        frame = receive(server_auth.socket)
        assert frame is not None, f"genuine message never arrived; got {received!r}"
        received.append(frame.bytes)
    assert received + drain(server_auth.socket) == [b"genuine"]


def test_two_sockets_share_one_zap_handler_until_the_last_closes(net, hosts):
    pull_auth, _ = net.serve(zmq.PULL, hosts.server)
    pub_auth, endpoint = net.serve(zmq.PUB, hosts.server)  # same context: one ZAP handler
    assert pull_auth.zap is pub_auth.zap
    net.auths.remove(pull_auth)
    pull_auth.close()  # the PUB must still be guarded: a CURVE server without ZAP admits any key
    intruder = net.client(zmq.SUB, endpoint, hosts.intruder)
    assert intruder.handshake() == "failed"
    trainer = net.client(zmq.SUB, endpoint, hosts.trainer)
    assert publish_until_received(pub_auth.socket, trainer.socket, b"x") == b"x"
    assert receive(intruder.socket, timeout_s=0.2) is None and intruder.never_succeeded()


def test_security_must_be_configured_before_bind_or_connect(net, hosts):
    sock = net.server_ctx.socket(zmq.PULL)
    sock.linger = 0
    sock.bind(LOOPBACK)
    with pytest.raises(SecurityError, match="before bind"):
        auth.secure_server(sock, LOOPBACK, hosts.server)
    sock.close()
