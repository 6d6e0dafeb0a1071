"""Hugging Face ``.eval_results/`` YAML for one exported cell (``evald export --format hf``).

A model repository holds its evaluation results as YAML files under ``.eval_results/`` (hub-docs
PR #2107; https://huggingface.co/docs/hub/eval-results): each file a list of entries with
``dataset`` (``id``, ``task_id``), ``value``, ``date``, ``source`` and ``notes``. A checkpoint is one
model revision, so each step gets its own folder to upload as that revision's ``.eval_results/``::

    OUT/hf/step_<STEP>/.eval_results/<suite>_<task>.yaml

One entry per metric; ``notes`` names the step, the snapshot digest and the cell identity.

May import: the sinks' export_cells and export_target (every file goes through it).
"""

from __future__ import annotations

import time
from pathlib import Path

import yaml

from evald.sinks.export_cells import ExportCell, scored_metrics, stderr_of
from evald.sinks.export_target import ExportTarget


def write(cell: ExportCell, target: ExportTarget) -> list[Path]:
    folder = ("hf", f"step_{cell.step}", ".eval_results")
    date = time.strftime("%Y-%m-%d", time.gmtime(cell.evaluated_at))
    written = []
    for name, task in sorted(cell.tasks.items()):
        dataset = task.config.get("dataset_path")
        entries = []
        for metric in scored_metrics(task):
            se = stderr_of(task, metric)
            entries.append({
                "dataset": {"id": dataset if isinstance(dataset, str) and "/" in dataset and not Path(dataset).exists()
                            else name, "task_id": name},
                "value": float(task.metrics[metric]),
                "date": date,
                "source": {"name": f"evald (lm-eval {cell.lm_eval_version})", "url": "https://github.com/EleutherAI/lm-evaluation-harness"},
                "notes": (f"{metric}{f' ± {se:.4g} (standard error)' if se is not None else ''}, {len(task.samples)} of "
                          f"{task.documents_original} documents, {task.num_fewshot}-shot; checkpoint step {cell.step}, "
                          f"snapshot sha256 {cell.weights_sha256 or 'unknown'}, run {cell.run_name}, evald cell "
                          f"{cell.cell_identity[:12]}"),
            })
        written.append(target.write_text((*folder, f"{cell.suite}_{name}.yaml"),
                                         yaml.safe_dump(entries, sort_keys=False, allow_unicode=True)))
    return written
