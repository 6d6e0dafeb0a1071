"""Every Eval Ever's aggregate record and instance file (schema v0.2) for one exported cell
(``evald export --format every-eval-ever``).

Laid out as that project's datastore lays out a contribution::

    OUT/every-eval-ever/data/<suite>/<developer>/<model>@step-<STEP>/<UUID>.json
    OUT/every-eval-ever/data/<suite>/<developer>/<model>@step-<STEP>/<UUID>_samples.jsonl

The checkpoint is the model: ``model_info.id`` is ``MODEL@step-STEP`` and its ``additional_details``
name the step and the snapshot digest (``weights_sha256``). One ``evaluation_results`` entry per task
and metric (its standard error as the uncertainty); one instance per document and 0/1 metric (the
schema's instance has a required ``is_correct``: a continuous per-document value such as a
log-likelihood is no correct/incorrect answer, so those metrics have aggregates only; so have a metric's
other filters, whose per-document values evald does not keep). The UUID is
derived from the cell, so exporting again rewrites the same files.

May import: the sinks' export_cells and export_target (every file goes through it).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from evald.sinks.export_cells import ExportCell, ExportTask, scored_metrics, stable_uuid4, stderr_of
from evald.sinks.export_target import ExportTarget

SCHEMA_VERSION = "0.2.3"
SOURCE = {"source_name": "evald", "source_type": "evaluation_run", "source_organization_name": "evald",
          "evaluator_relationship": "first_party"}


def write(cell: ExportCell, target: ExportTarget, developer: str = "local") -> list[Path]:
    file_id = stable_uuid4(cell.run_name, cell.suite, str(cell.step), cell.cell_identity)
    folder = ("every-eval-ever", "data", _part(cell.suite), _part(developer), _part(cell.model_id))
    relative = f"data/{_part(cell.suite)}/{_part(developer)}/{_part(cell.model_id)}/{file_id}_samples.jsonl"
    evaluation_id = f"{cell.suite}/{cell.model_id}/{cell.evaluated_at:.6f}"
    instances = [row for name, task in sorted(cell.tasks.items()) for row in _instances(cell, evaluation_id, name, task)]
    samples_text = "".join(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n" for row in instances)
    samples_path = target.write_text((*folder, f"{file_id}_samples.jsonl"), samples_text)
    record = {
        "schema_version": SCHEMA_VERSION,
        "evaluation_id": evaluation_id,
        "evaluation_timestamp": f"{cell.evaluated_at:.6f}",
        "retrieved_timestamp": f"{cell.evaluated_at:.6f}",
        "source_metadata": {**SOURCE, "additional_details": cell.names()},
        "eval_library": {"name": "lm_eval", "version": cell.lm_eval_version,
                         "additional_details": {"runner": f"evald {cell.evald_version}"}},
        "model_info": {"name": cell.model_id, "id": cell.model_id, "developer": developer,
                       "inference_engine": {"name": "mindspore", "version": "2.10.0"}, "additional_details": {
                           "deployment_type": "self_deployed", "model_availability": "unknown",
                           "step": str(cell.step), "weights_sha256": cell.weights_sha256 or "unknown",
                           "evald_run": cell.run_name, "evald_run_id": cell.run_id or ""}},
        "evaluation_results": [_result(cell, name, task, metric) for name, task in sorted(cell.tasks.items())
                               for metric in scored_metrics(task)],
        "detailed_evaluation_results": {
            "format": "jsonl", "file_path": relative, "hash_algorithm": "sha256",
            "checksum": hashlib.sha256(samples_text.encode("utf-8")).hexdigest(), "total_rows": len(instances)},
    }
    record_path = target.write_text((*folder, f"{file_id}.json"),
                                    json.dumps(record, indent=2, ensure_ascii=False, sort_keys=True))
    return [record_path, samples_path]


def _part(name: str) -> str:
    """A path component: no separators."""
    return name.replace("/", "_").replace("\\", "_") or "_"


def _result_id(cell: ExportCell, task: str, metric: str) -> str:
    return f"{cell.suite}/{task}/{metric}@step-{cell.step}"


def _result(cell: ExportCell, name: str, task: ExportTask, metric: str) -> dict:
    base = metric.split("@")[0]
    higher = task.higher_is_better.get(base)
    value = float(task.metrics[metric])
    score: dict = {"score": value, "details": {"documents": str(len(task.samples)), "num_fewshot": str(task.num_fewshot)}}
    se = stderr_of(task, metric)
    if se is not None:
        score["uncertainty"] = {"standard_error": {"value": se, "method": "lm-eval (bootstrap or analytic, as the "
                                                                     "metric defines)"},
                                "num_samples": len(task.samples)}
    return {
        "evaluation_result_id": _result_id(cell, name, metric),
        "evaluation_name": name,
        "source_data": {"dataset_name": name, "source_type": "other", "additional_details": {
            "lm_eval_task": name, "documents_evaluated": str(len(task.samples)),
            "documents_in_task": str(task.documents_original)}},
        "evaluation_timestamp": f"{cell.evaluated_at:.6f}",
        "metric_config": {"metric_id": f"lm_eval.{base}", "metric_name": metric,
                          "lower_is_better": higher is False,
                          # the mean of 0/1 per-document values lies in [0, 1]; other metrics' bounds are not known
                          **({"score_type": "continuous", "min_score": 0, "max_score": 1}
                             if _binary([s.get("metrics", {}).get(base) for s in task.samples]) else {}),
                          "additional_details": {"higher_is_better": str(higher)}},
        "score_details": score,
    }


def _binary(values: list) -> bool:
    return bool(values) and all(isinstance(v, (int, float)) and not isinstance(v, bool) and v in (0, 1)
                                or isinstance(v, bool) for v in values)


def _instances(cell: ExportCell, evaluation_id: str, name: str, task: ExportTask) -> list[dict]:
    samples = sorted(task.samples, key=lambda s: s["doc_id"])
    rows = []
    for metric in sorted(m for m in scored_metrics(task) if "@" not in m):   # the per-sample values are the
        values = [s.get("metrics", {}).get(metric) for s in samples]         # unfiltered ("none") ones
        if not _binary(values):
            continue
        for sample, value in zip(samples, values):
            doc = task.docs.get(sample["doc_id"])
            resps = sample.get("resps")
            rows.append({
                "schema_version": SCHEMA_VERSION, "evaluation_id": evaluation_id, "model_id": cell.model_id,
                "evaluation_name": name, "evaluation_result_id": _result_id(cell, name, metric),
                "sample_id": f"{name}/{sample['doc_id']}", "sample_hash": sample.get("doc_hash"),
                "interaction_type": "single_turn",
                "input": {"raw": json.dumps(doc, ensure_ascii=False, sort_keys=True, default=str) if doc is not None
                          else "", "reference": [str(sample.get("target"))]},
                "output": {"raw": [json.dumps(resps, ensure_ascii=False, default=str)]},
                "answer_attribution": [{"turn_idx": 0, "source": "output.raw",
                                        "extracted_value": json.dumps(resps, default=str),
                                        "extraction_method": "lm_eval filter none", "is_terminal": True}],
                "evaluation": {"score": float(value), "is_correct": bool(value == 1)},
                "metadata": {"step": str(cell.step), "weights_sha256": cell.weights_sha256 or "unknown",
                             "doc_id": str(sample["doc_id"])},
            })
    return rows
