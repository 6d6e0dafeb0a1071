"""evald's subcommands besides serving a run: ``evald status``, ``evald retry``, ``evald compare``,
``evald subset``, ``evald keys``."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path
from typing import Sequence

from evald.config import ConfigError, option_fields, toml_layer
from evald.config.schema import coerce
from evald.daemon.run_dir import LEDGER_FILE, RunDirError, default_logdir, find_run, locate, resolved_ckpt_dir, runs_in


def run(name: str, argv: Sequence[str]) -> int:
    return {"status": status, "retry": retry, "compare": compare, "subset": subset, "keys": keys,
            "backfill": backfill, "export": export}[name](argv)


def _which_run(p: argparse.ArgumentParser) -> None:
    where = p.add_argument_group("which run", "default: as evald is configured (--ckpt-dir or EVALD_CKPT_DIR, "
                                              "else --config's ckpt_dir), else the current directory: a run "
                                              "directory, a checkpoint directory a run serves, or a log "
                                              "directory holding one run")
    where.add_argument("--ckpt-dir", default=os.environ.get("EVALD_CKPT_DIR") or None,
                       help="the checkpoint directory the run serves (env EVALD_CKPT_DIR)")
    where.add_argument("--logdir", default=os.environ.get("EVALD_LOGDIR") or None,
                       help="the log directory evald was given, if any (default: CKPT_DIR/../tensorboard; env "
                            "EVALD_LOGDIR)")
    where.add_argument("--run-name", default=os.environ.get("EVALD_RUN_NAME") or None,
                       help="the run's name in the log directory (env EVALD_RUN_NAME)")
    where.add_argument("--run-dir", default=None, help="the run directory itself: LOGDIR/RUN_NAME")
    where.add_argument("--config", metavar="TOML", default=None,
                       help="the TOML file evald runs with: its ckpt_dir, logdir and run_name")


def _from_config(args: argparse.Namespace) -> None:
    """Fill what the command line and environment left unset from the TOML evald runs with."""
    if not args.config:
        return
    layer = toml_layer(args.config)
    by_name = {f.name: f for f in option_fields()}
    for name in ("ckpt_dir", "logdir", "run_name"):
        if getattr(args, name) is None and name in layer.values:
            setattr(args, name, coerce(by_name[name], layer.values[name], layer.source, layer.keys[name]))
    if args.run_dir is None and args.ckpt_dir is None and args.logdir is None:   # --run-dir alone names the run
        raise RunDirError(f"{args.config} sets neither ckpt_dir nor logdir: give --ckpt-dir or --run-dir")


def _from_here(here: Path) -> Path | None:
    """The run the current directory is, serves, or holds alone; None when it is none of these."""
    if (here / LEDGER_FILE).exists():
        return here
    here = resolved_ckpt_dir(here)
    served = find_run(here, default_logdir(here))
    if served is not None:
        return served.path
    runs = runs_in(here)
    return runs[0].path if len(runs) == 1 else None


def _run_path(args: argparse.Namespace, prog: str) -> Path | None:
    try:
        _from_config(args)
        if args.run_dir is None and args.ckpt_dir is None and args.logdir is None:
            path = _from_here(Path.cwd())
            if path is None:
                raise RunDirError(f"say which run: --ckpt-dir DIR (or EVALD_CKPT_DIR; and --logdir if evald was "
                                  f"given one), --config TOML (evald's), or --run-dir LOGDIR/RUN_NAME; the current "
                                  f"directory {Path.cwd()} is no run directory, no checkpoint directory a run "
                                  f"serves and no log directory with one run")
        else:
            path = locate(args.run_dir, args.ckpt_dir and Path(args.ckpt_dir), args.logdir and Path(args.logdir),
                          args.run_name)
    except (RunDirError, ConfigError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return None
    if not (path / LEDGER_FILE).exists():
        print(f"{prog}: {path / LEDGER_FILE} does not exist: has evald started on this run?", file=sys.stderr)
        return None
    return path


def status(argv: Sequence[str]) -> int:
    """Show a run's state: read-only, safe while evald runs"""
    from evald.cli.status import gather, render

    p = argparse.ArgumentParser(prog="evald status", description=status.__doc__ + ". Exit 2 when the run "
                                "cannot be found.")
    _which_run(p)
    p.add_argument("--json", action="store_true", help="print the same information as one JSON object")
    p.add_argument("--step", type=int, action="append", metavar="STEP", help="what happened to step STEP: its "
                   "evaluation (metrics ± SE, provenance), skip or failure, and lag (repeatable)")
    args = p.parse_args(list(argv))
    path = _run_path(args, "evald status")
    if path is None:
        return 2
    info = gather(path)
    if args.step:
        from evald.cli import step_report

        steps = [step_report.describe(path, step, info["ckpt_dir"]) for step in args.step]
        print(json.dumps(steps, indent=1) if args.json else "\n\n".join(map(step_report.render, steps)))
        return 0
    print(json.dumps(info, indent=1) if args.json else render(info))
    return 0


def retry(argv: Sequence[str]) -> int:
    """Re-queue failed checkpoints, and judge rejected files again: all of them when no STEP is named.
    Safe while evald runs: it evaluates them at its next turn; otherwise at its next start"""
    from evald.ledger.ledger import Ledger
    from evald.ledger.requeue import UnknownSteps, retry as requeue
    from evald.cli.status import lock_holder

    p = argparse.ArgumentParser(prog="evald retry", description=retry.__doc__ + ". A step the lag policy "
                                "skipped is queued when named. Exit 2 when a named step is not in the run "
                                "(nothing is changed; the message names the steps it has).")
    p.add_argument("steps", nargs="*", type=int, metavar="STEP", help="steps to re-queue (default: every failure)")
    p.add_argument("--step", type=int, action="append", dest="again", metavar="STEP",
                   help="evaluate STEP again even if it was evaluated: its result is kept, marked superseded, and "
                        "the new one becomes current (repeatable)")
    _which_run(p)
    args = p.parse_args(list(argv))
    path = _run_path(args, "evald retry")
    if path is None:
        return 2
    ledger = Ledger(path / LEDGER_FILE)
    try:
        wanted = sorted(set(args.steps or []) | set(args.again or [])) or None
        done = requeue(ledger, wanted, "re-queued by evald retry", evaluated_too=bool(args.again))
    except UnknownSteps as exc:
        print(f"evald retry: {exc}; nothing was re-queued", file=sys.stderr)
        return 2
    finally:
        ledger.close()
    holder = lock_holder(path / "evald.lock")
    print(f"evald retry: {done.describe()}")
    if done.requeued or done.rejudged:
        print(f"evald pid {holder.get('pid')} serves this run and takes them up at its next turn" if holder
              is not None else "no evald serves this run now: they are evaluated when evald starts on it")
    return 1 if args.steps and done.not_failed and not done.requeued and not done.rejudged else 0


def compare(argv: Sequence[str]) -> int:
    """Compare two steps' suite results paired by document: per task and metric, the difference with its
    paired-bootstrap interval, McNemar's test for 0/1 metrics and the minimum detectable effect. Read-only,
    safe while evald runs"""
    from evald.cli.compare import add_arguments, compare_command

    p = argparse.ArgumentParser(prog="evald compare", description=compare.__doc__ + ". Exit 2 when the two "
                                "steps cannot be compared (the message says why). See docs/benchmarks.md.")
    add_arguments(p)
    return compare_command(p.parse_args(list(argv)))


def backfill(argv: Sequence[str]) -> int:
    """Evaluate retained checkpoints later, at each checkpoint's own step: the validation of the steps the
    lag policy skipped and, with --suite, a benchmark suite on the retained checkpoints that lack its cell.
    Beside a running evald it only records the request (evald takes it up at its next turn, after any
    new checkpoint); with evald's options after --, and no evald serving the run, it evaluates them itself"""
    from evald.cli.status import gather, lock_holder
    from evald.daemon.suite_turn import plan_backfill
    from evald.ledger.ledger import Ledger
    from evald.ledger.requeue import shown_steps

    from evald.cli.fleet import add_arguments as fleet_arguments, fleet_command, option_count

    p = argparse.ArgumentParser(prog="evald backfill", description=backfill.__doc__ + ". See docs/benchmarks.md.")
    p.add_argument("--suite", action="append", help="the suite's name ([suites.NAME] in evald's configuration); "
                   "without it, the validation alone; repeatable with --fleet-dir: each checkpoint is then loaded "
                   "once for all of them")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--steps", metavar="A:B", help="only steps A to B (inclusive)")
    which.add_argument("--every", type=option_count, metavar="K", help="every K-th retained checkpoint")
    _which_run(p)
    fleet_arguments(p)
    p.add_argument("evald_args", nargs=argparse.REMAINDER, metavar="-- EVALD_OPTIONS",
                   help="standalone: evald's own options (e.g. --config evald.toml); evald then runs until the "
                        "cells are done (--idle-exit-s 5 unless given)")
    args = p.parse_args(list(argv))
    if not args.fleet_dir and (args.worker_index is not None or args.plan or args.merge):
        p.error("--worker-index, --plan and --merge belong to a fleet: give --fleet-dir")
    if not args.fleet_dir and args.suite and len(args.suite) > 1:
        p.error("give one --suite (several only with --fleet-dir)")
    if args.fleet_dir and not args.suite and not args.merge:   # a merge takes the suites of the fleet's plan
        p.error("a fleet backfills suites: give --suite")
    span = None
    if args.steps:
        bounds = re.fullmatch(r"([0-9]{1,19}):([0-9]{1,19})", args.steps)   # ASCII digits only, as a step's name
        if bounds is None:
            p.error(f"--steps: expected A:B (two whole numbers in ASCII digits), got {args.steps!r:.80}")
        span = (int(bounds.group(1)), int(bounds.group(2)))
    if args.every is not None and args.every < 1:
        p.error("--every must be >= 1")
    path = _run_path(args, "evald backfill")
    if path is None:
        return 2
    ckpt_dir = gather(path)["ckpt_dir"] or args.ckpt_dir
    if not ckpt_dir:
        print("evald backfill: cannot tell the run's checkpoint directory: give --ckpt-dir", file=sys.stderr)
        return 2
    if args.fleet_dir:   # workers on Slurm or Kubernetes, or their merge (evald.cli.fleet)
        return fleet_command(args, path, Path(ckpt_dir), span)
    args.suite = args.suite[0] if args.suite else None
    ledger = Ledger(path / LEDGER_FILE)
    try:
        given = [a for a in args.evald_args if a != "--"]
        known = _known_suites(ledger, args.config, given)
        running = lock_holder(path / "evald.lock") is not None
        # Refused when it can be told: the evald options given here, or a running evald that has built its
        # suites. Otherwise the evald that takes the request up drops it, with a log line, if it has no such suite.
        if args.suite and args.suite not in known and (args.config or given or (running and known)):
            print(f"evald backfill: no suite {args.suite!r} here: the known suites are "
                  f"{', '.join(sorted(known)) or 'none'} (those evald has built for this run, and those of the "
                  f"--config or evald options given here); nothing recorded", file=sys.stderr)
            return 2
        plan = plan_backfill(ledger, Path(ckpt_dir), span, args.every)
        # the skipped steps' validation and the suite's request, in one transaction (a running evald takes
        # requests in its own: neither overwrites the other's)
        if args.suite:
            ledger.add_backfill_request(args.suite, plan.steps, revalidate=plan.revalidate)
        else:
            ledger.requeue_failures(plan.revalidate, [], [], "re-queued by evald backfill", counter=None)
    finally:
        ledger.close()
    if plan.revalidate:
        print(f"evald backfill: validation on {len(plan.revalidate)} retained checkpoint(s) the lag policy "
              f"skipped: {shown_steps(plan.revalidate)}")
    elif not args.suite:
        print("evald backfill: validation: every retained checkpoint in range has been evaluated or is queued")
    if args.suite:
        print(f"evald backfill: suite {args.suite} on {len(plan.steps)} retained checkpoint(s): "
              f"{shown_steps(plan.steps) or '-'} (cells it already has are not evaluated again)")
    for step, why in plan.left_out:
        print(f"  left out: step {step}: {why}")
    holder = lock_holder(path / "evald.lock")
    if holder is not None:
        print(f"evald pid {holder.get('pid')} serves this run and takes them up at its next turn")
        return 0
    extra = [a for a in args.evald_args if a != "--"]
    if not extra:
        print("no evald serves this run now: they are evaluated when evald starts on it (or give evald's "
              "options after --)")
        return 0
    import subprocess

    if "--idle-exit-s" not in extra:
        extra += ["--idle-exit-s", "5"]
    if "--ckpt-dir" not in extra:
        extra += ["--ckpt-dir", str(ckpt_dir)]
    print("evaluating them now: evald " + " ".join(extra), flush=True)
    # -P: the current directory is not put first on sys.path, so a folder named evald there (the checkout, seen
    # from its parent) cannot shadow the installed package; the eval group's ranks run the same way (msrun_command)
    return subprocess.call([sys.executable, "-P", "-m", "evald", *extra])


def export(argv: Sequence[str]) -> int:
    """Write a run's current suite cells as lm-eval's output files, Every Eval Ever records and Hugging Face
    .eval_results YAML, each naming the checkpoint's step and snapshot digest. Read-only, safe while evald runs"""
    from evald.cli.export import add_arguments, export_run

    p = argparse.ArgumentParser(prog="evald export", description=export.__doc__ + ". See docs/benchmarks.md.")
    _which_run(p)
    add_arguments(p)
    args = p.parse_args(list(argv))
    path = _run_path(args, "evald export")
    if path is None:
        return 2
    return export_run(args, path)


def _known_suites(ledger, config: str | None, evald_args: list[str]) -> set[str]:
    """The suites a backfill may name: those an evald built for this run (it records each), and those
    of the TOML or the evald options given to the backfill."""
    from evald.daemon.suite_turn import SINCE_KEY

    known = set(ledger.get_state(SINCE_KEY) or {}) | {cell.suite for cell in ledger.cells() if cell.suite}
    if config:
        known |= set(toml_layer(config).values.get("suites") or {})
    for flag, value in zip(evald_args, evald_args[1:]):   # evald's --config TOML and --suites JSON
        try:
            if flag == "--config":
                known |= set(toml_layer(value).values.get("suites") or {})
            elif flag == "--suites":
                known |= set(json.loads(value) or {})
        except (ConfigError, OSError, ValueError, TypeError):
            pass    # the evald started below says what is wrong with them
    return known


def keys(argv: Sequence[str]) -> int:
    """Create CURVE key pairs for evald and the trainer, one directory per host, and say where each goes."""
    from evald.cli.keys import keys_command

    p = argparse.ArgumentParser(prog="evald keys", description=keys.__doc__ + " See docs/authentication.md.")
    p.add_argument("dir", metavar="DIR", help="a new directory (created 0700); existing keys are never overwritten")
    return keys_command(p.parse_args(list(argv)).dir)


def subset(argv: Sequence[str]) -> int:
    """Print the fixed validation subset: as recorded by an evald, or as evald would choose it."""
    from evald.config import EvaldConfig, default_of
    from evald.pipeline.subset import RULE, SubsetInfo, select_subset

    fields = EvaldConfig.__dataclass_fields__
    p = argparse.ArgumentParser(prog="evald subset", description=f"{subset.__doc__} The rule: {RULE}.")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--logdir", "--run-dir", dest="logdir",
                        help="an evald run directory (LOGDIR/RUN_NAME), or a log directory holding one run: "
                             "print the subset it recorded (subset.json)")
    source.add_argument("--num-samples", type=int, help="the validation set's length")
    source.add_argument("--data-factory", help="module:function of the validation set (its length is used)")
    p.add_argument("--data-kwargs", type=json.loads, default={}, metavar="JSON",
                   help="keyword arguments of the data factory, a JSON object")
    p.add_argument("--app-dir", default=None, help="directory put first on sys.path for the factory")
    p.add_argument("--subset-size", type=int, default=default_of(fields["subset_size"]),
                   help=f"{fields['subset_size'].metadata['help']} (default: %(default)s, as evald's)")
    p.add_argument("--subset-seed", type=int, default=default_of(fields["subset_seed"]),
                   help=f"{fields['subset_seed'].metadata['help']} (default: %(default)s, as evald's)")
    p.add_argument("--json", action="store_true", help="print subset.json's JSON instead of one index per line")
    args = p.parse_args(list(argv))
    if args.logdir:
        runs = runs_in(Path(args.logdir))
        run_path = runs[0].path if not (Path(args.logdir) / "subset.json").exists() and len(runs) == 1 else None
        path = (run_path or Path(args.logdir)) / "subset.json"
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            print(f"evald subset: {path} does not exist: has that evald built its network yet?", file=sys.stderr)
            return 2
        info = SubsetInfo(tuple(data["indices"]), data["num_samples"], data["subset_size"], data["seed"],
                          data["sha256"])
    else:
        size = args.num_samples
        if args.data_factory:
            from evald.contracts.wire import FactorySpec
            from evald.pipeline.factories import call_factory

            size = len(call_factory(FactorySpec(args.data_factory, args.data_kwargs, args.app_dir), "data"))
        if size is None or size <= 0 or args.subset_size < 1 or args.subset_seed < 0:
            print("evald subset: --num-samples and --subset-size must be >= 1, --subset-seed >= 0", file=sys.stderr)
            return 2
        info = SubsetInfo.of(select_subset(size, args.subset_size, args.subset_seed), num_samples=size,
                             requested=args.subset_size, seed=args.subset_seed)
    if args.json:
        print(info.to_json())
    else:
        print(f"# {info.describe()}; sha256 {info.sha256}", file=sys.stderr)
        print("\n".join(str(i) for i in info.indices))
    return 0
