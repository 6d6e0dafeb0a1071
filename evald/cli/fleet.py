"""``evald backfill --fleet-dir DIR``: a backfill fanned out over an engine's workers, and its merge.

    evald backfill --suite S --fleet-dir DIR --plan                 fix the plan (optional: the first worker does it)
    evald backfill --suite S --fleet-dir DIR --config evald.toml [--worker-index I --worker-count N]
    evald backfill --fleet-dir DIR --merge                          take the finished cells into the ledger

The worker's index and count come from the options, else from the engine's variables: a Slurm job
array (``SLURM_ARRAY_TASK_ID`` relative to ``SLURM_ARRAY_TASK_MIN``, in ``SLURM_ARRAY_TASK_STEP``
strides, of ``SLURM_ARRAY_TASK_COUNT``), or a Kubernetes Indexed Job (``JOB_COMPLETION_INDEX``, with
the count from ``--worker-count`` or ``EVALD_WORKER_COUNT``, which the manifest sets to its
``completions``). A worker builds its network and suites from the TOML evald runs with (``--config``)
and evald's environment variables, completed by the trainer's RUN.json, as evald itself would.
The fleet's files are sealed with the run's fleet key (evald.daemon.fleet_key): ``RUN_DIR/fleet.key``,
created by the first worker or ``--plan``, else the file ``--fleet-key`` (``EVALD_FLEET_KEY_FILE``) names.
The work itself is evald.daemon.fleet; the merge evald.daemon.fleet_merge.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping


@dataclass(frozen=True)
class WorkerIndex:
    index: int
    count: int
    source: str       # where they came from, for the log


class IndexError_(ValueError):
    """The worker's index or count is missing or out of range; the message says what to give."""


_ASCII_COUNT = re.compile(r"[0-9]{1,9}")   # an engine writes ASCII digits; a billion workers is no fleet


def ascii_count(text: str, what: str) -> int:
    """``text`` as a non-negative integer written in ASCII digits, matched in full: int() would also take
    Arabic-Indic or full-width digits, ``1_0``, a sign and white space around it."""
    if _ASCII_COUNT.fullmatch(text) is None:
        shown = repr(text) if len(text) <= 40 else f"{text[:40]!r}... ({len(text)} characters)"
        raise IndexError_(f"{what}={shown} is not a whole number in ASCII digits (0-9, at most 9 of them, "
                          f"nothing else)")
    return int(text)


def option_count(text: str) -> int:
    """argparse's type for --worker-index, --worker-count (and evald backfill's --every): ascii_count."""
    try:
        return ascii_count(text, "the value")
    except IndexError_ as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _int(environ: Mapping[str, str], name: str) -> int | None:
    value = environ.get(name)
    if value is None or value == "":
        return None
    return ascii_count(value, name)


def worker_index(index: int | None, count: int | None, environ: Mapping[str, str]) -> WorkerIndex:
    """The options first, then a Slurm array's variables, then a Kubernetes Indexed Job's."""
    source = "--worker-index/--worker-count"
    if index is None and _int(environ, "SLURM_ARRAY_TASK_ID") is not None:
        task, low = _int(environ, "SLURM_ARRAY_TASK_ID"), _int(environ, "SLURM_ARRAY_TASK_MIN") or 0
        stride = _int(environ, "SLURM_ARRAY_TASK_STEP") or 1
        if (task - low) % stride:
            raise IndexError_(f"SLURM_ARRAY_TASK_ID={task} is not on the array's stride {stride} from "
                              f"SLURM_ARRAY_TASK_MIN={low}")
        index, source = (task - low) // stride, "SLURM_ARRAY_TASK_ID - SLURM_ARRAY_TASK_MIN"
        if count is None:
            count = _int(environ, "SLURM_ARRAY_TASK_COUNT")
            source += ", SLURM_ARRAY_TASK_COUNT"
    elif index is None and _int(environ, "JOB_COMPLETION_INDEX") is not None:
        index, source = _int(environ, "JOB_COMPLETION_INDEX"), "JOB_COMPLETION_INDEX"
    if count is None:
        count = _int(environ, "EVALD_WORKER_COUNT")
        source += ", EVALD_WORKER_COUNT"
    if index is None or count is None:
        raise IndexError_("which worker is this? give --worker-index I and --worker-count N, or run it as a Slurm "
                          "array task (SLURM_ARRAY_TASK_ID, SLURM_ARRAY_TASK_COUNT) or a Kubernetes Indexed Job "
                          "(JOB_COMPLETION_INDEX, with --worker-count or EVALD_WORKER_COUNT)")
    if count < 1 or not 0 <= index < count:
        raise IndexError_(f"worker index {index} of {count} ({source}): the index must be in [0, count)")
    return WorkerIndex(index, count, source)


def add_arguments(p: argparse.ArgumentParser) -> None:
    fleet = p.add_argument_group("a fleet of workers (docs/benchmarks.md, deploy/README.md)")
    fleet.add_argument("--fleet-dir", default=os.environ.get("EVALD_FLEET_DIR") or None,
                       help="the directory the workers and the merge share (one per backfill; env EVALD_FLEET_DIR); a worker "
                            "builds its network and suites from --config, the TOML evald runs with")
    fleet.add_argument("--worker-index", type=option_count, default=None, metavar="I",
                       help="this worker's index (default: from SLURM_ARRAY_TASK_ID or JOB_COMPLETION_INDEX)")
    fleet.add_argument("--worker-count", type=option_count, default=None, metavar="N",
                       help="how many workers (default: SLURM_ARRAY_TASK_COUNT, or env EVALD_WORKER_COUNT)")
    fleet.add_argument("--fleet-key", metavar="FILE", default=os.environ.get("EVALD_FLEET_KEY_FILE") or None,
                       help="the key that seals the fleet's files (env EVALD_FLEET_KEY_FILE; default: the run's own "
                            "RUN_DIR/fleet.key, created by the first worker or --plan: workers and merge running as "
                            "the run's user need nothing)")
    fleet.add_argument("--plan", action="store_true", help="only fix the fleet's plan (the missing cells) and exit")
    fleet.add_argument("--merge", action="store_true",
                       help="take the fleet's finished cells into the run's ledger, each once, and write their "
                            "TensorBoard points (or let the evald serving the run write them)")


def fleet_command(args: argparse.Namespace, path: Path, ckpt_dir: Path, span: tuple[int, int] | None,
                  environ: Mapping[str, str] = os.environ) -> int:
    """A fleet worker, ``--plan`` or ``--merge`` (``args``: evald backfill's, with --fleet-dir)."""
    from evald.daemon.fleet import FleetError, fleet_plan, make_plan, run_worker
    from evald.daemon.fleet_cells import PLAN_FILE, FleetFileError, plan_exists
    from evald.daemon.fleet_key import FleetKeyError, fleet_key

    fleet_dir = Path(args.fleet_dir)
    prog = "evald backfill"
    if args.merge:
        from evald.daemon.fleet_merge import merge

        try:
            key = fleet_key(path, args.fleet_key, create=False)   # the merge never makes one: nothing it made sealed a file
            report = merge(fleet_dir, path, key)
        except (FleetKeyError, FleetFileError) as exc:    # no key, no usable plan
            print(f"{prog} --merge: {exc}; nothing was taken", file=sys.stderr)
            return 2
        except OSError as exc:    # the run directory's side: a full or read-only disk
            print(f"{prog} --merge: stopped: {exc}; the cells taken before are in the ledger, run it again once "
                  f"this is fixed", file=sys.stderr)
            return 2
        print(f"{prog} --merge: {report.describe()}")
        for line in report.details():
            print(f"  {line}", file=sys.stderr)
        return 1 if report.missing or report.bad or report.conflicts else 0
    if not args.suite:
        print(f"{prog}: give --suite (repeatable) for a worker or --plan", file=sys.stderr)
        return 2
    try:
        key = fleet_key(path, args.fleet_key, create=True)    # the run's own, made by whichever worker comes first
    except FleetKeyError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    try:
        candidate = None
        if not plan_exists(fleet_dir):
            from evald.cli.status import ReadOnlyLedger
            from evald.daemon.run_dir import LEDGER_FILE

            ledger = ReadOnlyLedger(path / LEDGER_FILE)
            try:
                candidate = make_plan(ledger, ckpt_dir, args.suite, span, args.every)
            finally:
                ledger.close()
        plan = fleet_plan(fleet_dir, args.suite, candidate, key)
    except (FleetError, FleetFileError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    if args.plan:
        print(f"{prog}: the plan in {fleet_dir / PLAN_FILE}: {len(plan.cells())} cell(s) of suite(s) "
              f"{', '.join(plan.suites)} on {len(plan.snapshots)} checkpoint(s): "
              f"{', '.join(str(s.step) for s in plan.snapshots) or '-'}")
        return 0
    try:
        which = worker_index(args.worker_index, args.worker_count, environ)
    except IndexError_ as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    config = _worker_config(args.config, ckpt_dir)
    if config is None:
        return 2
    print(f"{prog}: worker {which.index} of {which.count} ({which.source}): "
          f"{len(plan.share(which.index, which.count))} of {len(plan.snapshots)} checkpoint(s)", flush=True)
    try:
        report = run_worker(config, ckpt_dir, fleet_dir, plan, which.index, which.count, key)
    except (FleetError, FleetFileError) as exc:   # FleetFileError: a link or FIFO where it writes its journal or cells
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    print(f"{prog}: {report.describe()}", flush=True)
    return 1 if report.retry else 0


def _worker_config(toml: str | None, ckpt_dir: Path):
    """evald's configuration for a worker: the TOML evald runs with (--config) and evald's environment
    variables, completed by the trainer's RUN.json (its model and data factories)."""
    from evald.config import (ConfigError, command_line_layer, environment_layer, resolve, toml_layer,
                              with_announcement)
    from evald.daemon import logs
    from evald.intake.trainer_files import read_announcement

    try:
        layers = [toml_layer(toml)] if toml else []
        resolved = resolve([*layers, environment_layer(), command_line_layer({"ckpt_dir": str(ckpt_dir)})])
        announced = read_announcement(ckpt_dir, operator=resolved)
        if announced is not None:
            resolved = with_announcement(resolved, announced.options, announced.where)
    except ConfigError as exc:
        print(f"evald backfill: error in evald's configuration: {exc}", file=sys.stderr)
        return None
    from evald.daemon.run_dir import default_logdir, resolved_ckpt_dir

    base = Path(resolved.config.logdir) if resolved.config.logdir else default_logdir(resolved_ckpt_dir(ckpt_dir))
    os.environ.setdefault("LOG_MF_PATH", str(base.resolve() / "mindformers-log"))  # as evald: not in the cwd
    logs.configure(resolved.config.log_level, resolved.config.log_format)
    return resolved.config
