"""The wire protocol: versioned JSON messages between the trainer hook and evald.

Documented for humans in docs/wire-protocol.md. Two channels:

* **notifications**, trainer -> evald: evald binds a PULL socket, trainer
  ranks connect PUSH and send with NOBLOCK. Messages: ``run_announced``,
  ``checkpoint_committed``, ``train_metrics``, ``run_finished``. A lost
  notification costs latency only: the checkpoint directory is the truth.
* **control**, evald -> trainer: evald binds PUB and re-publishes one sticky
  ``control_state`` message periodically; ranks connect SUB (CONFLATE) and poll.

Every message is one ZeroMQ frame of UTF-8 JSON with ``"v"`` (protocol version)
and ``"type"``. ``decode`` validates everything it returns; anything else raises
ProtocolError with a message that says what was wrong. This module imports no
zmq and no mindspore.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar, Mapping

PROTOCOL_VERSION = 1
MAX_MESSAGE_BYTES = 1 << 20

ENV_ENDPOINT = "EVALD_ENDPOINT"
ENV_CONTROL_ENDPOINT = "EVALD_CONTROL_ENDPOINT"


class ProtocolError(ValueError):
    """A received frame is not a valid message of this protocol version."""


def default_socket_dir() -> Path:
    """A per-user 0700 directory for ipc sockets (local-only by construction)."""
    return Path(os.environ.get("EVALD_SOCKET_DIR", f"/tmp/evald-{os.getuid()}"))


def ensure_socket_dir(endpoint: str) -> None:
    """Create the private directory of an ipc endpoint; refuse one others can write."""
    if not endpoint.startswith("ipc://"):
        return
    directory = Path(endpoint[len("ipc://"):]).parent
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = directory.stat()
    if st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise PermissionError(
            f"socket directory {directory} is not private to uid {os.getuid()} "
            f"(mode {oct(st.st_mode & 0o777)}); remove it or set EVALD_SOCKET_DIR"
        )


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
        if obj is None:
            return None
        if isinstance(obj, str):
            obj = {"target": obj}
        if not isinstance(obj, Mapping) or not isinstance(obj.get("target"), str):
            raise ProtocolError(f"{what}: expected {{'target': 'module:function', ...}}, got {obj!r}")
        if ":" not in obj["target"]:
            raise ProtocolError(f"{what}: target {obj['target']!r} is not 'module:function'")
        kwargs = obj.get("kwargs") or {}
        if not isinstance(kwargs, Mapping):
            raise ProtocolError(f"{what}: kwargs must be an object, got {kwargs!r}")
        return cls(obj["target"], dict(kwargs), obj.get("search_path"))


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
    """evald's sticky decision. ``stop_at_step`` None means keep training."""

    TYPE: ClassVar[str] = "control_state"
    seq: int
    stop_at_step: int | None = None
    reason: str = ""
    lr_advice: Mapping[str, Any] | None = None
    summary: Mapping[str, Any] | None = None


MESSAGE_TYPES: dict[str, type[Message]] = {
    cls.TYPE: cls for cls in (RunAnnounced, CheckpointCommitted, TrainMetrics, RunFinished, ControlState)
}

_INT_FIELDS = {"step", "final_step", "seq", "world_size", "total_steps", "every_n_steps", "stop_at_step"}
_FLOAT_FIELDS = {"sent_at", "commit_time"}
_STR_FIELDS = {"run_id", "ckpt_dir", "path", "reason", "task", "control_endpoint"}


def _check_field(name: str, value: Any, optional: bool, may_be_empty: bool = False) -> Any:
    if value is None:
        if optional:
            return None
        raise ProtocolError(f"field {name!r} must not be null")
    if name in _INT_FIELDS:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ProtocolError(f"field {name!r} must be a non-negative integer, got {value!r}")
    elif name in _FLOAT_FIELDS:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ProtocolError(f"field {name!r} must be a number, got {value!r}")
        value = float(value)
    elif name in _STR_FIELDS:
        if not isinstance(value, str) or (not value and not may_be_empty):
            raise ProtocolError(f"field {name!r} must be a non-empty string, got {value!r}")
    return value


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
    """Parse and validate one frame; ProtocolError says exactly what is wrong."""
    if len(frame) > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"message of {len(frame)} bytes exceeds {MAX_MESSAGE_BYTES}")
    try:
        data = json.loads(frame.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        preview = frame[:40]
        raise ProtocolError(f"not UTF-8 JSON ({exc.__class__.__name__}); first bytes {preview!r}") from exc
    if not isinstance(data, dict):
        raise ProtocolError(f"expected a JSON object, got {type(data).__name__}")
    if data.get("v") != PROTOCOL_VERSION:
        raise ProtocolError(
            f"protocol version {data.get('v')!r} is not {PROTOCOL_VERSION}; "
            f"run matching versions of evald and trainer_hooks"
        )
    cls = MESSAGE_TYPES.get(data.get("type"))  # type: ignore[arg-type]
    if cls is None:
        raise ProtocolError(f"unknown message type {data.get('type')!r}; known: {sorted(MESSAGE_TYPES)}")
    kwargs: dict[str, Any] = {}
    for f in fields(cls):
        if f.name not in data:
            if f.default is MISSING and f.default_factory is MISSING:
                raise ProtocolError(f"{cls.TYPE}: missing field {f.name!r}")
            continue
        value = data[f.name]
        optional = f.default is None
        if f.name in ("model_factory", "data_factory"):
            value = FactorySpec.from_obj(value, f"{cls.TYPE}.{f.name}")
        elif f.name == "records":
            if not isinstance(value, list) or not all(isinstance(r, dict) for r in value):
                raise ProtocolError(f"{cls.TYPE}.records must be a list of objects")
            value = tuple(value)
        elif f.name in ("lr_advice", "summary"):
            if value is not None and not isinstance(value, dict):
                raise ProtocolError(f"{cls.TYPE}.{f.name} must be an object or null")
        else:
            value = _check_field(f.name, value, optional, may_be_empty=f.default == "")
        kwargs[f.name] = value
    if "path" in kwargs:
        rel = kwargs["path"]
        if os.path.isabs(rel) or ".." in Path(rel).parts or "/" in rel.strip("/"):
            raise ProtocolError(f"{cls.TYPE}.path {rel!r} must be a plain directory name inside ckpt_dir")
    return cls(**kwargs)


def announcement_from_json(text: str) -> RunAnnounced:
    message = decode(text.encode())
    if not isinstance(message, RunAnnounced):
        raise ProtocolError(f"expected run_announced, got {message.TYPE}")
    return message
