"""Every Eval Ever's aggregate record and instance file (schema 0.3.0) for one exported cell
(``evald export --format every-eval-ever``).

Laid out as that project's datastore lays out a contribution (``data/<collection>/<developer>/<model>/``,
the record and its samples companion sharing one UUID)::

    OUT/every-eval-ever/data/<suite>/<developer>/<model>@step-<STEP>/<UUID>.json
    OUT/every-eval-ever/data/<suite>/<developer>/<model>@step-<STEP>/<UUID>_samples.jsonl

The checkpoint is the model: ``model_info.id`` is ``MODEL@step-STEP`` and its ``additional_details``
name the step and the snapshot digest (``weights_sha256``) beside the two fields 0.3.0 requires
(``deployment_type`` self_deployed: evald ran it; ``model_availability`` unknown: evald cannot tell
whether the weights are published); ``source_metadata.additional_details`` and every instance's
``metadata`` repeat step and digest. ``eval_library`` is lm-eval, its version the one that evaluated.

One ``evaluation_results`` entry per task and metric, perplexities included: its standard error (how
lm-eval computed it, from the metric's aggregation), its direction, its range where the metric's
definition fixes one (``acc``, ``exact_match``... [0, 1]; a perplexity [1, Infinity), bits per byte
[0, Infinity)), ``metric_id`` the registry's global id where it has one (``accuracy``, ``exact-match``,
``f1``, ``perplexity``), else ``lm-evaluation-harness.<metric>``, and ``additional_details.primary``
saying which one is the task's headline (evald.sinks.export_cells.primary_metric: the value the
Hugging Face export publishes).

One instance per document and 0/1 metric (the schema's instance has a required ``is_correct``: a
continuous per-document value such as a log-likelihood is no correct/incorrect answer, so those
metrics have aggregates only; so have a metric's other filters, whose per-document values evald does
not keep). A cell with no such metric (a suite of rolling log-likelihood tasks) has no samples file
and no ``detailed_evaluation_results``: 0.3.0 refuses an empty companion. Its ``checksum`` is the
samples file's sha256 and ``total_rows`` its line count. The UUID is derived from the cell, so
exporting again rewrites the same files.

May import: the sinks' export_cells and export_target (every file goes through it).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from evald.sinks.export_cells import (ExportCell, ExportTask, aggregation_of, higher_is_better, primary_metric,
                                      scored_metrics, stable_uuid4, stderr_of)
from evald.sinks.export_target import ExportTarget

SCHEMA_VERSION = "0.3.0"
SOURCE = {"source_name": "evald", "source_type": "evaluation_run", "source_organization_name": "evald",
          "evaluator_relationship": "first_party"}
HARNESS = "lm-evaluation-harness"         # the registry's slug of lm-eval, which namespaces metric ids it lacks
GLOBAL_METRIC_IDS = {"acc": "accuracy", "exact_match": "exact-match", "f1": "f1", "perplexity": "perplexity"}
INFINITY = "Infinity"                     # the schema's spelling of an unbounded score
RANGES = {**dict.fromkeys(("acc", "acc_norm", "exact_match", "f1", "mc1", "mc2"), (0, 1)),
          **dict.fromkeys(("perplexity", "word_perplexity", "byte_perplexity"), (1, INFINITY)),
          "bits_per_byte": (0, INFINITY)}
KINDS = {**dict.fromkeys(("acc", "acc_norm", "exact_match", "mc1", "mc2"), "accuracy"), "f1": "f1",
         **dict.fromkeys(("perplexity", "word_perplexity", "byte_perplexity"), "perplexity"),
         "bits_per_byte": "compression_rate"}
# lm-eval's standard error by aggregation (lm_eval.api.metrics.stderr_for_metric): these bootstrapped,
# mean and acc_all analytic (sample standard deviation / sqrt(n)); any other gets none
BOOTSTRAPPED = frozenset({"median", "matthews_corrcoef", "f1_score", "perplexity", "bleu", "chrf", "ter", "nanmean"})


def write(cell: ExportCell, target: ExportTarget, developer: str = "local") -> list[Path]:
    file_id = stable_uuid4(cell.run_name, cell.suite, str(cell.step), cell.cell_identity)
    folder = ("every-eval-ever", "data", _part(cell.suite), _part(developer), _part(cell.model_id))
    evaluation_id = f"{cell.suite}/{cell.model_id}/{cell.evaluated_at:.6f}"
    instances = [row for name, task in sorted(cell.tasks.items()) for row in _instances(cell, evaluation_id, name, task)]
    record = {
        "schema_version": SCHEMA_VERSION,
        "evaluation_id": evaluation_id,
        "evaluation_timestamp": f"{cell.evaluated_at:.6f}",
        "retrieved_timestamp": f"{cell.evaluated_at:.6f}",
        "source_metadata": {**SOURCE, "additional_details": cell.names()},
        "eval_library": {"name": "lm_eval", "version": cell.lm_eval_version,
                         "additional_details": {"runner": f"evald {cell.evald_version}"}},
        "model_info": {"name": cell.model_id, "id": cell.model_id, "developer": developer,
                       "inference_engine": {"name": "mindspore"}, "additional_details": {
                           "deployment_type": "self_deployed", "model_availability": "unknown",
                           "step": str(cell.step), "weights_sha256": cell.weights_sha256 or "unknown",
                           "evald_run": cell.run_name, "evald_run_id": cell.run_id or ""}},
        "evaluation_results": [_result(cell, name, task, metric) for name, task in sorted(cell.tasks.items())
                               for metric in scored_metrics(task)],
    }
    written = []
    if instances:
        samples_text = "".join(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n" for row in instances)
        written.append(target.write_text((*folder, f"{file_id}_samples.jsonl"), samples_text))
        record["detailed_evaluation_results"] = {
            "format": "jsonl", "file_path": "/".join((*folder[1:], f"{file_id}_samples.jsonl")),
            "hash_algorithm": "sha256", "checksum": hashlib.sha256(samples_text.encode("utf-8")).hexdigest(),
            "total_rows": len(instances)}
    record_path = target.write_text((*folder, f"{file_id}.json"),
                                    json.dumps(record, indent=2, ensure_ascii=False, sort_keys=True))
    return [record_path, *written]


def _part(name: str) -> str:
    """A path component: no separators."""
    return name.replace("/", "_").replace("\\", "_") or "_"


def _result_id(cell: ExportCell, task: str, metric: str) -> str:
    return f"{cell.suite}/{task}/{metric}@step-{cell.step}"


def _result(cell: ExportCell, name: str, task: ExportTask, metric: str) -> dict:
    base, _, filter_name = metric.partition("@")
    score: dict = {"score": float(task.metrics[metric]),
                   "details": {"documents": str(len(task.samples)), "num_fewshot": str(task.num_fewshot)}}
    se = stderr_of(task, metric)
    if se is not None:
        aggregation = aggregation_of(task, metric)
        method = ("analytic" if aggregation in ("mean", "acc_all") else "bootstrap" if aggregation in BOOTSTRAPPED
                  else None)
        score["uncertainty"] = {"standard_error": {"value": se, **({"method": method} if method else {})},
                                "num_samples": len(task.samples)}
    higher = higher_is_better(task, metric)
    bounds = RANGES.get(base) or ((0, 1) if _binary([s.get("metrics", {}).get(base) for s in task.samples]) else None)
    details = {"higher_is_better": str(higher), "primary": str(metric == primary_metric(task)).lower(),
               "lm_eval_metric": base, "lm_eval_filter": filter_name or "none",
               **({} if bounds else {"bounds": "unknown"})}
    return {
        "evaluation_result_id": _result_id(cell, name, metric),
        "evaluation_name": f"{name}/{filter_name}" if filter_name else name,
        "source_data": {"dataset_name": name, "source_type": "other", "additional_details": {
            "lm_eval_task": name, "documents_evaluated": str(len(task.samples)),
            "documents_in_task": str(task.documents_original)}},
        "evaluation_timestamp": f"{cell.evaluated_at:.6f}",
        "metric_config": {
            "metric_id": GLOBAL_METRIC_IDS.get(base, f"{HARNESS}.{base}"), "metric_name": base,
            "evaluation_description": base + (f" (filter: {filter_name})" if filter_name else ""),
            "lower_is_better": higher is False,
            **({"metric_kind": KINDS[base]} if base in KINDS else {}),
            **({"score_type": "continuous", "min_score": bounds[0], "max_score": bounds[1]} if bounds else {}),
            **({"metric_unit": "proportion"} if bounds == (0, 1) else
               {"metric_unit": "bits_per_byte"} if base == "bits_per_byte" else {}),
            "additional_details": details},
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
                             "doc_id": str(sample["doc_id"]), "metric": metric},
            })
    return rows
