"""The ``evald`` command: serve a run (the default), or one of the subcommands below.

    evald [OPTIONS]              evaluate a run's checkpoints as they appear (evald --help)
    evald status [...]           a run's state, read-only, safe while evald runs
    evald retry [STEP ...]       re-queue failed checkpoints (all when none is named), or named skipped ones
    evald backfill [...]         evaluate retained checkpoints later: skipped steps' validation, a suite;
                                 --fleet-dir: a fleet of workers on Slurm or Kubernetes (docs/benchmarks.md)
    evald compare STEP_A STEP_B  two steps' suite results, paired by document (docs/benchmarks.md)
    evald subset [...]           print the indices of the fixed validation subset
    evald keys DIR               create CURVE keys for evald and the trainer (docs/authentication.md)
    evald export --out DIR       a run's suite cells as lm-eval, Every Eval Ever and Hugging Face files
    evald --version

Every run option is generated from evald/config/options.py; values are collected as
typed and validated once, with the same rules as TOML and the environment (exit 2).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path
from dataclasses import fields
from typing import Sequence

from evald import __version__
from evald.config import (ConfigError, ResolvedConfig, command_line_layer, default_of, environment_layer, flag_of,
                          option_fields, resolve, toml_layer)
from evald.config.options import HELP_GROUPS
from evald.config.schema import parse_cpus
from evald.daemon import logs
from evald.decisions.monitor_targets import MonitorError, check_suite_monitor, parse_suite_monitor

SUBCOMMANDS = ("status", "retry", "compare", "subset", "keys", "backfill", "export")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="evald",
        description="Asynchronous out-of-process evaluator for MindSpore training. Run it beside the training "
                    "job on a device no training rank uses: `evald --device 7`. Other commands: "
                    "`evald status`, `evald retry`, `evald backfill`, `evald compare`, `evald export`, `evald subset`, "
                    "`evald keys` "
                    "(each with --help).",
        epilog="Precedence: command line > environment variable > --config TOML > the trainer's run "
               "announcement > default. Every option is also a TOML key of the same name (underscores); "
               "table options are TOML tables. See docs/configuration.md.")
    parser.add_argument("--version", action="version", version=f"evald {__version__}")
    parser.add_argument("--config", metavar="TOML", default=None, help="TOML file with any of these options")
    by_name = {f.name: f for f in option_fields()}
    for title, description, names in grouped_options(list(by_name)):
        group = parser.add_argument_group(title, description or None)
        for name in names:
            f = by_name[name]
            group.add_argument(*_flags(f), dest=f.name, default=None, help=help_text(f), **_how(f))
    return parser


def grouped_options(names: Sequence[str]) -> list[tuple[str, str, list[str]]]:
    """``HELP_GROUPS`` with ``names`` (in definition order) placed: an option no group names joins
    the group of the option before it, so a new option is shown beside its neighbours."""
    groups = [(title, description, []) for title, description, _ in HELP_GROUPS]
    group_of = {name: i for i, (_, _, listed) in enumerate(HELP_GROUPS) for name in listed}
    current = 0
    for name in names:
        current = group_of.get(name, current)
        groups[current][2].append(name)
    return [g for g in groups if g[2]]


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
    if kind == "choice":
        return {"metavar": "{" + ",".join(f.metadata["choices"]) + "}"}
    return {"metavar": {"table": "JSON", "object": "JSON", "suites": "JSON", "int": "N", "float": "X"}.get(kind, f.name.upper())}


def help_text(f) -> str:
    """The option's help, then its default (unless the help already says what the default is), its
    environment variable and, for tables, every key's default."""
    meta = f.metadata
    notes = []
    if not re.search(r"\bdefault\b", meta["help"], re.IGNORECASE):
        notes.append(f"default: {_shown_default(f)}")
    if meta.get("env"):
        notes.append(f"env {meta['env']}")
    return meta["help"] + (f" ({'; '.join(notes)})" if notes else "")


def _shown_default(f) -> str:
    default = default_of(f)
    if f.metadata["kind"] == "table":
        keys = ((sub.name, default_of(sub)) for sub in fields(f.metadata["table"]))
        return "{" + ", ".join(f"{name}={'unset' if value is None else repr(value)}" for name, value in keys) + "}"
    if isinstance(default, bool):
        return "on" if default else "off"
    if default is None or default == ():
        return "unset"
    return str(default)


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
    suite_metric = parse_suite_monitor(config.monitor)
    if suite_metric is not None:   # SUITE/TASK/METRIC: the suite, its task and the metric must be configured
        suites = configured_suite_metrics(config)
        if suite_metric.suite not in suites:
            check_suite_monitor(config.monitor, suites)
        metrics = suite_metrics(config.suites[suite_metric.suite])
        if metrics is not None:
            check_suite_monitor(config.monitor, {suite_metric.suite: metrics})
        elif suite_metric.task not in suites[suite_metric.suite]:
            check_suite_monitor(config.monitor, suites)
        return
    tasks = [config.task] if config.task else list(TASKS)
    plugins = [plugin_name(spec) for spec in config.metric_plugins]
    known = set().union(*(metric_names(task, plugins, config.generation.prompts > 0) for task in tasks))
    if config.monitor not in known:
        shown = ", ".join(sorted(name for name in known if not name.startswith("sample/")))
        raise ConfigError("--monitor", repr(config.monitor),
                          f"no evaluation configured here reports it (task {config.task or 'from the trainer'}); "
                          f"the known metrics are {shown}, and sample/greedy/* or sample/sampled/* with generation")


def configured_suite_metrics(config) -> dict[str, dict[str, list[str]]]:
    """``{suite: {task: []}}`` of the configuration's suites: the suite named by ``--monitor
    SUITE/TASK/METRIC`` must be configured (checked before anything loads)."""
    return {name: {task: [] for task in options.tasks} for name, options in (config.suites or {}).items()}


def suite_metrics(options) -> dict[str, list[str]] | None:
    """``{task: [metric, ...]}`` of the monitored suite, as lm-eval loads its tasks (seconds, and only
    for a suite monitor); its task YAML is judged by the trust rule first. None when lm-eval cannot
    load them here: the suite's build says why, and only the task name is checked now."""
    from evald.pipeline.suites.lm_eval_metrics import suite_metric_names
    from evald.pipeline.suites.task_files import UntrustedTaskCode

    try:
        return suite_metric_names(options)
    except UntrustedTaskCode as exc:
        raise MonitorError(f"--monitor needs the suite's tasks, which are refused: {exc}") from None


def keep_framework_logs_out_of_cwd(config, environ=os.environ) -> None:
    """MindFormers, imported by a model factory, writes its logs to ``./output/log`` unless
    ``LOG_MF_PATH`` names another place (its ``get_log_path``): started from the training folder,
    evald would create ``output/`` in the trainer's tree and write into its ``info.log``. Point it
    at evald's own state, beside the run directories (or the private socket directory before the
    checkpoint directory is known), unless the operator chose a place."""
    if environ.get("LOG_MF_PATH"):
        return
    from evald.contracts.wire import default_socket_dir
    from evald.daemon.run_dir import default_logdir, resolved_ckpt_dir

    if config.logdir:
        base = Path(config.logdir)
    elif config.ckpt_dir:
        base = default_logdir(resolved_ckpt_dir(config.ckpt_dir))
    else:
        base = default_socket_dir()
    environ["LOG_MF_PATH"] = str(base.resolve() / "mindformers-log")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in SUBCOMMANDS:
        from evald.cli import commands

        return commands.run(argv[0], argv[1:])
    try:
        resolved = parse_config(argv)
    except (ConfigError, MonitorError) as exc:
        print(f"evald: error: {exc}", file=sys.stderr)
        return 2
    config = resolved.config
    if config.group_size > 1:  # several devices: an msrun eval group (docs/eval-group.md)
        from evald.daemon.eval_group import main as group_main

        return group_main(resolved, argv)
    keep_framework_logs_out_of_cwd(config)
    if config.cpu_affinity:
        os.sched_setaffinity(0, parse_cpus(config.cpu_affinity))  # before mindspore starts its threads
    logs.configure(config.log_level, config.log_format)
    from evald.daemon.server import Server

    return Server(resolved).serve()


if __name__ == "__main__":
    sys.exit(main())
