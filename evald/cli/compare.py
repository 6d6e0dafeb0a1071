"""``evald compare STEP_A STEP_B``: two steps' suite results, paired by document, per task and metric.

For each (suite, task) both steps have per-sample outputs for, it prints each metric's values,
the paired difference ``B - A`` with its paired-bootstrap interval, the paired SE, the minimum
detectable effect at that number of documents and, for 0/1 metrics, McNemar's exact and mid-p
tests (the statistics: ``decisions/paired.py``). Both sides must have been scored under the same
identity (same lm-eval version, task configurations, few-shot count, subset and tokenizer);
otherwise it refuses and names what differs. The two steps may come from two runs
(``--b-run-dir`` and friends), on the same identity. Read-only, safe while evald runs.
Exit 0 when compared, 2 when it cannot compare (the message says why).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from evald.daemon.run_dir import RunDirError, locate
from evald.decisions import paired
from evald.ledger.samples import (SAMPLES_DIR, SampleFile, SampleFileError, list_samples, read_samples,
                                  read_sidecar)

MAX_LISTED = 12  # steps or differences named in one message


class CompareError(RuntimeError):
    """The two sides cannot be compared; the message says why and what to do."""


@dataclass(frozen=True)
class Side:
    run_dir: Path
    step: int
    label: str


@dataclass
class TaskComparison:
    suite: str
    task: str
    identity_hash: str
    n: int
    metrics: list[paired.PairedComparison]
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"suite": self.suite, "task": self.task, "identity_hash": self.identity_hash, "n": self.n,
                "metrics": [m.to_json() for m in self.metrics], "notes": self.notes}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("step_a", type=int, metavar="STEP_A", help="the step compared against (the difference is B - A)")
    p.add_argument("step_b", type=int, metavar="STEP_B", help="the step compared")
    p.add_argument("--suite", default=None, help="only this suite (default: every suite both steps have)")
    p.add_argument("--task", action="append", default=None, metavar="TASK", help="only this task (repeatable)")
    p.add_argument("--identity", default=None, metavar="HEX",
                   help="compare the results scored under this identity (a prefix of its hash), superseded or not "
                        "(default: each step's current identity)")
    for prefix, whose in (("", "STEP_A's run (and STEP_B's, unless --b-... is given)"), ("b-", "STEP_B's run")):
        env = (lambda name: os.environ.get(name)) if not prefix else (lambda name: None)
        p.add_argument(f"--{prefix}ckpt-dir", default=env("EVALD_CKPT_DIR"),
                       help=f"the checkpoint directory {whose} serves" + (" (env EVALD_CKPT_DIR)" if not prefix else ""))
        p.add_argument(f"--{prefix}logdir", default=env("EVALD_LOGDIR"),
                       help=f"the log directory evald was given for {whose}, if any")
        p.add_argument(f"--{prefix}run-name", default=env("EVALD_RUN_NAME"), help=f"the name of {whose}")
        p.add_argument(f"--{prefix}run-dir", default=None, help=f"the run directory of {whose}: LOGDIR/RUN_NAME")
    p.add_argument("--alpha", type=float, default=paired.ALPHA,
                   help="level of the intervals (1 - alpha) and of the MDE's two-sided test (default: %(default)s)")
    p.add_argument("--power", type=float, default=paired.POWER, help="power of the MDE (default: %(default)s)")
    p.add_argument("--resamples", type=int, default=paired.RESAMPLES,
                   help="paired-bootstrap resamples (default: %(default)s)")
    p.add_argument("--seed", type=int, default=paired.SEED, help="the bootstrap's seed (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print the comparison as one JSON object")


def compare_command(args: argparse.Namespace) -> int:
    if not (0 < args.alpha < 1 and 0 < args.power < 1 and args.resamples >= 1 and args.seed >= 0):
        print(f"evald compare: --alpha and --power must be in (0, 1), --resamples >= 1 and --seed >= 0; got "
              f"{args.alpha}, {args.power}, {args.resamples}, {args.seed}", file=sys.stderr)
        return 2
    try:
        side_a, side_b = _sides(args)
        tasks = compare_steps(side_a, side_b, suite=args.suite, tasks=args.task, identity=args.identity,
                              alpha=args.alpha, power=args.power, resamples=args.resamples, seed=args.seed)
    except (CompareError, RunDirError, SampleFileError, paired.PairedError) as exc:
        print(f"evald compare: {exc}", file=sys.stderr)
        return 2
    settings = {"alpha": args.alpha, "power": args.power, "resamples": args.resamples, "seed": args.seed}
    if args.json:
        print(json.dumps({"a": _side_json(side_a), "b": _side_json(side_b), **settings,
                          "tasks": [t.to_json() for t in tasks]}, indent=1))
    else:
        print(render(side_a, side_b, tasks, **settings))
    return 0


def _side_json(side: Side) -> dict[str, Any]:
    return {"run_dir": str(side.run_dir), "step": side.step, "label": side.label}


def _sides(args: argparse.Namespace) -> tuple[Side, Side]:
    def where(prefix: str) -> Path:
        get = lambda name: getattr(args, prefix + name)  # noqa: E731
        return locate(get("run_dir") and Path(get("run_dir")), get("ckpt_dir") and Path(get("ckpt_dir")),
                      get("logdir") and Path(get("logdir")), get("run_name"))

    run_a = where("")
    given_b = any(getattr(args, f"b_{name}") for name in ("run_dir", "ckpt_dir", "logdir", "run_name"))
    run_b = where("b_") if given_b else run_a
    for run in {run_a, run_b}:
        if not run.is_dir():
            raise CompareError(f"{run} is not a run directory (give --run-dir LOGDIR/RUN_NAME, or --ckpt-dir)")
    across = run_a.resolve() != run_b.resolve()
    label = (lambda run, step: f"{run.name}@{step}") if across else (lambda run, step: f"step {step}")
    return Side(run_a, args.step_a, label(run_a, args.step_a)), Side(run_b, args.step_b, label(run_b, args.step_b))


def compare_steps(a: Side, b: Side, *, suite: str | None = None, tasks: Sequence[str] | None = None,
                  identity: str | None = None, alpha: float = paired.ALPHA, power: float = paired.POWER,
                  resamples: int = paired.RESAMPLES, seed: int = paired.SEED) -> list[TaskComparison]:
    """Every (suite, task) of the two steps, compared; CompareError when they cannot be."""
    found_a, found_b = _files_of(a, suite, tasks), _files_of(b, suite, tasks)
    keys = sorted(set(found_a) | set(found_b))
    only = [(k, a if k not in found_a else b, b if k not in found_a else a) for k in keys
            if k not in found_a or k not in found_b]
    if only:
        (s, t), missing, having = only[0]
        more = f" (and {len(only) - 1} more task(s); --task chooses)" if len(only) > 1 else ""
        raise CompareError(f"{s}/{t}: {having.label} has per-sample outputs, {missing.label} has none in "
                           f"{missing.run_dir / SAMPLES_DIR / s / t}{more}")
    return [_compare_task(k, found_a[k], found_b[k], a, b, identity, alpha, power, resamples, seed) for k in keys]


def _files_of(side: Side, suite: str | None, tasks: Sequence[str] | None) -> dict[tuple[str, str], list[SampleFile]]:
    wanted = set(tasks) if tasks else None
    found: dict[tuple[str, str], list[SampleFile]] = {}
    for f in list_samples(side.run_dir, suite=suite, step=side.step):
        if wanted is None or f.task in wanted:
            found.setdefault((f.suite, f.task), []).append(f)  # oldest first
    if not found:
        what = " ".join(x for x in (suite and f"suite {suite}", tasks and f"task(s) {', '.join(tasks)}") if x)
        others = sorted({f.step for f in list_samples(side.run_dir, suite=suite)
                         if wanted is None or f.task in wanted})
        shown = ", ".join(map(str, others[:MAX_LISTED])) + (" ..." if len(others) > MAX_LISTED else "")
        raise CompareError(f"step {side.step} has no per-sample outputs{' for ' + what if what else ''} in "
                           f"{side.run_dir / SAMPLES_DIR}; steps that have some: {shown or 'none'}")
    return found


def _pick(files: list[SampleFile], identity: str | None, side: Side) -> SampleFile:
    if identity is None:
        return files[-1]
    chosen = [f for f in files if f.identity12.startswith(identity.lower()[:12])]
    if not chosen:
        listed = ", ".join(f.identity12 for f in files)
        raise CompareError(f"{files[0].suite}/{files[0].task}: {side.label} has no results under identity "
                           f"{identity} (it has {listed})")
    return chosen[-1]


def _compare_task(key: tuple[str, str], files_a: list[SampleFile], files_b: list[SampleFile], a: Side, b: Side,
                  identity: str | None, alpha: float, power: float, resamples: int, seed: int) -> TaskComparison:
    suite, task = key
    file_a, file_b = _pick(files_a, identity, a), _pick(files_b, identity, b)
    sidecar_a, sidecar_b = read_sidecar(file_a), read_sidecar(file_b)
    if sidecar_a.identity_hash != sidecar_b.identity_hash:
        differences = identity_differences(sidecar_a.identity, sidecar_b.identity)
        shown = "; ".join(differences[:MAX_LISTED]) + (" ..." if len(differences) > MAX_LISTED else "")
        common = sorted({f.identity12 for f in files_a} & {f.identity12 for f in files_b})
        hint = (f"; both also have results under {', '.join(common)} (superseded): --identity {common[-1]} compares "
                f"those" if common else "")
        raise CompareError(f"{suite}/{task}: {a.label} and {b.label} were scored under different identities "
                           f"({sidecar_a.identity_hash[:12]} vs {sidecar_b.identity_hash[:12]}): "
                           f"{shown or 'the identities are equal but their hashes differ'}. A paired comparison "
                           f"needs the same documents, prompts and tokenizer{hint}")
    samples_a, samples_b = read_samples(file_a), read_samples(file_b)
    if not np.array_equal(samples_a.doc_ids, samples_b.doc_ids):
        only_a = np.setdiff1d(samples_a.doc_ids, samples_b.doc_ids)
        only_b = np.setdiff1d(samples_b.doc_ids, samples_a.doc_ids)
        raise CompareError(f"{suite}/{task}: {file_a.samples} and {file_b.samples} hold different documents under "
                           f"one identity ({only_a.size} only in the first, e.g. {only_a[:3].tolist()}; "
                           f"{only_b.size} only in the second, e.g. {only_b[:3].tolist()}): the files are damaged")
    names = sorted(set(samples_a.metrics) & set(samples_b.metrics))
    notes = [f"{name}: only {side.label} has it; not compared" for side, mine, theirs in
             ((a, samples_a, samples_b), (b, samples_b, samples_a)) for name in sorted(set(mine.metrics) -
                                                                                       set(theirs.metrics))]
    results = []
    for name in names:
        result = paired.compare(name, samples_a.metrics[name], samples_b.metrics[name], alpha=alpha, power=power,
                                resamples=resamples, seed=seed)
        for side, sidecar, value in ((a, sidecar_a, result.value_a), (b, sidecar_b, result.value_b)):
            reported = sidecar.metrics.get(name)
            if isinstance(reported, (int, float)) and not math.isclose(reported, value, rel_tol=1e-6, abs_tol=1e-9):
                notes.append(f"{name}: {side.label}'s sidecar reports {reported:.6g}, its per-sample outputs give "
                             f"{value:.6g}; the comparison uses the per-sample outputs")
        if result.se == 0:
            notes.append(f"{name}: no document's value changed between the two steps; the paired SE is 0 and "
                         f"the MDE cannot be estimated from them (shown as -)")
        results.append(result)
    return TaskComparison(suite, task, sidecar_a.identity_hash, int(samples_a.doc_ids.size), results, notes)


def identity_differences(a: Any, b: Any, path: str = "") -> list[str]:
    """Each leaf where two identities differ: ``tokenizer: 'ab…' vs 'cd…'``, ``tasks.arc_easy: only in B``."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in sorted(set(a) | set(b), key=str):
            where = f"{path}.{key}" if path else str(key)
            if key not in b:
                out.append(f"{where}: only in A ({_short(a[key])})")
            elif key not in a:
                out.append(f"{where}: only in B ({_short(b[key])})")
            else:
                out.extend(identity_differences(a[key], b[key], where))
        return out
    return [] if a == b else [f"{path or 'identity'}: {_short(a)} vs {_short(b)}"]


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 40 else text[:37] + "..."


def render(a: Side, b: Side, tasks: list[TaskComparison], *, alpha: float, power: float, resamples: int,
           seed: int) -> str:
    level = f"{100 * (1 - alpha):g}%"
    lines = [f"evald compare: {b.label} - {a.label}, paired by document",
             f"interval: {level} paired bootstrap ({resamples} resamples, seed {seed}); MDE: smallest true difference "
             f"a two-sided test at alpha={alpha:g} detects with power {power:g} at this many documents"]
    if a.run_dir.resolve() != b.run_dir.resolve():
        lines.append(f"A: {a.run_dir}  B: {b.run_dir}")
    for t in tasks:
        lines += ["", f"{t.suite}/{t.task}: {t.n} documents, identity {t.identity_hash[:12]}"]
        header = ["metric", a.label, b.label, "B - A", f"{level} interval", "paired SE", "MDE", "McNemar (A only/B only)"]
        rows = [header] + [[m.metric, _num(m.value_a), _num(m.value_b), _signed(m.difference),
                            f"[{_signed(m.ci_low)}, {_signed(m.ci_high)}]", _num(m.se),
                            "-" if m.se == 0 else _num(m.mde), _mcnemar(m)]
                           for m in t.metrics]
        widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
        lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
        lines += [f"  note: {n}" for n in t.notes]
    return "\n".join(lines)


def _num(x: float) -> str:
    return "nan" if not math.isfinite(x) else f"{x:.4f}" if abs(x) < 1000 else f"{x:.6g}"


def _signed(x: float) -> str:
    return "nan" if not math.isfinite(x) else f"{x:+.4f}" if abs(x) < 1000 else f"{x:+.6g}"


def _mcnemar(m: paired.PairedComparison) -> str:
    t = m.mcnemar
    return "-" if t is None else f"{t.a_only}/{t.b_only}: exact p={t.p_exact:.3g}, mid-p={t.p_mid:.3g}"
