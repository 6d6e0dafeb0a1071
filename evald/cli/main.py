"""The ``evald`` command: serve a run (the default), or one of the subcommands below.

    evald [OPTIONS]              evaluate a run's checkpoints as they appear (evald --help)
    evald status [...]           a run's state, read-only, safe while evald runs
    evald retry [STEP ...]       re-queue failed checkpoints (all when none is named)
    evald subset [...]           print the indices of the fixed validation subset
    evald keys DIR               create CURVE keys for evald and the trainer (docs/authentication.md)
    evald --version

Every run option is generated from evald/config/options.py; values are collected as
typed and validated once, with the same rules as TOML and the environment (exit 2).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Sequence

from evald import __version__
from evald.config import (ConfigError, ResolvedConfig, command_line_layer, default_of, environment_layer, flag_of,
                          option_fields, resolve, toml_layer)
from evald.config.schema import parse_cpus
from evald.daemon import logs

SUBCOMMANDS = ("status", "retry", "subset", "keys")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="evald",
        description="Asynchronous out-of-process evaluator for MindSpore training. Run it beside the training "
                    "job on a device no training rank uses: `evald --device 7`. Other commands: "
                    "`evald status`, `evald retry`, `evald subset`, `evald keys` (each with --help).",
        epilog="Precedence: command line > environment variable > --config TOML > the trainer's run "
               "announcement > default. Every option is also a TOML key of the same name (underscores); "
               "table options are TOML tables. See docs/configuration.md.")
    parser.add_argument("--version", action="version", version=f"evald {__version__}")
    parser.add_argument("--config", metavar="TOML", default=None, help="TOML file with any of these options")
    for f in option_fields():
        parser.add_argument(*_flags(f), dest=f.name, default=None, help=help_text(f), **_how(f))
    return parser


def _flags(f) -> list[str]:
    return ["--metric-plugin"] if f.name == "metric_plugins" else [flag_of(f)]


def _how(f) -> dict:
    kind = f.metadata["kind"]
    if kind == "bool":
        return {"action": argparse.BooleanOptionalAction}
    if kind == "plugins":
        return {"action": "append", "metavar": "MODULE:CLASS"}
    if kind == "table":  # repeatable: --tuning '{"watch": "polling"}' --tuning '{"rescan_interval_s": 1}'
        shorthand = getattr(f.metadata["table"], "SHORTHAND", None)
        return {"action": "append", "metavar": f"{shorthand.upper()}|JSON" if shorthand else "JSON"}
    return {"metavar": {"table": "JSON", "object": "JSON", "int": "N", "float": "X"}.get(kind, f.name.upper())}


def help_text(f) -> str:
    """The option's help with its default, environment variable and, for tables, every key."""
    default = default_of(f)
    if f.metadata["kind"] == "table":
        keys = ", ".join(f"{sub.name}={default_of(sub)!r}" for sub in f.metadata["table"].__dataclass_fields__.values())
        shown = "{" + keys + "}"
    elif f.metadata["kind"] == "choice":
        shown = f"{default}; one of {', '.join(f.metadata['choices'])}"
    else:
        shown = json.dumps(default) if isinstance(default, (dict, tuple)) else str(default)
    env = f.metadata.get("env")
    return f"{f.metadata['help']} (default: {shown}" + (f"; env {env})" if env else ")")


def parse_config(argv: Sequence[str], environ: dict | None = None) -> ResolvedConfig:
    """Command line, environment and TOML, validated; raises ConfigError."""
    args = vars(build_parser().parse_args(list(argv)))
    toml_path = args.pop("config")
    layers = [toml_layer(toml_path)] if toml_path else []
    layers += [environment_layer(environ), command_line_layer(args)]
    resolved = resolve(layers)
    check_monitor(resolved)
    return resolved


def check_monitor(resolved: ResolvedConfig) -> None:
    """Lightning's rule: a monitored metric that nothing will report is an error now, not a silent
    "never improves" later. The task may still come from the trainer's announcement: then any task's
    metric is accepted."""
    from evald.pipeline.metrics.plugins import plugin_name
    from evald.pipeline.tasks import TASKS, metric_names

    config = resolved.config
    tasks = [config.task] if config.task else list(TASKS)
    plugins = [plugin_name(spec) for spec in config.metric_plugins]
    known = set().union(*(metric_names(task, plugins, config.generation.prompts > 0) for task in tasks))
    if config.monitor not in known:
        shown = ", ".join(sorted(name for name in known if not name.startswith("sample/")))
        raise ConfigError("--monitor", repr(config.monitor),
                          f"no evaluation configured here reports it (task {config.task or 'from the trainer'}); "
                          f"the known metrics are {shown}, and sample/greedy/* or sample/sampled/* with generation")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in SUBCOMMANDS:
        from evald.cli import commands

        return commands.run(argv[0], argv[1:])
    try:
        resolved = parse_config(argv)
    except ConfigError as exc:
        print(f"evald: error: {exc}", file=sys.stderr)
        return 2
    config = resolved.config
    if config.group_size > 1:  # several devices: an msrun eval group (docs/eval-group.md)
        from evald.daemon.eval_group import main as group_main

        return group_main(resolved, argv)
    if config.cpu_affinity:
        os.sched_setaffinity(0, parse_cpus(config.cpu_affinity))  # before mindspore starts its threads
    logs.configure(config.log_level, config.log_format)
    from evald.daemon.server import Server

    return Server(resolved).serve()


if __name__ == "__main__":
    sys.exit(main())
