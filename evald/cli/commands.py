"""evald's subcommands besides serving a run: ``evald status``, ``evald retry``, ``evald subset``,
``evald keys``."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Sequence

from evald.daemon.run_dir import LEDGER_FILE, RunDirError, locate, runs_in


def run(name: str, argv: Sequence[str]) -> int:
    return {"status": status, "retry": retry, "subset": subset, "keys": keys, "backfill": backfill}[name](argv)


def _which_run(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ckpt-dir", default=os.environ.get("EVALD_CKPT_DIR"),
                   help="the checkpoint directory the run serves (env EVALD_CKPT_DIR)")
    p.add_argument("--logdir", default=os.environ.get("EVALD_LOGDIR"),
                   help="the log directory evald was given, if any (default: CKPT_DIR/../tensorboard; env EVALD_LOGDIR)")
    p.add_argument("--run-name", default=os.environ.get("EVALD_RUN_NAME"), help="the run's name in the log directory")
    p.add_argument("--run-dir", default=None, help="the run directory itself: LOGDIR/RUN_NAME")


def _run_path(args: argparse.Namespace, prog: str) -> Path | None:
    try:
        path = locate(args.run_dir, args.ckpt_dir and Path(args.ckpt_dir), args.logdir and Path(args.logdir),
                      args.run_name)
    except RunDirError as exc:
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
    from evald.ledger.requeue import retry as requeue
    from evald.cli.status import lock_holder

    p = argparse.ArgumentParser(prog="evald retry", description=retry.__doc__ + ".")
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
    finally:
        ledger.close()
    holder = lock_holder(path / "evald.lock")
    print(f"evald retry: {done.describe()}")
    if done.requeued or done.rejudged:
        print(f"evald pid {holder.get('pid')} serves this run and takes them up at its next turn" if holder
              is not None else "no evald serves this run now: they are evaluated when evald starts on it")
    return 1 if args.steps and done.not_failed and not done.requeued and not done.rejudged else 0


def backfill(argv: Sequence[str]) -> int:
    """Evaluate a benchmark suite on retained checkpoints that lack its cell, at each checkpoint's own step.
    Beside a running evald it only records the request (evald takes it up at its next turn, after any
    new checkpoint); with evald's options after --, and no evald serving the run, it evaluates them itself"""
    from evald.cli.status import gather, lock_holder
    from evald.daemon.suite_turn import BACKFILL_KEY, backfill_steps
    from evald.ledger.ledger import Ledger

    p = argparse.ArgumentParser(prog="evald backfill", description=backfill.__doc__ + ". See docs/benchmarks.md.")
    p.add_argument("--suite", required=True, help="the suite's name ([suites.NAME] in evald's configuration)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--steps", metavar="A:B", help="only steps A to B (inclusive)")
    which.add_argument("--every", type=int, metavar="K", help="every K-th retained checkpoint")
    _which_run(p)
    p.add_argument("evald_args", nargs=argparse.REMAINDER, metavar="-- EVALD_OPTIONS",
                   help="standalone: evald's own options (e.g. --config evald.toml); evald then runs until the "
                        "cells are done (--idle-exit-s 5 unless given)")
    args = p.parse_args(list(argv))
    span = None
    if args.steps:
        try:
            low, high = (int(x) for x in args.steps.split(":"))
        except ValueError:
            p.error(f"--steps: expected A:B (two integers), got {args.steps!r}")
        span = (low, high)
    if args.every is not None and args.every < 1:
        p.error("--every must be >= 1")
    path = _run_path(args, "evald backfill")
    if path is None:
        return 2
    ckpt_dir = gather(path)["ckpt_dir"] or args.ckpt_dir
    if not ckpt_dir:
        print("evald backfill: cannot tell the run's checkpoint directory: give --ckpt-dir", file=sys.stderr)
        return 2
    ledger = Ledger(path / LEDGER_FILE)
    try:
        steps = backfill_steps(ledger, Path(ckpt_dir), span, args.every)
        requests = (ledger.get_state(BACKFILL_KEY) or []) + [{"suite": args.suite, "steps": steps}]
        ledger.put_state(BACKFILL_KEY, requests)
    finally:
        ledger.close()
    print(f"evald backfill: suite {args.suite} on {len(steps)} retained checkpoint(s): "
          f"{', '.join(map(str, steps)) or '-'} (cells it already has are not evaluated again)")
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
    return subprocess.call([sys.executable, "-m", "evald", *extra])


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
    p = argparse.ArgumentParser(prog="evald subset", description=subset.__doc__ + f". The rule: {RULE}.")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--logdir", "--run-dir", dest="logdir",
                        help="an evald run directory (LOGDIR/RUN_NAME), or a log directory holding one run: "
                             "print the subset it recorded (subset.json)")
    source.add_argument("--num-samples", type=int, help="the validation set's length")
    source.add_argument("--data-factory", help="module:function of the validation set (its length is used)")
    p.add_argument("--data-kwargs", type=json.loads, default={}, help="JSON kwargs of the data factory")
    p.add_argument("--app-dir", default=None, help="directory put first on sys.path for the factory")
    p.add_argument("--subset-size", type=int, default=default_of(fields["subset_size"]))
    p.add_argument("--subset-seed", type=int, default=default_of(fields["subset_seed"]))
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
