"""The wire protocol: versioned JSON messages between the trainer hook and evald.

Documented for humans in docs/wire-protocol.md. Two channels:

* **notifications**, trainer -> evald: evald binds a PULL socket, trainer
  ranks connect PUSH and send with NOBLOCK. Messages: ``run_announced``,
  ``checkpoint_committed``, ``train_metrics``, ``run_finished``. A lost
  notification costs latency only: the checkpoint directory is the truth.
* **control**, evald -> trainer: evald binds PUB and re-publishes one sticky
  ``control_state`` message periodically; ranks connect SUB (CONFLATE) and poll.

Every message is one ZeroMQ frame of UTF-8 JSON with ``"v"`` (protocol version)
and ``"type"``. ``decode`` validates every field it returns against the bounds in
``wire_fields`` (docs/wire-protocol.md, "Bounds"); for any other bytes it raises
ProtocolError, and nothing else, with a message naming the message type, the
field and what was wrong. This module imports no zmq and no mindspore.
"""

from __future__ import annotations

import json
import math
import os
import socket
import stat
import time
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, ClassVar, Mapping

from evald.contracts import retention
from evald.contracts import wire_fields as F
from evald.contracts.wire_fields import ProtocolError

PROTOCOL_VERSION = 1
MAX_MESSAGE_BYTES = 1 << 20

ENV_ENDPOINT = "EVALD_ENDPOINT"
ENV_CONTROL_ENDPOINT = "EVALD_CONTROL_ENDPOINT"


def default_socket_dir() -> Path:
    """A per-user 0700 directory for ipc sockets (local-only by construction)."""
    return Path(os.environ.get("EVALD_SOCKET_DIR", f"/tmp/evald-{os.getuid()}"))


MAX_IPC_PATH_BYTES = 107  # sizeof(sockaddr_un.sun_path) - 1 on Linux: a longer ipc path cannot be bound


class SocketDirError(PermissionError):
    """A socket directory or endpoint path evald must not use; the message names it and what to do."""


def ensure_private_dir(directory: Path, what: str = "socket directory") -> None:
    """Create ``directory`` 0700 if needed; SocketDirError unless it is a directory of this uid that
    nobody else can write, reached through no link another user owns."""
    directory = Path(directory)
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        link = os.lstat(directory)
        st = os.stat(directory)
    except FileExistsError:
        raise SocketDirError(f"{what} {directory} is not a directory (a file is in the way); remove it or set "
                             f"EVALD_SOCKET_DIR to a directory") from None
    except OSError as exc:
        raise SocketDirError(f"{what} {directory} cannot be used ({exc.strerror or exc}); set EVALD_SOCKET_DIR "
                             f"to a private directory") from None
    if stat.S_ISLNK(link.st_mode) and link.st_uid not in (os.getuid(), 0):  # its owner can re-point it any time
        raise SocketDirError(f"{what} {directory} is a symbolic link owned by uid {link.st_uid}, not by uid "
                             f"{os.getuid()}; remove it or set EVALD_SOCKET_DIR")
    if not stat.S_ISDIR(st.st_mode):
        raise SocketDirError(f"{what} {directory} is not a directory; remove it or set EVALD_SOCKET_DIR to a "
                             f"directory")
    if st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise SocketDirError(f"{what} {directory} is not private to uid {os.getuid()} (owner uid {st.st_uid}, "
                             f"mode {oct(st.st_mode & 0o777)}); remove it or set EVALD_SOCKET_DIR")


def ensure_socket_dir(endpoint: str) -> None:
    """Create the private directory of an ipc endpoint; refuse one others can write or link, and a
    path too long for a unix socket address."""
    if not endpoint.startswith("ipc://"):
        return
    path = endpoint[len("ipc://"):]
    if len(os.fsencode(path)) > MAX_IPC_PATH_BYTES:
        raise SocketDirError(f"ipc endpoint {endpoint}: its path is {len(os.fsencode(path))} bytes, over the "
                             f"{MAX_IPC_PATH_BYTES}-byte limit of a unix socket address; use a shorter "
                             f"EVALD_SOCKET_DIR or endpoint")
    ensure_private_dir(Path(path).parent)


def ensure_bindable(endpoint: str) -> None:
    """Before evald binds ``endpoint``: its directory is private, and nothing is at its path but a
    stale socket (ZeroMQ's ipc bind unlinks whatever is there, another program's listening socket too)."""
    ensure_socket_dir(endpoint)
    if not endpoint.startswith("ipc://"):
        return
    path = endpoint[len("ipc://"):]
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(info.st_mode):
        raise SocketDirError(f"ipc endpoint {endpoint}: {path} exists and is not a socket; remove it or choose "
                             f"another endpoint")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(path)
    except OSError:
        return  # nobody listens: a socket file left by a process that died (evald's own after a kill)
    finally:
        probe.close()
    raise SocketDirError(f"ipc endpoint {endpoint}: another program is listening on {path}; evald leaves it "
                         f"alone: stop it, or choose another endpoint (--endpoint, --control-endpoint or "
                         f"EVALD_SOCKET_DIR)")


def default_endpoint() -> str:
    """Notifications endpoint: $EVALD_ENDPOINT, else an ipc socket in the user's socket dir."""
    return os.environ.get(ENV_ENDPOINT) or f"ipc://{default_socket_dir()}/notify.sock"


def default_control_endpoint() -> str:
    """Control endpoint: $EVALD_CONTROL_ENDPOINT, else an ipc socket beside the notify one."""
    return os.environ.get(ENV_CONTROL_ENDPOINT) or f"ipc://{default_socket_dir()}/control.sock"


@dataclass(frozen=True)
class FactorySpec:
    """A ``module:function`` to call with ``kwargs``; ``search_path`` is prepended to sys.path."""

    target: str
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    search_path: str | None = None

    @classmethod
    def from_obj(cls, obj: Any, what: str) -> "FactorySpec | None":
        """Validate a factory from JSON or user code: a "module:function" string or an object."""
        if obj is None:
            return None
        if isinstance(obj, str):
            obj = {"target": obj}
        if not isinstance(obj, Mapping) or "target" not in obj:
            F.fail(what, f"expected {{'target': 'module:function', ...}}, got {F.preview(obj)}")
        target = F.text(obj["target"], f"{what}.target", F.MAX_TARGET_BYTES, empty=False, name=True)
        if ":" not in target:
            F.fail(f"{what}.target", f"{F.preview(target)} is not 'module:function'")
        kwargs = obj.get("kwargs")
        kwargs = {} if kwargs is None else F.json_object(kwargs, f"{what}.kwargs")
        search_path = obj.get("search_path")
        if search_path is not None:
            F.text(search_path, f"{what}.search_path", F.MAX_PATH_BYTES, empty=False, name=True)
        return cls(target, dict(kwargs), search_path)


@dataclass(frozen=True)
class Message:
    TYPE: ClassVar[str] = ""
    run_id: str
    sent_at: float = field(default_factory=time.time, kw_only=True)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["v"] = PROTOCOL_VERSION
        data["type"] = self.TYPE
        return data

    def encode(self) -> bytes:
        return json.dumps(self.to_dict(), separators=(",", ":"), allow_nan=False).encode()


@dataclass(frozen=True)
class RunAnnounced(Message):
    TYPE: ClassVar[str] = "run_announced"
    ckpt_dir: str
    task: str = "lm"
    model_factory: FactorySpec | None = None
    data_factory: FactorySpec | None = None
    total_steps: int | None = None
    every_n_steps: int | None = None
    world_size: int = 1
    control_endpoint: str | None = None


@dataclass(frozen=True)
class CheckpointCommitted(Message):
    TYPE: ClassVar[str] = "checkpoint_committed"
    ckpt_dir: str
    step: int
    path: str  # directory name relative to ckpt_dir, never absolute
    commit_time: float


@dataclass(frozen=True)
class TrainMetrics(Message):
    """A batch of per-step training-health scalars: [{"step": int, "wall_time": float, "scalars": {...}}]."""

    TYPE: ClassVar[str] = "train_metrics"
    records: tuple[Mapping[str, Any], ...]


@dataclass(frozen=True)
class RunFinished(Message):
    TYPE: ClassVar[str] = "run_finished"
    ckpt_dir: str
    final_step: int
    reason: str = "completed"


@dataclass(frozen=True)
class ControlState(Message):
    """evald's sticky decision. ``stop_at_step`` None means keep training.

    Retention (docs/wire-protocol.md, "Leases"): ``leases`` are steps evald still needs,
    ``released`` steps it has finished with whose ``step_N`` directory is still there (the
    best excepted); the trainer may delete only released steps, so a step evald has not
    heard of yet is kept. Both lists are bounded (oldest first): an unlisted step is kept.
    ``lease_s``: how long after hearing this the trainer may rely on it.
    """

    TYPE: ClassVar[str] = "control_state"
    seq: int
    stop_at_step: int | None = None
    reason: str = ""
    lr_advice: Mapping[str, Any] | None = None
    summary: Mapping[str, Any] | None = None
    advisory_stop: Mapping[str, Any] | None = None  # advisory mode: {stop_at_step, step, reason}, not obeyed
    leases: tuple[int, ...] = ()
    released: tuple[int, ...] = ()
    best_step: int | None = None
    lease_s: float | None = None


MESSAGE_TYPES: dict[str, type[Message]] = {
    cls.TYPE: cls for cls in (RunAnnounced, CheckpointCommitted, TrainMetrics, RunFinished, ControlState)
}

def _text(max_bytes: int, **kwargs: bool) -> Callable[[Any, str], str]:
    return lambda value, where: F.text(value, where, max_bytes, **kwargs)


# One rule per field name, whatever the message type; a field that may be null has default None.
_FIELD_RULES: dict[str, Callable[[Any, str], Any]] = {
    "run_id": _text(F.MAX_RUN_ID_BYTES, empty=False, name=True),
    "ckpt_dir": _text(F.MAX_PATH_BYTES, empty=False, name=True),
    "path": F.entry_name,
    "task": _text(F.MAX_TASK_BYTES, empty=False, name=True),
    "reason": _text(F.MAX_TEXT_BYTES),
    "control_endpoint": _text(F.MAX_ENDPOINT_BYTES, empty=False, name=True),
    **dict.fromkeys(("step", "final_step", "seq", "world_size", "total_steps", "every_n_steps",
                     "stop_at_step", "best_step"), F.uint),
    "sent_at": F.finite,
    "commit_time": F.finite,
    "model_factory": FactorySpec.from_obj,
    "data_factory": FactorySpec.from_obj,
    "records": F.records,
    "lr_advice": F.lr_advice,
    "summary": F.json_object,
    "advisory_stop": F.advisory_stop,
    "leases": retention.step_list,
    "released": retention.step_list,
    "lease_s": retention.duration,
}


_NONFINITE = {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf")}


def encode_scalar(value: float) -> float | str:
    """JSON has no nan/inf, but a non-finite loss is exactly what evald must hear about."""
    if math.isfinite(value):
        return value
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


def decode_scalar(value: Any) -> float | None:
    """Inverse of encode_scalar; None for anything that is not a scalar."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str) and value in _NONFINITE:
        return _NONFINITE[value]
    return None


def decode(frame: bytes) -> Message:
    """Parse and validate one frame; for any input, the only exception is ProtocolError."""
    if not isinstance(frame, (bytes, bytearray, memoryview)):
        raise ProtocolError(f"a frame must be bytes, got {type(frame).__name__}", "not_bytes")
    size = frame.nbytes if isinstance(frame, memoryview) else len(frame)
    if size > MAX_MESSAGE_BYTES:  # checked before copying: the receiver passes a zmq frame's buffer
        raise ProtocolError(f"frame of {size} bytes exceeds the limit of {MAX_MESSAGE_BYTES}", "oversize")
    frame = bytes(frame)
    data = F.parse_frame(frame)
    if not isinstance(data, dict):
        raise ProtocolError(f"frame is a JSON {type(data).__name__}; a message is a JSON object",
                            "not_object")
    version = data.get("v")
    if type(version) is not int or version != PROTOCOL_VERSION:  # True == 1 and 1.0 == 1 in Python
        raise ProtocolError(f"protocol version {F.preview(version)} is not {PROTOCOL_VERSION}; "
                            f"run matching versions of evald and trainer_hooks", "version")
    kind = data.get("type")
    cls = MESSAGE_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ProtocolError(f"unknown message type {F.preview(kind)}; known: {sorted(MESSAGE_TYPES)}",
                            "unknown_type")
    kwargs: dict[str, Any] = {}
    for f in fields(cls):  # keys the class does not define are ignored (not passed on)
        where = f"{cls.TYPE}.{f.name}"
        if f.name not in data:
            if f.default is MISSING and f.default_factory is MISSING:
                F.fail(where, "missing field")
            continue
        value = data[f.name]
        if value is None and f.default is not None:
            F.fail(where, "must not be null")
        kwargs[f.name] = None if value is None else _FIELD_RULES[f.name](value, where)
    return cls(**kwargs)


def announcement_from_json(text: str) -> RunAnnounced:
    message = decode(text.encode("utf-8", "surrogatepass"))  # a lone surrogate is rejected by decode
    if not isinstance(message, RunAnnounced):
        raise ProtocolError(f"expected run_announced, got {message.TYPE}")
    return message
