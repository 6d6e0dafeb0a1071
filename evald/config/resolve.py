"""Validate and merge every source into one EvaldConfig, remembering where each value came from.

Precedence, strongest first: command line > environment > TOML > the trainer's run
announcement (only for what it knows, and only what the operator left unset) > defaults.
Every source goes through ``schema.coerce``, so ``--every-k 0``, ``EVALD_... = 0`` and
``every_k = 0`` in TOML fail the same way, naming their source. Rules that involve
several options are checked here, once.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Mapping

from evald.config.options import ANNOUNCED, EvaldConfig, option_fields
from evald.config.schema import ConfigError, build_table, coerce, table_object
from evald.config.sources import Layer, app_dir_exists, check_place

DEFAULT = "default"


@dataclass(frozen=True)
class ResolvedConfig:
    config: EvaldConfig
    sources: Mapping[str, str]  # option name -> where its value came from ("command line --every-k")

    def describe(self) -> list[str]:
        """One line per option: ``name = value  (source)``, for the start-up log."""
        return [f"{f.name} = {_show(getattr(self.config, f.name))}  ({self.sources.get(f.name, DEFAULT)})"
                for f in option_fields()]

    def set_by_operator(self, name: str) -> bool:
        return self.sources.get(name, DEFAULT) != DEFAULT and not self.sources[name].startswith("run announcement")


def resolve(layers: list[Layer]) -> ResolvedConfig:
    """``layers`` weakest first (TOML, environment, command line)."""
    by_name = {f.name: f for f in option_fields()}
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for layer in layers:
        for name, raw in layer.values.items():
            f, key = by_name[name], layer.keys[name]
            if f.metadata["kind"] == "table" and name in values:
                # A table from a stronger source updates the weaker one key by key.
                raw_table = table_object(f, raw, layer.source, key)
                values[name] = build_table(f.metadata["table"], raw_table, layer.source, key, values[name])
            else:
                values[name] = coerce(f, raw, layer.source, key)
            sources[name] = f"{layer.source} {key}"
    config = EvaldConfig(**values)
    _check_combinations(config, sources)
    if config.app_dir:
        app_dir_exists(config.app_dir, sources["app_dir"], "")
    if config.ckpt_dir:
        check_place(config.ckpt_dir, sources["ckpt_dir"], "checkpoint directory",
                    "give --wait-for-ckpt-dir to wait for the trainer to create it" if not config.wait_for_ckpt_dir
                    else None)
    if config.logdir:
        check_place(config.logdir, sources["logdir"], "log directory", "create its parent first")
    return ResolvedConfig(config, sources)


def with_announcement(resolved: ResolvedConfig, announced: Mapping[str, Any], where: str) -> ResolvedConfig:
    """Fill what the operator left unset from the trainer's announcement, validated like any source.

    ``announced`` holds option values (task, model_factory, model_kwargs, data_factory,
    data_kwargs, app_dir). An invalid value raises ConfigError naming ``where``.
    """
    by_name = {f.name: f for f in option_fields()}
    changes: dict[str, Any] = {}
    sources = dict(resolved.sources)
    operator_set_model = resolved.set_by_operator("model_factory")
    operator_set_data = resolved.set_by_operator("data_factory")
    for name, raw in announced.items():
        if name not in ANNOUNCED:
            raise AssertionError(f"{name} is not an announced option")
        if raw is None or resolved.set_by_operator(name):
            continue
        # Kwargs belong to their factory: never pair the operator's factory with the trainer's kwargs.
        if (name == "model_kwargs" and operator_set_model) or (name == "data_kwargs" and operator_set_data):
            continue
        changes[name] = coerce(by_name[name], raw, where, key=name)
        sources[name] = f"{where} {name}"
    if changes.get("app_dir"):
        app_dir_exists(changes["app_dir"], where, "search_path")
    return ResolvedConfig(replace(resolved.config, **changes), sources)


def _check_combinations(config: EvaldConfig, sources: Mapping[str, str]) -> None:
    def error(name: str, problem: str) -> ConfigError:
        source, _, key = sources.get(name, f"{DEFAULT} {name}").rpartition(" ")
        return ConfigError(source, key, problem)

    for which in ("model", "data"):
        if getattr(config, f"{which}_kwargs") is not None and not getattr(config, f"{which}_factory"):
            raise error(f"{which}_kwargs", f"given without {which}_factory; kwargs are never applied to the "
                                           f"trainer's announced factory: set --{which}-factory too")
    if config.group_size > 1 and config.metric_plugins:
        raise error("metric_plugins", f"metric plug-ins update per batch, so an eval group over devices "
                                      f"{config.device} cannot combine them exactly; evaluate on one device, or "
                                      f"drop the plug-ins")
    if config.tensor_parallel > 1:
        if config.tensor_parallel != config.group_size:
            raise error("tensor_parallel", f"{config.tensor_parallel} must equal the eval group's ranks "
                                           f"({config.group_size}: --device {config.device}"
                                           f"{f' on {config.group.nodes} hosts' if config.group.nodes > 1 else ''}); "
                                           f"data parallelism over groups of tensor-parallel ranks is not supported")
    if config.group.nodes > 1 and config.group.master_port is None:
        raise error("group", f"an eval group over {config.group.nodes} hosts needs group.master_port (the same "
                             f"on every host) and group.master_addr (node 0's address)")
    if config.group.nodes > 1 and config.group.key_file is None:
        raise error("group", f"an eval group over {config.group.nodes} hosts needs group.key_file, the same secret "
                             f"on every host (`evald keys DIR` writes DIR/group.key; copy it over ssh, mode 0600): "
                             f"msrun's own traffic is unauthenticated, and the key keeps a stranger from taking a "
                             f"rank's place (docs/security.md)")
    if config.every_k is not None and config.lag_policy != "every-k":
        raise error("every_k", f"only applies with lag_policy every-k, but lag_policy is {config.lag_policy!r}")
    if config.tokenizer_kwargs is not None and not config.tokenizer_factory:
        raise error("tokenizer_kwargs", "given without tokenizer_factory: set --tokenizer-factory too")
    for name, suite in (config.suites or {}).items():
        if suite.device is not None:
            outside = sorted({int(i) for i in suite.device.split(",")} - set(config.device.ids))
            if outside:
                raise error("suites", f"suites.{name}.device {suite.device} names device(s) {outside} that are "
                                      f"not in --device {config.device}; a suite runs on evald's own devices")
    if config.serve_forever and config.idle_exit_s is not None:
        raise error("idle_exit_s", "contradicts serve_forever; choose one")
    if not config.zmq and not config.ckpt_dir:
        raise error("endpoint", "is none, so evald cannot learn the checkpoint directory from the trainer: "
                                "set --ckpt-dir")
    low, high = config.stopping_threshold, config.divergence_threshold
    if low is not None and high is not None:
        wrong = low >= high if config.mode == "min" else low <= high
        if wrong:
            raise error("stopping_threshold", f"{low:g} must be {'below' if config.mode == 'min' else 'above'} "
                                              f"divergence_threshold {high:g} with mode {config.mode}")


SHOWN_ITEMS = 20          # items of a list, tuple or table shown in the start-up log
SHOWN_CHARACTERS = 2000   # characters of one value shown there
SHOWN_STRING = 500        # characters of one string in it


def _show(value: Any) -> str:
    """One option's value for the start-up log: long lists, tables and strings shortened, saying how much
    was left out (a suite of 100,000 task names must not become one 1 MB log line)."""
    shown = _shown(value, top=True)
    if len(shown) > SHOWN_CHARACTERS:
        shown = f"{shown[:SHOWN_CHARACTERS]}... ({len(shown) - SHOWN_CHARACTERS:,} more characters)"
    return shown


def _shown(value: Any, top: bool = False) -> str:
    if hasattr(value, "__dataclass_fields__") and not isinstance(value, type):
        return "{" + ", ".join(f"{f.name}={_shown(getattr(value, f.name))}" for f in fields(value)) + "}"
    if isinstance(value, (list, tuple, dict)):
        items = ([f"{_shown(k)}: {_shown(v)}" for k, v in list(value.items())[:SHOWN_ITEMS]]
                 if isinstance(value, dict) else [_shown(v) for v in value[:SHOWN_ITEMS]])
        if len(value) > SHOWN_ITEMS:
            items.append(f"... ({len(value) - SHOWN_ITEMS:,} more)")
        if isinstance(value, tuple) and len(value) == 1:
            items.append("")    # (x,) as Python shows it
        brackets = "{}" if isinstance(value, dict) else "[]" if isinstance(value, list) else "()"
        return brackets[0] + ", ".join(items).rstrip(" ") + brackets[1]
    if isinstance(value, str) and len(value) > SHOWN_STRING:
        return f"{value[:SHOWN_STRING]!r}... ({len(value) - SHOWN_STRING:,} more characters)"
    return str(value) if top and not isinstance(value, str) else repr(value)

