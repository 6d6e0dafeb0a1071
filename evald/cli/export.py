"""``evald export``: a run's current suite cells in the formats the field exchanges.

For each current evaluated cell (suite, step) of the run, the per-sample files evald wrote
(evald.ledger.samples) and what lm-eval knows of each task (its resolved config, version, metric
directions, documents), loaded from the suite's configuration (``--config``: the TOML evald runs
with) and checked against the config hash in the cell's identity: a task whose config changed since
the cell was evaluated is refused, never exported with the new config. Then the writers:
lm-eval's own files (evald.sinks.lm_eval_files), Every Eval Ever (evald.sinks.every_eval_ever),
Hugging Face ``.eval_results/`` (evald.sinks.hf_eval_results). Read-only: safe while evald runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from evald import __version__
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
    from evald.cli.status import ReadOnlyLedger
    from evald.daemon.run_dir import LEDGER_FILE
    from evald.ledger.ledger import EVALUATED
    from evald.sinks import every_eval_ever, hf_eval_results, lm_eval_files

    formats = args.formats or list(FORMATS)
    ledger = ReadOnlyLedger(run_dir / LEDGER_FILE)
    try:
        cells = [c for c in ledger.cells(EVALUATED) if (not args.suite or c.suite in args.suite)
                 and (not args.step or c.step in args.step)]
        details = {(c.suite, c.step): ledger.cell_details(c.step, c.suite) for c in cells}
        run_ids = {c.step: (ledger.step(c.step).run_id if ledger.step(c.step) else None) for c in cells}
    finally:
        ledger.close()
    if not cells:
        print(f"evald export: {run_dir} has no evaluated suite cell" + (" of the suites/steps asked for" if
              args.suite or args.step else ""), file=sys.stderr)
        return 2
    try:
        suites = _suite_options(args.config)
        exported = [_cell(run_dir, c.suite, c.step, c.identity, *details[(c.suite, c.step)], run_ids[c.step],
                          args.model_name or run_dir.name, suites) for c in cells]
    except ExportError as exc:
        print(f"evald export: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out)
    writers = {"lm-eval": lm_eval_files.write, "hf": hf_eval_results.write,
               "every-eval-ever": lambda cell, where: every_eval_ever.write(cell, where, args.developer)}
    count = 0
    for cell in exported:
        for name in formats:
            count += len(writers[name](cell, out))
    print(f"evald export: {len(exported)} cell(s) ({', '.join(f'{c.suite}@{c.step}' for c in exported)}) as "
          f"{', '.join(formats)}: {count} file(s) in {out}")
    return 0


def _suite_options(config_path: str | None) -> dict[str, Any]:
    """The suites of evald's configuration (their include_path and few-shot count)."""
    from evald.config import ConfigError, environment_layer, resolve, toml_layer

    try:
        layers = [toml_layer(config_path)] if config_path else []
        return dict(resolve([*layers, environment_layer()]).config.suites or {})
    except ConfigError as exc:
        raise ExportError(f"evald's configuration: {exc}") from None


def _cell(run_dir: Path, suite: str, step: int, cell_identity: str, provenance: dict | None,
          finished_at: float | None, run_id: str | None, model_name: str, suites: dict[str, Any]) -> ExportCell:
    from evald.ledger.samples import SampleFileError, read_step

    if not provenance or "identity" not in provenance:
        raise ExportError(f"the {suite} cell of step {step} records no suite identity (evaluated by an older "
                          f"evald): `evald retry --step {step}` evaluates it again")
    identity, identity_sha256 = provenance["identity"], provenance["identity_sha256"]
    options = suites.get(suite)
    if options is None:
        raise ExportError(f"suite {suite} is not in evald's configuration: give --config with the TOML evald runs "
                          f"with ([suites.{suite}]), so that lm-eval can load its tasks")
    tasks = {}
    for name, recorded in sorted(identity["tasks"].items()):
        try:
            sidecar, documents = read_step(run_dir, suite, name, step, identity_sha256)
        except SampleFileError as exc:
            raise ExportError(str(exc)) from None
        tasks[name] = _task(suite, name, recorded, options, sidecar.metrics, documents, identity.get("num_fewshot"))
    return ExportCell(run_dir.name, run_id, model_name, suite, step, provenance.get("weights_sha256"), cell_identity,
                      identity_sha256, str(identity.get("lm_eval")), __version__, finished_at or 0.0, tasks)


def _task(suite: str, name: str, recorded: dict, options: Any, metrics: dict, documents: list[dict],
          num_fewshot: int | None) -> ExportTask:
    from evald.pipeline.suites.runner import config_sha256, task_manager

    loaded = task_manager(tuple(options.include_path), (name,)).load([name])["tasks"]
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
    return ExportTask(name, {k: float(v) for k, v in metrics.items()}, documents, config, task.VERSION,
                      num_fewshot or 0, dict(task.higher_is_better()), len(docs),
                      {d["doc_id"]: docs[d["doc_id"]] for d in documents if 0 <= d["doc_id"] < len(docs)})
