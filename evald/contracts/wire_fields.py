"""The bounds of the wire protocol and the checks that enforce them, used by ``wire.decode``.

Every value a peer sends is checked here once, against an explicit bound, so
that nothing downstream (ledger, TensorBoard, stop decision, file names) can be
handed a 10**30 step, an infinite time, a path with a NUL, or a structure deep
enough to exhaust the stack. The numbers are documented in docs/wire-protocol.md
("Bounds"). This module imports no zmq and no mindspore.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Mapping, NoReturn

MAX_INT = 2**63 - 1  # steps, seq and counters are int64 everywhere (ledger, TensorBoard, all-reduce)
MIN_INT = -(2**63)  # any other integer (scalars, free-form objects) must still fit int64
MAX_DEPTH = 16  # JSON nesting of a whole frame; fixed-shape messages need 4, the rest is for kwargs/summary
MAX_INT_DIGITS = 40  # longer integer literals are not even converted (cost grows with length)

MAX_RUN_ID_BYTES = 256
MAX_TASK_BYTES = 64
MAX_PATH_BYTES = 4096  # PATH_MAX: ckpt_dir, search_path
MAX_NAME_BYTES = 255  # NAME_MAX: a checkpoint's entry name in ckpt_dir
MAX_ENDPOINT_BYTES = 1024
MAX_TARGET_BYTES = 512  # "module:function"
MAX_TEXT_BYTES = 4096  # free text: reasons, strings inside objects
MAX_KEY_BYTES = 256  # object keys, scalar names
MAX_ITEMS = 256  # entries of one list or object inside kwargs, lr_advice, summary
MAX_RECORDS = 1024  # records in one train_metrics message (the hook sends 10)
MAX_SCALARS = 128  # scalars in one record

NONFINITE_NAMES = ("nan", "inf", "-inf")

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # C0, DEL, C1 (\x9b is a terminal CSI)
# A JSON string with its escapes. Possessive, and an unterminated string runs to the end of the frame:
# every attempt that starts at a quote matches, so stripping strings stays linear whatever the frame.
_JSON_STRING = re.compile(rb'"[^"\\]*+(?:\\.[^"\\]*+)*+(?:"|\\?\Z)', re.DOTALL)
_BRACKETS_TO_PARENS = bytes.maketrans(b"[{]}", b"(())")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_NOT_QUOTES_BRACKETS = bytes(b for b in range(256) if b not in b'[]{}"\\')


class ProtocolError(ValueError):
    """A received frame is not a valid message of this protocol version.

    ``reason`` is a short stable category for counters ("oversize", "not_json",
    "too_deep", "checkpoint_committed.step", ...); the text says the detail.
    """

    def __init__(self, text: str, reason: str = "invalid") -> None:
        super().__init__(text)
        self.reason = reason


class HugeInt:
    """Stands for an integer literal too long to convert; every check rejects it."""

    def __init__(self, digits: int) -> None:
        self.digits = digits

    def __repr__(self) -> str:
        return f"<integer literal of {self.digits} digits>"


def fail(where: str, why: str) -> NoReturn:
    """Raise the ProtocolError for field ``where`` ("type.field[...]"); its reason drops the indices."""
    match = re.match(r"[a-z_]+(?:\.[a-z_]+)?", where)
    raise ProtocolError(f"{where}: {why}", match.group(0) if match else "invalid")


def preview(value: Any, limit: int = 60) -> str:
    """An ASCII-only, bounded rendering of a hostile value, safe to put in a log line."""
    text = ascii(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _parse_int(literal: str) -> int | HugeInt:
    return int(literal) if len(literal) <= MAX_INT_DIGITS else HugeInt(len(literal.lstrip("-")))


_DECODER = json.JSONDecoder(parse_int=_parse_int)  # shared, like json.loads' own default decoder


def parse_frame(frame: bytes) -> Any:
    """UTF-8 JSON to Python, refusing deep nesting before the recursive parser sees it."""
    try:
        text = frame.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProtocolError(f"frame is not UTF-8 ({exc.reason} at byte {exc.start}); "
                            f"first bytes {frame[:40]!r}", "not_json") from exc
    check_nesting(frame)
    try:
        return _DECODER.decode(text)
    except RecursionError as exc:  # unreachable after check_nesting; kept so it can never escape
        raise ProtocolError("frame nests JSON too deeply to parse", "too_deep") from exc
    except ValueError as exc:  # JSONDecodeError is a ValueError
        raise ProtocolError(f"frame is not JSON ({exc}); first bytes {frame[:40]!r}", "not_json") from exc


def check_nesting(frame: bytes) -> None:
    """Refuse JSON nested deeper than MAX_DEPTH, in time linear in the frame (C-speed passes)."""
    if frame.count(b"[") + frame.count(b"{") <= MAX_DEPTH:
        return  # cannot be deeper than its number of openers
    # Common case at C speed: keep only quotes and brackets; with no escapes, dropping '""' (a string
    # without brackets) keeps the quote parity of every bracket, so if no quote is left, none was in a string.
    parens = frame.translate(_BRACKETS_TO_PARENS, _NOT_QUOTES_BRACKETS)
    if b"\\" not in parens:
        parens = parens.replace(b'""', b"")
    if b'"' in parens or b"\\" in parens:  # escapes, or brackets inside strings: strip strings exactly
        parens = _JSON_STRING.sub(b"", frame).translate(_BRACKETS_TO_PARENS, _NOT_BRACKETS)
    for _ in range(MAX_DEPTH):  # each pass removes the innermost level of every group
        shorter = parens.replace(b"()", b"")
        if len(shorter) == len(parens):
            break
        parens = shorter
    if not parens:
        return
    # What is left is either a pair around MAX_DEPTH removed levels, or unmatched brackets ")))(((".
    if b"()" in parens or len(parens) - len(parens.rstrip(b"(")) > MAX_DEPTH:
        raise ProtocolError(f"frame nests JSON more than {MAX_DEPTH} levels deep (the limit)", "too_deep")
    raise ProtocolError(f"frame is not JSON: its brackets do not balance; first bytes {frame[:40]!r}",
                        "not_json")


def uint(value: Any, where: str) -> int:
    """A step, seq or count: a JSON integer (not a bool, not a float) in 0..2**63-1."""
    if isinstance(value, HugeInt):
        fail(where, f"an integer of {value.digits} digits is outside 0..2**63-1")
    if isinstance(value, bool) or not isinstance(value, int):
        fail(where, f"must be an integer in 0..2**63-1, got {preview(value)}")
    if not 0 <= value <= MAX_INT:
        fail(where, f"{preview(value)} is outside 0..2**63-1")
    return value


def finite(value: Any, where: str) -> float:
    """A time or measurement: a finite JSON number (not a bool, not NaN/Infinity)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        fail(where, f"must be a finite number, got {preview(value)}")
    if isinstance(value, int) and not MIN_INT <= value <= MAX_INT:
        fail(where, f"{preview(value)} is outside the 64-bit integer range")
    if not math.isfinite(value):
        fail(where, f"must be a finite number, got {preview(value)}")
    return float(value)


def text(value: Any, where: str, max_bytes: int = MAX_TEXT_BYTES, *, empty: bool = True,
         name: bool = False) -> str:
    """A string of at most ``max_bytes`` UTF-8 bytes, no NUL, no lone surrogate;
    ``name``: no control characters either (it ends up in paths, tags and log lines)."""
    if not isinstance(value, str):
        fail(where, f"must be a string, got {preview(value)}")
    if len(value) > max_bytes:
        fail(where, f"{len(value)} characters exceed the limit of {max_bytes} bytes")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        fail(where, f"contains a lone surrogate, which is not valid UTF-8: {preview(value)}")
    if size > max_bytes:
        fail(where, f"{size} bytes of UTF-8 exceed the limit of {max_bytes}")
    if not value and not empty:
        fail(where, "must not be empty")
    if "\x00" in value:
        fail(where, f"contains a NUL character: {preview(value)}")
    if name and _CONTROL.search(value):
        fail(where, f"contains a control character: {preview(value)}")
    return value


def entry_name(value: Any, where: str) -> str:
    """A plain entry name inside ckpt_dir: no '/', not '.' or '..', at most 255 bytes."""
    text(value, where, MAX_NAME_BYTES, empty=False, name=True)
    if "/" in value or value in (".", ".."):
        fail(where, f"{preview(value)} must be a plain entry name inside ckpt_dir (no '/', not '.' or '..')")
    return value


def json_value(value: Any, where: str, depth: int = 0) -> Any:
    """Free-form JSON (factory kwargs, lr_advice, summary): int64 integers, finite floats,
    bounded strings and containers. Returned unchanged."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return text(value, where)
    if isinstance(value, HugeInt):
        fail(where, f"an integer of {value.digits} digits is outside the 64-bit range")
    if isinstance(value, (int, float)):
        finite(value, where)
        return value
    if depth >= MAX_DEPTH:
        fail(where, f"nests deeper than {MAX_DEPTH} levels")
    if isinstance(value, (list, tuple)):
        if len(value) > MAX_ITEMS:
            fail(where, f"{len(value)} items exceed the limit of {MAX_ITEMS}")
        for index, item in enumerate(value):
            json_value(item, f"{where}[{index}]", depth + 1)
        return value
    if isinstance(value, Mapping):
        return json_object(value, where, depth)
    fail(where, f"{type(value).__name__} is not a JSON value")


def json_object(value: Any, where: str, depth: int = 0) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        fail(where, f"must be an object, got {preview(value)}")
    if len(value) > MAX_ITEMS:
        fail(where, f"{len(value)} keys exceed the limit of {MAX_ITEMS}")
    for key, item in value.items():
        text(key, f"{where} key", MAX_KEY_BYTES)
        json_value(item, f"{where}[{preview(key, 30)}]", depth + 1)
    return value


def records(value: Any, where: str) -> tuple[dict[str, Any], ...]:
    """train_metrics.records: [{step, wall_time, scalars: {name: number | "nan" | "inf" | "-inf"}}].

    Returns new dicts holding exactly those three keys, so consumers see no surprises. The
    common case is checked inline (this runs for every batch of training scalars); anything
    unusual goes through the general checks, which raise with the field's path."""
    if not isinstance(value, list):
        fail(where, f"must be a list of records, got {preview(value)}")
    if len(value) > MAX_RECORDS:
        fail(where, f"{len(value)} records exceed the limit of {MAX_RECORDS}")
    names_checked: set[str] = set()  # the same few names repeat in every record
    out = []
    for index, record in enumerate(value):
        if not isinstance(record, dict):
            fail(f"{where}[{index}]", f"must be an object, got {preview(record)}")
        for key in ("step", "wall_time", "scalars"):
            if key not in record:
                fail(f"{where}[{index}]", f"missing {key!r}")
        step, wall_time, scalars = record["step"], record["wall_time"], record["scalars"]
        if type(step) is not int or not 0 <= step <= MAX_INT:
            uint(step, f"{where}[{index}].step")
        if type(wall_time) is not float or wall_time - wall_time != 0.0:  # x - x is nan for inf and nan
            wall_time = finite(wall_time, f"{where}[{index}].wall_time")
        if not isinstance(scalars, dict):
            fail(f"{where}[{index}].scalars", f"must be an object, got {preview(scalars)}")
        if len(scalars) > MAX_SCALARS:
            fail(f"{where}[{index}].scalars", f"{len(scalars)} scalars exceed the limit of {MAX_SCALARS}")
        for name, scalar in scalars.items():
            if name not in names_checked:
                text(name, f"{where}[{index}].scalars key", MAX_KEY_BYTES, empty=False, name=True)
                names_checked.add(name)
            kind = type(scalar)
            if kind is float:
                valid = scalar - scalar == 0.0
            elif kind is int:
                valid = MIN_INT <= scalar <= MAX_INT
            else:
                valid = kind is str and scalar in NONFINITE_NAMES
            if not valid:
                at = f"{where}[{index}].scalars[{preview(name, 30)}]"
                finite(scalar, at)
                fail(at, f"must be a finite number or one of {NONFINITE_NAMES}, got {preview(scalar)}")
        out.append({"step": step, "wall_time": wall_time, "scalars": scalars})
    return tuple(out)


def lr_advice(value: Any, where: str) -> Mapping[str, Any] | None:
    """A bounded object; the keys the trainer acts on are typed: id/step counts, scale > 0."""
    if value is None:
        return None
    json_object(value, where)
    for key in ("id", "step"):
        if key in value:
            uint(value[key], f"{where}.{key}")
    if "scale" in value and finite(value["scale"], f"{where}.scale") <= 0:
        fail(f"{where}.scale", f"must be positive, got {preview(value['scale'])}")
    if "kind" in value:
        text(value["kind"], f"{where}.kind", MAX_TASK_BYTES, name=True)
    return value


def advisory_stop(value: Any, where: str) -> Mapping[str, Any] | None:
    """What an advisory early stop would have done: ``{stop_at_step, step, reason}``, typed."""
    if value is None:
        return None
    json_object(value, where)
    for key in ("stop_at_step", "step"):
        if key not in value:
            fail(where, f"missing {key!r}")
        uint(value[key], f"{where}.{key}")
    text(value.get("reason", ""), f"{where}.reason")
    return value
