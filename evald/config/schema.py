"""How an option is declared, and the one validator every source goes through.

An option is a dataclass field whose metadata (made by ``opt``) carries its help
text, environment variable, kind and bounds. ``coerce`` turns a raw value from
any source (command line and environment give strings; TOML and the run
announcement give typed values) into the option's value with the same rules, or
raises ConfigError naming the source, the key and what is allowed.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import MISSING, Field, field, fields, is_dataclass
from typing import Any, Callable

from evald.config.values import DEVICE_TARGETS, DeviceSpec, MinDelta
from evald.contracts.wire import MAX_IPC_PATH_BYTES

_FACTORY = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*", re.ASCII)  # fullmatch


# Every number an option takes is bounded: one declared without a bound gets these, named in the error
# (``patience = 2**63`` was accepted). 10**9 evaluations, steps or seconds is beyond any real run.
NUMBER_BOUND = 10**9
FLOAT_BOUND = 1e15


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the source, the key and the fix."""

    def __init__(self, source: str, key: str, problem: str) -> None:
        super().__init__(f"{source} {key}: {problem}" if key else f"{source}: {problem}")
        self.source, self.key, self.problem = source, key, problem


def opt(default: Any, help: str, *, kind: str, env: str | None = None, choices: tuple[str, ...] = (),
        min: float | None = None, max: float | None = None, min_exclusive: bool = False,
        table: type | None = None, factory: Callable[[], Any] | None = None) -> Any:
    """Declare an option. ``kind`` is int, float, str, bool, choice, factory, object, table,
    plugins, device, cpus, endpoint, path, path_list (paths separated by os.pathsep), paths (a list) or name; ``min``/``max`` bound numbers; ``table`` is the dataclass of a table."""
    meta = {"help": help, "kind": kind, "env": env, "choices": choices, "min": min, "max": max,
            "min_exclusive": min_exclusive, "table": table}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def default_of(f: Field) -> Any:
    if f.default is not MISSING:
        return f.default
    return f.default_factory()  # type: ignore[misc]


def flag_of(f: Field) -> str:
    return "--" + f.name.replace("_", "-")


def nullable(f: Field) -> bool:
    return "None" in str(f.type)


def coerce(f: Field, value: Any, source: str, key: str | None = None) -> Any:
    """Validate ``value`` for option ``f`` from ``source``; return the typed value."""
    key = key or f.name
    meta = f.metadata
    kind = meta["kind"]
    spelled_none = isinstance(value, str) and value.strip().lower() in ("", "none") and kind != "endpoint"
    if value is None or (spelled_none and nullable(f)):
        if nullable(f):
            return None
        raise ConfigError(source, key, "must be set (it has no 'none' value)")
    try:
        checker = _KINDS[kind]
    except KeyError:  # a programming error in the option table, not a user error
        raise AssertionError(f"option {f.name}: unknown kind {kind!r}") from None
    return checker(f, value, source, key)


def _number(f: Field, value: Any, source: str, key: str, integer: bool) -> float | int:
    what = "an integer" if integer else "a number"
    if isinstance(value, bool):
        raise ConfigError(source, key, f"expected {what}, got the boolean {value!r}")
    if isinstance(value, str):
        text = value.strip()
        try:
            value = int(text) if integer else float(text)
        except ValueError:
            raise ConfigError(source, key, f"expected {what}, got {text!r}") from None
    if integer and isinstance(value, float) and value.is_integer():
        value = int(value)
    if integer and not isinstance(value, int):
        raise ConfigError(source, key, f"expected {what}, got {value!r}")
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(source, key, f"expected a finite number, got {value!r}")
    low, high = f.metadata["min"], f.metadata["max"]
    default_low, default_high = -NUMBER_BOUND if integer else -FLOAT_BOUND, NUMBER_BOUND if integer else FLOAT_BOUND
    why = ""
    if low is None:
        low, why = default_low, " (evald's bound for any number it takes)"
    if high is None:
        high, why = default_high, " (evald's bound for any number it takes)"
    shown = (lambda x: str(int(x))) if integer else (lambda x: f"{x:g}")
    if value < low or (f.metadata["min_exclusive"] and value == low):
        relation = ">" if f.metadata["min_exclusive"] else ">="
        raise ConfigError(source, key, f"must be {relation} {shown(low)}{why if low == default_low else ''}, "
                                       f"got {value!r}")
    if value > high:
        raise ConfigError(source, key, f"must be <= {shown(high)}{why if high == default_high else ''}, got {value!r}")
    return value if integer else float(value)


def _int(f, value, source, key):
    return _number(f, value, source, key, integer=True)


def _float(f, value, source, key):
    return _number(f, value, source, key, integer=False)


def _str(f, value, source, key):
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(source, key, f"expected a non-empty string, got {value!r}")
    if "\x00" in value or len(value) > 4096:
        raise ConfigError(source, key, "contains a NUL byte or is longer than 4096 characters")
    return value


def _bool(f, value, source, key):
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("1", "true", "yes", "on"):
        return True
    if isinstance(value, str) and value.strip().lower() in ("0", "false", "no", "off"):
        return False
    raise ConfigError(source, key, f"expected true or false, got {value!r}")


def _choice(f, value, source, key):
    allowed = f.metadata["choices"]
    if not isinstance(value, str) or value not in allowed:
        raise ConfigError(source, key, f"{value!r} is not one of: {', '.join(allowed)}")
    return value


def _factory(f, value, source, key):
    if not isinstance(value, str) or not _FACTORY.fullmatch(value):
        raise ConfigError(source, key, f"expected 'package.module:function', got {value!r}")
    return value


def as_object(f, value, source, key):
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ConfigError(source, key, f"not a JSON object ({exc.msg}): {value!r}") from None
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise ConfigError(source, key, f"expected a JSON object / TOML table such as {{\"seq_len\": 64}}, "
                                       f"got {value!r}")
    return dict(value)


def table_object(f: Field, value: Any, source: str, key: str) -> dict:
    """A table's raw keys: a JSON object / TOML table, or (for a table with a ``SHORTHAND`` key, such as
    ``--serve 127.0.0.1:8000``) a plain string that is that key's value."""
    shorthand = getattr(f.metadata["table"], "SHORTHAND", None)
    if shorthand and isinstance(value, str) and not value.lstrip().startswith("{"):
        return {shorthand: value}
    return as_object(f, value, source, key)


def _table(f, value, source, key):
    table_cls = f.metadata["table"]
    if is_dataclass(value) and isinstance(value, table_cls):
        return value
    raw = table_object(f, value, source, key)
    return build_table(table_cls, raw, source, key)


def build_table(table_cls: type, raw: dict, source: str, key: str, base: Any = None) -> Any:
    """A table option: each key validated like an option of its own; unknown keys are errors."""
    known = {sub.name: sub for sub in fields(table_cls)}
    values = {} if base is None else {name: getattr(base, name) for name in known}
    for sub_key, sub_value in raw.items():
        name = sub_key.replace("-", "_")
        if name not in known:
            raise ConfigError(source, f"{key}.{sub_key}", f"unknown key; known keys: {', '.join(sorted(known))}")
        values[name] = coerce(known[name], sub_value, source, f"{key}.{sub_key}")
    try:
        return table_cls(**values)
    except (ValueError, TypeError) as exc:  # cross-key rules inside the table's __post_init__
        raise ConfigError(source, key, str(exc)) from None


def _plugins(f, value, source, key):
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)):
        raise ConfigError(source, key, f"expected a list of metric plug-ins, got {value!r}")
    specs = []
    for i, spec in enumerate(value):
        where = f"{key}[{i}]"
        if isinstance(spec, str):
            spec = {"target": spec}
        if not isinstance(spec, dict) or set(spec) - {"target", "kwargs", "name"}:
            raise ConfigError(source, where, f"expected 'module:Class' or {{target, kwargs, name}}, got {spec!r}")
        if not isinstance(spec.get("target"), str) or not _FACTORY.fullmatch(spec["target"]):
            raise ConfigError(source, where, f"target must be 'package.module:Class', got {spec.get('target')!r}")
        if not isinstance(spec.get("kwargs", {}), dict):
            raise ConfigError(source, where, "kwargs must be a table")
        specs.append(dict(spec))
    return tuple(specs)


def _device(f, value, source, key):
    text = str(value).strip() if isinstance(value, (str, int)) and not isinstance(value, bool) else None
    if text is None:
        raise ConfigError(source, key, f"expected a device id such as 7, GPU:7 or 4,5,6,7, got {value!r}")
    target, _, ids_text = text.rpartition(":")
    target = target or "auto"
    if target not in DEVICE_TARGETS:
        raise ConfigError(source, key, f"backend {target!r} is not one of: {', '.join(DEVICE_TARGETS[1:])}")
    try:
        ids = tuple(int(part) for part in ids_text.split(","))
    except ValueError:
        raise ConfigError(source, key, f"device ids must be integers separated by commas, got {ids_text!r}") from None
    if any(i < 0 or i > 4095 for i in ids) or len(set(ids)) != len(ids):
        raise ConfigError(source, key, f"device ids must be distinct integers in 0..4095, got {ids_text!r}")
    return DeviceSpec(target, ids)


def parse_cpus(text: str) -> set[int]:
    """``"1"``, ``"2-3"`` or ``"0,2-3"`` as a set of core numbers; ValueError when malformed."""
    cores: set[int] = set()
    for part in text.split(","):
        low, dash, high = part.strip().partition("-")
        first, last = int(low), int(high) if dash else int(low)
        if first < 0 or last < first:
            raise ValueError(part)
        cores.update(range(first, last + 1))
    return cores


def _delta(f, value, source, key):
    text = value.strip().lower() if isinstance(value, str) else None
    in_se = text is not None and text.endswith("se")
    raw = text[:-2].strip() if in_se else value
    try:
        number = _number(f, raw, source, key, integer=False)
    except ConfigError as exc:
        bound = f"{exc.problem}; " if exc.problem.startswith("must be") else ""  # out of range: say the limit
        raise ConfigError(source, key, f"{bound}expected a number >= 0 (an absolute change, e.g. 0.01) or a number "
                                       f"of standard errors (e.g. 2se), got {value!r}") from None
    return MinDelta(number, "se" if in_se else "abs")


def _cpus(f, value, source, key):
    try:
        parse_cpus(str(value))
    except ValueError:
        raise ConfigError(source, key, f"expected cores such as 1, 2-3 or 0,2-3, got {value!r}") from None
    return str(value)


def _modules(f, value, source, key):
    """Module prefixes: "mypkg.,examples" (command line, environment) or a list (TOML)."""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(i, str) for i in items):
        raise ConfigError(source, key, f"expected module prefixes such as 'mypkg.,examples.', got {value!r}")
    prefixes = tuple(i.strip() for i in items if i.strip())
    bad = [p for p in prefixes if not re.fullmatch(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*\.?", p, re.ASCII)]
    if bad or not prefixes:
        raise ConfigError(source, key, f"{bad or value!r}: expected dotted module names such as mypkg. or examples")
    return prefixes


def _endpoint(f, value, source, key):
    text = _str(f, value, source, key)
    if not re.fullmatch(r"ipc://[^\x00-\x1f]+|tcp://[^\s/]+:[0-9]{1,5}|none", text):
        raise ConfigError(source, key, f"expected ipc://PATH, tcp://HOST:PORT or none, got {text!r}")
    if text.startswith("ipc://") and len(os.fsencode(text[len("ipc://"):])) > MAX_IPC_PATH_BYTES:
        raise ConfigError(source, key, f"the ipc path is {len(os.fsencode(text[len('ipc://'):]))} bytes, over "
                                       f"the {MAX_IPC_PATH_BYTES}-byte limit of a unix socket address")
    return text


def _hostport(f, value, source, key):
    """HOST:PORT (``[::1]:8000`` for IPv6); port 0 asks for a free one."""
    text = _str(f, value, source, key).strip()
    host, colon, port = text.rpartition(":")
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    # fullmatch, ASCII digits: "$" would match before a trailing newline, and \d (and int()) take any script's digits
    if not colon or not re.fullmatch(r"[0-9]{1,5}", port) or int(port) > 65535 or not re.fullmatch(
            r"[A-Za-z0-9][A-Za-z0-9.-]{0,252}|[0-9A-Fa-f:]+", bare or "-") or (":" in bare and bare == host):
        raise ConfigError(source, key, f"expected HOST:PORT such as 127.0.0.1:8000 ([::1]:8000 for IPv6; port 0 "
                                       f"for a free one), got {text!r}")
    return text


def _name(f, value, source, key):
    text = _str(f, value, source, key)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+=@,-]{0,127}", text):
        raise ConfigError(source, key, f"expected a name of letters, digits and . _ + = @ , - (a directory "
                                       f"name, up to 128 characters, not starting with a dot), got {text!r}")
    return text


def _strings(f, value, source, key):
    """Non-empty names: "a,b" (command line, environment) or a list (TOML)."""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(i, str) for i in items):
        raise ConfigError(source, key, f"expected a list of names such as [\"hellaswag\", \"arc_easy\"], got {value!r}")
    names = tuple(i.strip() for i in items if i.strip())
    if len(names) != len(items):
        raise ConfigError(source, key, f"empty name in {value!r}")
    return names


def _paths(f, value, source, key):
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(i, str) and i for i in items):
        raise ConfigError(source, key, f"expected a directory or a list of directories, got {value!r}")
    import os

    missing = [p for p in items if not os.path.isdir(p)]
    if missing:
        raise ConfigError(source, key, f"{', '.join(missing)}: not a directory (task YAMLs live there)")
    return tuple(items)


def _suites(f, value, source, key):
    """``[suites.NAME]`` tables: each name a plain name, each table a SuiteOptions."""
    raw = as_object(f, value, source, key)
    suites = {}
    for name, table in raw.items():
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}", name):   # the whole name ("$" allows a last "\n")
            raise ConfigError(source, f"{key}.{name}", "a suite's name is letters, digits, _ and - (it names "
                                                        "TensorBoard tags and directories)")
        if is_dataclass(table) and isinstance(table, f.metadata["table"]):
            suites[name] = table
            continue
        if not isinstance(table, dict):
            raise ConfigError(source, f"{key}.{name}", f"expected a table such as {{tasks = [\"hellaswag\"]}}, "
                                                        f"got {table!r}")
        suites[name] = build_table(f.metadata["table"], table, source, f"{key}.{name}")
    return suites


_KINDS: dict[str, Callable[[Field, Any, str, str], Any]] = {
    "int": _int, "float": _float, "str": _str, "bool": _bool, "choice": _choice, "factory": _factory,
    "object": as_object, "table": _table, "plugins": _plugins, "device": _device, "cpus": _cpus,
    "endpoint": _endpoint, "hostport": _hostport, "path": _str, "path_list": _str, "delta": _delta, "name": _name, "modules": _modules,
    "strings": _strings, "paths": _paths, "suites": _suites,
}
