"""Hugging Face ``.eval_results/`` YAML for one exported cell (``evald export --format hf``).

A model repository holds its evaluation results as YAML files under ``.eval_results/``
(https://huggingface.co/docs/hub/eval-results; ``huggingface_hub.EvalResultEntry`` reads and writes
them): each file a list of entries, each ``dataset`` (``id``: the benchmark's Hub dataset, and
``task_id``: its task, both required; ``revision``), ``value`` (required), ``date``, ``source``
(``url``, ``name``) and ``notes``. A benchmark's leaderboard takes one value per model, dataset and
task, and an entry has no field naming its metric, so a task gets ONE entry: its headline metric
(evald.sinks.export_cells.primary_metric: the first metric its lm-eval config lists, never a
perplexity; ``bits_per_byte`` for a rolling log-likelihood task). ``notes`` name that metric and its
direction, its standard error, the documents, the checkpoint's step and snapshot digest
(``weights_sha256``) and evald's run and cell. The task's other metrics are in the lm-eval and Every
Eval Ever exports; a task that reports only perplexities gets no entry.

``dataset.id`` is the task's ``dataset_path`` when it is a Hub dataset id (``owner/name``, not a local
path), with its ``dataset_kwargs.revision`` if the config pins one; a task on local data (``json``, a
file) gets its own task name, to be replaced by the benchmark's Hub id before uploading.
``task_id`` is the lm-eval task. A checkpoint is one model revision, so each step gets its own
folder to upload as that revision's ``.eval_results/``::

    OUT/hf/step_<STEP>/.eval_results/<suite>_<task>.yaml

May import: the sinks' export_cells and export_target (every file goes through it).
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import yaml

from evald.sinks.export_cells import ExportCell, ExportTask, higher_is_better, lm_eval_key, primary_metric, stderr_of
from evald.sinks.export_target import ExportTarget

HUB_DATASET_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9_.-]+")
LM_EVAL_URL = "https://github.com/EleutherAI/lm-evaluation-harness"


def write(cell: ExportCell, target: ExportTarget) -> list[Path]:
    folder = ("hf", f"step_{cell.step}", ".eval_results")
    written = []
    for name, task in sorted(cell.tasks.items()):
        entry = row(cell, name, task)
        if entry is not None:
            written.append(target.write_text((*folder, f"{cell.suite}_{name}.yaml"),
                                             yaml.safe_dump([entry], sort_keys=False, allow_unicode=True)))
    return written


def row(cell: ExportCell, name: str, task: ExportTask) -> dict | None:
    """The task's entry: its headline metric's value; None when it has none (only perplexities)."""
    metric = primary_metric(task)
    if metric is None:
        return None
    return {"dataset": dataset(name, task), "value": float(task.metrics[metric]),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(cell.evaluated_at)),
            "source": {"url": LM_EVAL_URL, "name": f"evald (lm-eval {cell.lm_eval_version})"},
            "notes": _notes(cell, task, metric)}


def dataset(name: str, task: ExportTask) -> dict:
    path = task.config.get("dataset_path")
    on_hub = isinstance(path, str) and HUB_DATASET_ID.fullmatch(path) is not None and not Path(path).exists()
    found = {"id": path if on_hub else name, "task_id": name}
    kwargs = task.config.get("dataset_kwargs")
    revision = kwargs.get("revision") if isinstance(kwargs, dict) else None
    if on_hub and isinstance(revision, str):
        found["revision"] = revision
    return found


def _notes(cell: ExportCell, task: ExportTask, metric: str) -> str:
    direction = {True: "higher is better", False: "lower is better", None: "direction not stated"}
    se = stderr_of(task, metric)
    return (f"lm-eval {lm_eval_key(metric)} ({direction[higher_is_better(task, metric)]})"
            f"{f' ± {se:.4g} (standard error)' if se is not None else ''}, {len(task.samples)} of "
            f"{task.documents_original} documents, {task.num_fewshot}-shot; checkpoint step {cell.step}, "
            f"weights_sha256 {cell.weights_sha256 or 'unknown'}; evald run {cell.run_name}, suite {cell.suite}, "
            f"cell {cell.cell_identity[:12]}")
