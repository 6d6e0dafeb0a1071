"""Where option values come from: a TOML file, the environment, the command line.

Each reader returns raw values with the place they came from (``Layer``); none of
them validates. evald/config/resolve.py validates every layer with the same rules.
TOML keys are the option names (``subset_size = 64``); table options are TOML
tables (``[generation]``), and ``[[metric_plugins]]`` is a list of tables.

Paths: a relative path in a TOML file is read against that file's directory (``toml_layer``
makes it absolute, for every option of kind path, path_list or paths, in tables and suites
too), so a TOML means the same files wherever evald starts; one from the command line or the
environment stays relative to the current directory, as typed.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import Field, dataclass, fields
from pathlib import Path
from typing import Any, Mapping

from evald.config.options import option_fields
from evald.config.schema import ConfigError, flag_of
from evald.contracts.outside_paths import OutsidePathError, resolve


@dataclass(frozen=True)
class Layer:
    """Raw values from one source: ``source`` names it, ``keys[name]`` is how the user spelled each
    option there (``--every-k``, ``every_k``, ``EVALD_CKPT_DIR``), for errors and the log."""

    source: str
    values: dict[str, Any]
    keys: dict[str, str]


def toml_layer(path: str | os.PathLike) -> Layer:
    source = f"TOML file {path}"
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(source, "--config", "no such file") from None
    except OSError as exc:
        raise ConfigError(source, "--config", f"cannot be read ({exc.strerror})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(source, "--config", f"is not valid TOML ({exc})") from None
    known = {f.name for f in option_fields()}
    values, keys = {}, {}
    for key, value in data.items():
        name = key.replace("-", "_")
        if name not in known:
            raise ConfigError(source, key, "unknown option; `evald --help` lists every option, and each "
                                           "is a TOML key of the same name")
        values[name], keys[name] = value, key
    base = os.path.dirname(os.path.abspath(path))
    by_name = {f.name: f for f in option_fields()}
    return Layer(source, {name: _anchored(by_name[name], value, base) for name, value in values.items()}, keys)


PATH_KINDS = ("path", "path_list", "paths")


def _anchored(f: Field, value: Any, base: str) -> Any:
    """``value`` of option ``f`` with its relative paths made relative to ``base`` (the TOML file's
    directory); what is not a path, or not of the expected type, is left as it is for the validator."""
    kind = f.metadata["kind"]
    if kind == "path" and isinstance(value, str):
        return _joined(base, value)
    if kind == "path_list" and isinstance(value, str):
        return os.pathsep.join(_joined(base, part) for part in value.split(os.pathsep))
    if kind == "paths" and isinstance(value, str):
        return _joined(base, value)
    if kind == "paths" and isinstance(value, list):
        return [_joined(base, item) if isinstance(item, str) else item for item in value]
    if kind == "table" and isinstance(value, dict):
        return _anchored_table(f.metadata["table"], value, base)
    if kind == "suites" and isinstance(value, dict):
        return {name: _anchored_table(f.metadata["table"], table, base) if isinstance(table, dict) else table
                for name, table in value.items()}
    return value


def _anchored_table(table_cls: type, raw: dict, base: str) -> dict:
    known = {sub.name: sub for sub in fields(table_cls)}
    out = {}
    for key, value in raw.items():
        sub = known.get(key.replace("-", "_"))
        out[key] = _anchored(sub, value, base) if sub is not None else value   # unknown keys: build_table says so
    return out


def _joined(base: str, path: str) -> str:
    """``path`` under ``base`` when relative (an empty string stays empty: the validator refuses it)."""
    return os.path.join(base, path) if path and not os.path.isabs(path) else path


def environment_layer(environ: Mapping[str, str] | None = None) -> Layer:
    environ = os.environ if environ is None else environ
    values, keys = {}, {}
    for f in option_fields():
        env = f.metadata.get("env")
        if env and environ.get(env, "") != "":
            values[f.name], keys[f.name] = environ[env], env
    return Layer("environment", values, keys)


def command_line_layer(parsed: Mapping[str, Any]) -> Layer:
    """Values the user typed (argparse leaves the others None)."""
    values, keys = {}, {}
    by_name = {f.name: f for f in option_fields()}
    for name, value in parsed.items():
        if value is None or name not in by_name:
            continue
        if by_name[name].metadata["kind"] == "table":
            value = _merged_tables(value, flag_of(by_name[name]), getattr(by_name[name].metadata["table"], "SHORTHAND", None))
        values[name] = value
        keys[name] = "--metric-plugin" if name == "metric_plugins" else flag_of(by_name[name])
    return Layer("command line", values, keys)


def _merged_tables(texts: list[str], flag: str, shorthand: str | None = None) -> dict:
    """A table flag given several times: the JSON objects merged key by key, the last one winning.
    A table with a ``SHORTHAND`` key also takes a plain value for it (``--serve 127.0.0.1:8000``)."""
    import json

    merged: dict = {}
    for text in texts:
        if shorthand and not text.lstrip().startswith("{"):
            merged[shorthand] = text
            continue
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError("command line", flag, f"not a JSON object ({exc.msg}): {text!r}") from None
        if not isinstance(value, dict):
            raise ConfigError("command line", flag, f"expected a JSON object such as '{{\"key\": 1}}', got {text!r}")
        merged.update(value)
    return merged


def app_dir_exists(path: str, source: str, key: str = "app_dir") -> None:
    try:  # a path from outside (option, environment, RUN.json's search_path): resolved the one safe way
        resolved = resolve(path, f"{source} {key}")
    except OutsidePathError as exc:
        raise ConfigError(source, key, str(exc)) from None
    if not resolved.is_dir():
        raise ConfigError(source, key, f"{path} is not a directory")


def check_place(path: str, source: str, what: str, missing_parent_fix: str | None) -> None:
    """A directory evald will use: a directory, or not there yet under a parent that is (else a typo, said so).

    ``source`` is where the value came from (``command line --ckpt-dir``); with
    ``missing_parent_fix`` None a missing parent is accepted (the user asked to wait for it).
    """
    place = Path(path)
    if place.exists() and not place.is_dir():
        raise ConfigError(source, "", f"{path} is not a directory")
    if place.exists() or missing_parent_fix is None:
        return
    parent = place.absolute().parent
    if not parent.is_dir():
        raise ConfigError(source, "", f"the {what} {path} does not exist, nor does its parent {parent}: a "
                                      f"mistyped path? Check it, or {missing_parent_fix}")

