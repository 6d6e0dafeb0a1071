"""``evald`` command line: every EvaldConfig field is an option, shown with its default."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Sequence

from evald.config import EvaldConfig, build_config, default_of, option_fields

_PARSERS = {"int": int, "float": float, "str": str}


def _value_parser(type_name: str):
    base = type_name.replace(" | None", "").strip()
    if base == "dict":
        return lambda text: _json_object(text)
    return _PARSERS.get(base, str)


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object such as '{\"seq_len\": 64}'")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="evald",
        description="Asynchronous out-of-process evaluator for MindSpore training. Run it beside "
                    "the training job on a device no training rank uses: `evald --device 7`.",
        epilog="Precedence: command line > environment variable > --config TOML > the trainer's run "
               "announcement > built-in default. See docs/configuration.md.",
    )
    parser.add_argument("--config", metavar="TOML", default=None,
                        help="TOML file with any of these options (default: none)")
    for f in option_fields():
        flag = "--" + f.name.replace("_", "-")
        default = default_of(f)
        env = f.metadata.get("env")
        shown = json.dumps(default) if isinstance(default, (dict, tuple)) else default
        text = f"{f.metadata['help']} (default: {shown}" + (f"; env {env})" if env else ")")
        if f.type == "bool":
            parser.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=None,
                                help=text)
        elif f.type == "tuple":
            parser.add_argument("--metric-plugin", dest=f.name, action="append", default=None,
                                metavar="MODULE:CLASS", help=text)
        else:
            parser.add_argument(flag, dest=f.name, type=_value_parser(str(f.type)), default=None,
                                choices=f.metadata.get("choices"), help=text)
    return parser


def parse_config(argv: Sequence[str] | None = None) -> EvaldConfig:
    parser = build_parser()
    args = vars(parser.parse_args(argv))
    toml_path = args.pop("config")
    if args.get("metric_plugins") is not None:
        args["metric_plugins"] = tuple(args["metric_plugins"])
    try:
        return build_config(toml_path, args)
    except (ValueError, TypeError, OSError) as exc:
        parser.error(str(exc))
        raise  # unreachable: parser.error exits


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_config(argv)
    if config.cpu_affinity:
        os.sched_setaffinity(0, _cpu_set(config.cpu_affinity))  # before mindspore's threads exist
    from evald.server import Server

    return Server(config).run()


def _cpu_set(text: str) -> set[int]:
    cores: set[int] = set()
    for part in text.split(","):
        if "-" in part:
            lo, hi = part.split("-")
            cores.update(range(int(lo), int(hi) + 1))
        elif part.strip():
            cores.add(int(part))
    return cores


if __name__ == "__main__":
    sys.exit(main())
