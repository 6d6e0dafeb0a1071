"""``evald export``: a run's current suite cells in the formats the field exchanges.

For each current evaluated cell (suite, step) of the run, the per-sample files evald wrote
(evald.ledger.samples) and what lm-eval knows of each task (its resolved config, version, metric
directions, documents), loaded from the suite's configuration (``--config``: the TOML evald runs
with) and checked against the config hash in the cell's identity: a task whose config changed since
the cell was evaluated is refused, never exported with the new config. Then the writers:
lm-eval's own files (evald.sinks.lm_eval_files), Every Eval Ever 0.3.0 (evald.sinks.every_eval_ever),
Hugging Face ``.eval_results/`` (evald.sinks.hf_eval_results: each task's headline metric, never a
perplexity), each naming the checkpoint's step and snapshot digest, each writing through one
evald.sinks.export_target: the whole export is staged in a private directory inside ``--out`` and
renamed into place at the end, never through a link; a failure leaves ``--out`` as it was.

Everything is read before anything is written, and every input fails cleanly (exit 2, the message
naming it): ``--out`` is checked first (a regular file, a FIFO, a path below one); the ledger is opened
only once it is a regular file (a FIFO there would hang sqlite), its cells' recorded identities are
checked for shape; the per-sample files through their strict, bounded reader (evald.ledger.samples).
The run directory alone (``--run-dir``) finds the run; ``--config`` is needed for the suites' lm-eval
tasks. Read-only for the run: safe while evald runs.
"""

from __future__ import annotations

import argparse
import re
import sqlite3
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evald import __version__
from evald.contracts.safe_open import UnsafeFile, open_beneath
from evald.sinks.export_cells import ExportCell, ExportTask

FORMATS = ("lm-eval", "every-eval-ever", "hf")


class ExportError(RuntimeError):
    """A cell cannot be exported as asked; the message says why and what to do."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, metavar="DIR", help="where to write (created; files of the same cells "
                   "are rewritten with the same names)")
    p.add_argument("--format", action="append", choices=FORMATS, dest="formats",
                   help="lm-eval, every-eval-ever or hf (repeatable; default: all three)")
    p.add_argument("--suite", action="append", help="only this suite (repeatable; default: every suite)")
    p.add_argument("--step", type=int, action="append", help="only this step (repeatable; default: every step)")
    p.add_argument("--model-name", default=None, help="the model's name in the files (default: the run's name); "
                   "each checkpoint is MODEL@step-STEP")
    p.add_argument("--developer", default="local", help="Every Eval Ever's developer folder (default: local)")


def export_run(args: argparse.Namespace, run_dir: Path) -> int:
    from evald.sinks import every_eval_ever, hf_eval_results, lm_eval_files
    from evald.sinks.export_target import ExportTargetError, check_out, open_target

    formats = args.formats or list(FORMATS)
    try:
        out = check_out(args.out)      # before anything is read: a wrong --out is said at once
        cells = _evaluated_cells(run_dir, args.suite, args.step)
        if not cells:
            raise ExportError(f"{run_dir} has no evaluated suite cell" + (" of the suites/steps asked for" if
                              args.suite or args.step else ""))
        suites = _suite_options(args.config)
        exported = [_cell(run_dir, cell, args.model_name or run_dir.name, suites) for cell in cells]
    except (ExportError, ExportTargetError) as exc:
        print(f"evald export: {exc}", file=sys.stderr)
        return 2
    writers = {"lm-eval": lm_eval_files.write, "hf": hf_eval_results.write,
               "every-eval-ever": lambda cell, target: every_eval_ever.write(cell, target, args.developer)}
    staged = False
    try:
        with open_target(out) as target:
            for left in target.removed_leftovers:
                print(f"evald export: removed {out / left}, left by an export that was killed", file=sys.stderr)
            for cell in exported:
                for name in formats:
                    writers[name](cell, target)
            staged = True
            written = target.commit()
    except ExportTargetError as exc:
        print(f"evald export: {exc}" + ("" if staged else f"; nothing was written to {out}"), file=sys.stderr)
        return 2
    print(f"evald export: {len(exported)} cell(s) ({', '.join(f'{c.suite}@{c.step}' for c in exported)}) as "
          f"{', '.join(formats)}: {len(written)} file(s) in {out}")
    return 0


@dataclass(frozen=True)
class _Evaluated:
    """One current evaluated cell, as the ledger has it."""

    suite: str
    step: int
    identity: str
    provenance: Any
    finished_at: float | None
    run_id: str | None


def _evaluated_cells(run_dir: Path, suites: list[str] | None, steps: list[int] | None) -> list[_Evaluated]:
    """The run's current evaluated suite cells (of ``suites`` and ``steps`` when given), from its ledger,
    opened only once it is known to be a regular file (a FIFO there would hang sqlite's open)."""
    from evald.cli.status import ReadOnlyLedger
    from evald.daemon.run_dir import LEDGER_FILE
    from evald.ledger.ledger import EVALUATED

    for name in (LEDGER_FILE, f"{LEDGER_FILE}-wal", f"{LEDGER_FILE}-shm"):
        try:
            open_beneath(run_dir, name, sys.maxsize, single_link=False).close()  # sqlite reads only what it needs
        except FileNotFoundError:
            if name == LEDGER_FILE:
                raise ExportError(f"{run_dir / name} does not exist: has evald started on this run?") from None
        except (UnsafeFile, OSError) as exc:
            raise ExportError(f"{run_dir / name} cannot be read as evald's ledger: {exc}") from None
    try:
        ledger = ReadOnlyLedger(run_dir / LEDGER_FILE)
        try:
            cells = [c for c in ledger.cells(EVALUATED) if (not suites or c.suite in suites)
                     and (not steps or c.step in steps)]
            out = []
            for c in cells:
                step = ledger.step(c.step)
                out.append(_Evaluated(c.suite, c.step, c.identity, *ledger.cell_details(c.step, c.suite),
                                      step.run_id if step else None))
            return out
        finally:
            ledger.close()
    except (sqlite3.Error, ValueError, RecursionError) as exc:
        raise ExportError(f"{run_dir / LEDGER_FILE} cannot be read as evald's ledger ({str(exc)[:200]})") from None


def _suite_options(config_path: str | None) -> dict[str, Any]:
    """The suites of evald's configuration (their include_path and few-shot count)."""
    from evald.config import ConfigError, environment_layer, resolve, toml_layer

    try:
        layers = [toml_layer(config_path)] if config_path else []
        return dict(resolve([*layers, environment_layer()]).config.suites or {})
    except ConfigError as exc:
        raise ExportError(f"evald's configuration: {exc}") from None


def _cell(run_dir: Path, cell: _Evaluated, model_name: str, suites: dict[str, Any]) -> ExportCell:
    from evald.ledger.samples import SampleFileError, read_step

    suite, step, provenance = cell.suite, cell.step, cell.provenance
    if not isinstance(provenance, dict) or "identity" not in provenance:
        raise ExportError(f"the {suite} cell of step {step} records no suite identity (evaluated by an older "
                          f"evald): `evald retry --step {step}` evaluates it again")
    identity, identity_sha256 = provenance["identity"], provenance.get("identity_sha256")
    weights = provenance.get("weights_sha256")
    tasks_recorded = identity.get("tasks") if isinstance(identity, dict) else None
    num_fewshot = identity.get("num_fewshot") if isinstance(identity, dict) else None
    if not (isinstance(identity_sha256, str) and re.fullmatch(r"[0-9a-f]{64}", identity_sha256)
            and isinstance(tasks_recorded, dict) and tasks_recorded
            and all(isinstance(t, dict) for t in tasks_recorded.values())
            and (weights is None or isinstance(weights, str))
            and (num_fewshot is None or type(num_fewshot) is int and 0 <= num_fewshot <= 1_000_000)):
        raise ExportError(f"the {suite} cell of step {step}: its recorded identity is malformed (tasks, hashes or "
                          f"few-shot count of the wrong type); `evald retry --step {step}` evaluates it again")
    options = suites.get(suite)
    if options is None:
        raise ExportError(f"suite {suite} is not in evald's configuration: give --config with the TOML evald runs "
                          f"with ([suites.{suite}]), so that lm-eval can load its tasks")
    tasks = {}
    for name, recorded in sorted(tasks_recorded.items()):
        try:
            sidecar, documents = read_step(run_dir, suite, name, step, identity_sha256)
        except SampleFileError as exc:
            raise ExportError(str(exc)) from None
        tasks[name] = _task(suite, name, recorded, options, sidecar.metrics, documents, num_fewshot)
    return ExportCell(run_dir.name, cell.run_id, model_name, suite, step, weights, cell.identity,
                      identity_sha256, str(identity.get("lm_eval")), __version__, cell.finished_at or 0.0, tasks)


def _task(suite: str, name: str, recorded: dict, options: Any, metrics: dict, documents: list[dict],
          num_fewshot: int | None) -> ExportTask:
    from evald.pipeline.suites.runner import config_sha256, task_manager
    from evald.pipeline.suites.task_files import UntrustedTaskCode

    try:
        loaded = task_manager(tuple(options.include_path), (name,)).load([name])["tasks"]
    except UntrustedTaskCode as exc:
        raise ExportError(str(exc)) from None
    except KeyError:                      # lm-eval: "not a registered task/group/tag name"
        loaded = {}
    task = loaded.get(name)
    if task is None:
        raise ExportError(f"lm-eval finds no task {name} of suite {suite} (include_path {list(options.include_path)})")
    if config_sha256(task) != recorded.get("config_sha256"):
        raise ExportError(f"task {name} of suite {suite}: its lm-eval config changed since the cell was evaluated "
                          f"(sha256 {config_sha256(task)[:12]}, the cell's {str(recorded.get('config_sha256'))[:12]}); "
                          f"export with the configuration it was evaluated with")
    config = dict(task.dump_config())
    config["num_fewshot"] = num_fewshot or 0     # as lm-eval's simple_evaluate sets it before it evaluates
    docs = list(task.eval_docs)
    # a null aggregate is one the writer flagged as not finite (evald.ledger.samples): no number to export
    return ExportTask(name, {k: float(v) for k, v in metrics.items() if v is not None}, documents, config, task.VERSION,
                      num_fewshot or 0, dict(task.higher_is_better()), len(docs),
                      {d["doc_id"]: docs[d["doc_id"]] for d in documents if 0 <= d["doc_id"] < len(docs)})
