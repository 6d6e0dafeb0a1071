"""Who may talk on the evald channels: CURVE keys, a ZAP allow-list, plaintext rules; and the eval
group's shared secret (``group.key``), which authenticates its ranks' collective traffic.

evald is the CURVE server of both its sockets and admits only allow-listed client keys;
a trainer is a CURVE client that talks only to the evald key it was given. Without keys,
``ipc://`` stays NULL (behind ZAP, which refuses raw ZMTP 1.0 bytes) and a network endpoint
is refused unless plaintext is allowed. zmq is imported lazily. See docs/authentication.md.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket as _socket_mod
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

log = logging.getLogger("evald.auth")

ENV_SERVER_KEY = "EVALD_SERVER_KEY"                # evald: its secret key file
ENV_ALLOWED_KEYS = "EVALD_ALLOWED_KEYS"            # evald: trainers' public keys (dirs/files, os.pathsep)
ENV_CLIENT_KEY = "EVALD_CLIENT_KEY"                # trainer: its secret key file
ENV_SERVER_PUBLIC_KEY = "EVALD_SERVER_PUBLIC_KEY"  # trainer: evald's public key file
ENV_ALLOW_PLAINTEXT = "EVALD_ALLOW_PLAINTEXT"      # both: "1" allows NULL on a network endpoint
OPT_SERVER_KEY, OPT_ALLOWED_KEYS, OPT_ALLOW_PLAINTEXT = "--server-key", "--allowed-keys", "--allow-plaintext"
HOOK_SERVER_PUBLIC_KEY, HOOK_CLIENT_KEY = "server_public_key", "client_key"  # EvaldHook(...) arguments
HOOK_ALLOW_PLAINTEXT = "allow_plaintext"
_NAMES = {"server": (OPT_SERVER_KEY, OPT_ALLOWED_KEYS, OPT_ALLOW_PLAINTEXT),
          "client": (HOOK_CLIENT_KEY + "=", HOOK_SERVER_PUBLIC_KEY + "=", HOOK_ALLOW_PLAINTEXT + "=True")}
ZAP_DOMAIN = "evald"
PUBLIC_SUFFIX, SECRET_SUFFIX = ".key", ".key_secret"  # the czmq/pyzmq certificate names
CURVE, NULL = "curve", "null"
_LOCAL_TRANSPORTS, _ALL_INTERFACES = ("ipc://", "inproc://"), ("*", "0.0.0.0", "[::]", "::")


GROUP_KEY_FILE = "group.key"
GROUP_KEY_BYTES = 32


class SecurityError(ValueError):
    """Keys or endpoints that would make the channel less safe than the user asked for."""


def write_group_key(path: str | os.PathLike) -> Path:
    """A new eval group secret (32 random bytes, hex) at ``path``, mode 0600, never over an existing file."""
    import secrets

    path = Path(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        os.fchmod(fd, 0o600)  # the umask may have taken bits; never more than 0600
        os.write(fd, (secrets.token_hex(GROUP_KEY_BYTES) + "\n").encode("ascii"))
        os.fsync(fd)
    finally:
        os.close(fd)
    return path


def load_group_key(path: str | os.PathLike) -> bytes:
    """The eval group's secret from ``path`` (evald.contracts.secret_file: a regular file of evald's user
    that nobody else may read or write), at least 32 bytes as hex. SecurityError naming the file and the fix."""
    from evald.contracts.secret_file import SecretFileError, read_secret

    try:
        text = read_secret(path, "group.key_file", min_chars=2 * GROUP_KEY_BYTES, owner_only=True)
    except FileNotFoundError:
        raise SecurityError(f"group.key_file {path} does not exist; make one with `evald keys DIR` "
                            f"(DIR/{GROUP_KEY_FILE}) and copy it to every host of the group") from None
    except SecretFileError as exc:
        raise SecurityError(str(exc)) from None
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise SecurityError(f"group.key_file {path} does not hold hex digits; make one with `evald keys DIR` "
                            f"(DIR/{GROUP_KEY_FILE})") from None


def generate_keypair(directory: str | os.PathLike, name: str) -> tuple[Path, Path]:
    """Write ``name.key`` (public) and ``name.key_secret`` (0600) in ``directory`` (made 0700)."""
    import zmq.auth
    directory = Path(directory)
    public, secret = directory / f"{name}{PUBLIC_SUFFIX}", directory / f"{name}{SECRET_SUFFIX}"
    for path in (public, secret):
        if os.path.lexists(path):
            raise FileExistsError(f"{path} already exists; refusing to overwrite a key")
    _private_dir(directory)
    # pyzmq obeys the umask (0644): write privately, chmod, link (never readable, never replaces)
    tmp = tempfile.mkdtemp(dir=directory, prefix=".keygen-")
    try:
        tmp_public, tmp_secret = zmq.auth.create_certificates(tmp, name)
        os.chmod(tmp_secret, 0o600)
        os.link(tmp_secret, secret)
        os.link(tmp_public, public)
    except BaseException:
        secret.unlink(missing_ok=True)
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return public, secret


def _private_dir(directory: Path) -> None:
    if not directory.exists():
        directory.mkdir(parents=True, mode=0o700)
        os.chmod(directory, 0o700)  # mkdir's mode is filtered by the umask
    mode = directory.stat().st_mode & 0o777
    if mode & 0o077:
        raise SecurityError(f"key directory {directory} is open to other users (mode {oct(mode)}); "
                            f"run: chmod 700 {directory}, or use a new directory")


def load_secret_key(path: str | os.PathLike) -> tuple[bytes, bytes]:
    """(public, secret) z85 keys from a ``.key_secret`` file that only its owner can access."""
    mode, public, secret = _read_certificate(Path(path), "secret key")
    if not secret:
        raise SecurityError(f"{path} holds only a public key; give the {SECRET_SUFFIX} file here")
    if mode & 0o077:
        raise SecurityError(f"secret key file {path} is accessible to group/others (mode {oct(mode)}); "
                            f"run: chmod 600 {path}  (and replace the keys if others may have read it)")
    return public, secret


def load_public_key(path: str | os.PathLike) -> bytes:
    """The z85 public key of a ``.key`` file; a secret key file is refused (it must not travel)."""
    _, public, secret = _read_certificate(Path(path), "public key")
    if secret:
        raise SecurityError(f"{path} contains a SECRET key; give the public {PUBLIC_SUFFIX} file here. "
                            "A secret key file stays on the host it belongs to")
    return public


def load_allowed_keys(paths: tuple[str, ...] | list[str]) -> dict[str, str]:
    """{z85 public key: name} from directories (their ``*.key`` files) and single ``.key`` files."""
    allowed: dict[str, str] = {}
    for entry in map(Path, paths):
        for file in sorted(entry.glob(f"*{PUBLIC_SUFFIX}")) if entry.is_dir() else [entry]:
            allowed[load_public_key(file).decode("ascii")] = file.name.removesuffix(PUBLIC_SUFFIX)
    if not allowed:
        raise SecurityError(f"no client public keys (*{PUBLIC_SUFFIX}) in {', '.join(map(str, paths))}; "
                            f"copy each trainer's {PUBLIC_SUFFIX} file there")
    return allowed


def _read_certificate(path: Path, what: str) -> tuple[int, bytes, bytes | None]:
    import zmq.auth
    try:
        mode = path.stat().st_mode & 0o777
        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise SecurityError(f"cannot read {what} file {path}: {exc}") from exc
    if any(key is not None and len(key) != 40 for key in (public, secret)):
        raise SecurityError(f"{path} holds a malformed key (a z85 CURVE key has 40 characters)")
    return mode, public, secret


@dataclass(frozen=True)
class SecurityConfig:
    server_key: str | None = None          # evald: its .key_secret
    allowed_keys: tuple[str, ...] = ()     # evald: directories and/or .key files of trainers
    client_key: str | None = None          # trainer: its .key_secret
    server_public_key: str | None = None   # trainer: evald's .key
    allow_plaintext: bool = False

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **explicit: Any) -> "SecurityConfig":
        """Explicit (non-None) arguments win over the EVALD_* environment variables."""
        env = os.environ if environ is None else environ
        values = {"server_key": env.get(ENV_SERVER_KEY), "client_key": env.get(ENV_CLIENT_KEY),
                  "allowed_keys": env.get(ENV_ALLOWED_KEYS, "").split(os.pathsep),
                  "server_public_key": env.get(ENV_SERVER_PUBLIC_KEY),
                  "allow_plaintext": env.get(ENV_ALLOW_PLAINTEXT, "").lower() in ("1", "true", "yes")}
        values.update({k: v for k, v in explicit.items() if v is not None})
        allowed = [a] if isinstance(a := values.pop("allowed_keys"), (str, os.PathLike)) else a
        values = {k: (str(v) if v else None) if "key" in k else v for k, v in values.items()}
        return cls(allowed_keys=tuple(str(p) for p in allowed if p), **values)

    def mechanism(self, endpoint: str, role: str) -> str:
        """CURVE or NULL for ``endpoint`` as "server" (binds) or "client"; refuses unsafe setups."""
        keys = {"server": (self.server_key, self.allowed_keys),
                "client": (self.client_key, self.server_public_key)}[role]
        names = _NAMES[role]
        if any(keys) and not all(keys):
            raise SecurityError(f"CURVE on {endpoint} needs both {names[0]} and {names[1]}; only "
                                f"{names[0] if keys[0] else names[1]} was given")
        mechanism = CURVE if all(keys) else NULL
        host = endpoint.split("://", 1)[-1].rsplit(":", 1)[0]
        if role == "server" and endpoint.startswith("tcp://") and host in _ALL_INTERFACES:
            log.warning("!!! %s binds ALL network interfaces (%s): anyone who can route to this host "
                        "can reach it%s. Bind a private address (tcp://10.x.y.z:PORT) instead.",
                        endpoint, ", ".join(n for _, n in _socket_mod.if_nameindex()),
                        "; only allow-listed CURVE keys get in" if mechanism == CURVE else "")
        if mechanism == NULL and not endpoint.startswith(_LOCAL_TRANSPORTS):
            if not self.allow_plaintext:
                raise SecurityError(f"refusing plaintext on network endpoint {endpoint}: anyone who reaches "
                                    f"it could inject notifications or forge stop signals. Give keys "
                                    f"({names[0]} and {names[1]}; `evald keys DIR`, docs/authentication.md) "
                                    f"or, on a network you fully trust, {names[2]} / {ENV_ALLOW_PLAINTEXT}=1")
            log.warning("!!! PLAINTEXT on %s (%s): neither encrypted nor authenticated. Anyone who "
                        "reaches it can read it, send fake checkpoints and forge or suppress stop "
                        "signals. Use CURVE keys: docs/authentication.md", endpoint, names[2])
        return mechanism


@dataclass(frozen=True)
class Peer:
    """Who sent a message: a CURVE client on the allow-list, or an unauthenticated peer."""
    authenticated: bool
    key: str | None = None       # the client's z85 public key (ZAP User-Id)
    name: str | None = None      # its allow-list file name without .key, e.g. "trainer"


class _AllowList:
    """The ZAP credentials provider, one per ZeroMQ context (ZAP handlers are per context)."""
    def __init__(self, authenticator: Any) -> None:
        self.authenticator, self.keys, self.users, self.refused, self._logged = authenticator, {}, 0, 0, set()

    def callback(self, domain: str, key: bytes) -> bool:
        if key.decode("ascii") in self.keys:
            return True
        self.refused += 1
        if key not in self._logged:  # a refused client retries: one line per key, not a flood
            self._logged.add(key)
            log.warning("refused a CURVE client with key %s: not on the allow-list (%s); if it is "
                        "your trainer, put its .key file there and restart evald",
                        key.decode("ascii"), OPT_ALLOWED_KEYS)
        return False


_zap_lock = threading.Lock()
_zap_handlers: dict[int, _AllowList] = {}


class ServerAuth:
    """The security of one bound evald socket; ``close()`` it instead of closing the socket."""
    def __init__(self, socket: Any, mechanism: str, zap: _AllowList) -> None:
        # zap.refused counts CURVE handshakes the allow-list turned away (whole context)
        self.socket, self.mechanism, self.zap = socket, mechanism, zap

    def peer(self, frame: Any) -> Peer:
        """The sender of ``frame`` (a zmq.Frame: receive with ``copy=False``)."""
        import zmq
        try:
            user = frame.get("User-Id")
        except zmq.ZMQError:  # no ZAP handler ran for this connection
            user = None
        if self.mechanism == CURVE and user in self.zap.keys:
            return Peer(True, user, self.zap.keys[user])
        return Peer(False)

    def close(self) -> None:
        """Close the socket, then stop the ZAP handler once no socket of its context needs it."""
        self.socket.close(linger=0)
        with _zap_lock:
            self.zap.users -= 1
            if self.zap.users == 0:
                _zap_handlers.pop(id(self.socket.context), None)
                self.zap.authenticator.stop()


def _start(authenticator: Any) -> None:
    """Start a ZAP handler; the context's previous one may still be unbinding (libzmq closes lazily)."""
    import zmq
    for attempt in range(200):
        try:
            return authenticator.start()
        except zmq.ZMQError as exc:
            authenticator.zap_socket.close(linger=0)
            if exc.errno != zmq.EADDRINUSE or attempt == 199:
                raise
            time.sleep(0.01)


def secure_server(socket: Any, endpoint: str, security: SecurityConfig) -> ServerAuth:
    """Before ``bind``: CURVE server admitting allow-listed keys, or NULL+ZAP on a local endpoint."""
    from zmq.auth.thread import ThreadAuthenticator
    if socket.last_endpoint:
        raise SecurityError(f"secure_server must run before bind ({socket.last_endpoint!r})")
    mechanism = security.mechanism(endpoint, "server")
    keys: dict[str, str] = {}
    if mechanism == CURVE:
        public, secret = load_secret_key(security.server_key)  # type: ignore[arg-type]
        keys = load_allowed_keys(security.allowed_keys)
        socket.curve_secretkey, socket.curve_publickey, socket.curve_server = secret, public, True
    with _zap_lock:
        zap = _zap_handlers.get(id(socket.context))
        if zap is None:
            authenticator = ThreadAuthenticator(socket.context, log=logging.getLogger("evald.auth.zap"))
            _start(authenticator)  # before bind: a CURVE server with no ZAP handler admits any key
            zap = _zap_handlers[id(socket.context)] = _AllowList(authenticator)
            authenticator.configure_curve_callback(ZAP_DOMAIN, zap)
        if keys and zap.keys and keys != zap.keys:
            raise SecurityError("two evald sockets in one ZeroMQ context need the same allow-list")
        zap.keys = keys or zap.keys
        zap.users += 1
    # The domain turns ZAP on for NULL too: libzmq then refuses unversioned ZMTP 1.0 peers.
    socket.zap_domain = ZAP_DOMAIN.encode()
    return ServerAuth(socket, mechanism, zap)


def secure_client(socket: Any, endpoint: str, security: SecurityConfig) -> str:
    """Before ``connect``: a CURVE client that talks only to the given evald key; the mechanism."""
    if socket.last_endpoint:
        raise SecurityError(f"secure_client must run before connect ({socket.last_endpoint!r})")
    mechanism = security.mechanism(endpoint, "client")
    if mechanism == CURVE:
        public, secret = load_secret_key(security.client_key)  # type: ignore[arg-type]
        server = load_public_key(security.server_public_key)  # type: ignore[arg-type]
        socket.curve_publickey, socket.curve_secretkey, socket.curve_serverkey = public, secret, server
    return mechanism
