"""lm-evaluation-harness's own output files for one exported cell (``evald export --format lm-eval``).

Written as lm-eval's ``EvaluationTracker`` writes them for an ``--output_path`` directory, so its
tooling and anything that reads its outputs takes them::

    OUT/lm-eval/<suite>/step_<STEP>/<MODEL>/results_<DATE>.json
    OUT/lm-eval/<suite>/step_<STEP>/<MODEL>/samples_<TASK>_<DATE>.jsonl

``results`` (lm-eval's ``METRIC,FILTER`` keys), ``configs``, ``versions``, ``n-shot``,
``higher_is_better``, ``n-samples``, ``task_hashes`` and ``config``; ``task_hashes`` is lm-eval's own
(sha256 over each sample's ``doc_hash + prompt_hash + target_hash``, in document order), from the
hashes lm-eval computed while evaluating, so a stock ``lm_eval`` run of the task on the same
documents has the same value. DATE is the evaluation's time; ``evald`` in the results names the
checkpoint's step and snapshot digest, and ``model_args`` repeats them.

May import: the sinks' export_cells and export_target (every file goes through it).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from evald.sinks.export_cells import ExportCell, ExportTask, lm_eval_key
from evald.sinks.export_target import ExportTarget

HASH_KEYS = ("doc_hash", "prompt_hash", "target_hash")


def task_hash(samples: list[dict]) -> str | None:
    """lm-eval's task hash of these samples (in document order); None when a sample lacks its hashes
    (evaluated by an evald that did not keep them)."""
    if not all(all(isinstance(s.get(k), str) for k in HASH_KEYS) for s in samples):
        return None
    joined = "".join(s["doc_hash"] + s["prompt_hash"] + s["target_hash"] for s in samples)
    return hashlib.sha256(joined.encode("utf-8")).hexdigest()


def sanitized(name: str) -> str:
    """A model or task name as lm-eval puts it in a path."""
    return re.sub(r"[\"<>:/|\\?*\[\]]+", "__", name)


def write(cell: ExportCell, target: ExportTarget) -> list[Path]:
    folder = ("lm-eval", cell.suite, f"step_{cell.step}", sanitized(cell.model_id))
    date = cell.timestamp()
    written = []
    for name, task in sorted(cell.tasks.items()):
        written.append(target.write_text((*folder, f"samples_{name}_{date}.jsonl"), "".join(
            json.dumps(_sample(task, s), ensure_ascii=False) + "\n" for s in sorted(task.samples, key=lambda s: s["doc_id"]))))
    path = target.write_text((*folder, f"results_{date}.json"),
                             json.dumps(results(cell), indent=2, ensure_ascii=False, default=str))
    return [path, *written]


def results(cell: ExportCell) -> dict:
    tasks = sorted(cell.tasks.items())
    hashes = {name: task_hash(sorted(t.samples, key=lambda s: s["doc_id"])) for name, t in tasks}
    names = cell.names()
    return {
        "results": {name: {"alias": name, **{lm_eval_key(m): v for m, v in t.metrics.items()}} for name, t in tasks},
        "group_subtasks": {name: [] for name, _ in tasks},
        "configs": {name: dict(t.config) for name, t in tasks},
        "versions": {name: t.version for name, t in tasks},
        "n-shot": {name: t.num_fewshot for name, t in tasks},
        "higher_is_better": {name: dict(t.higher_is_better) for name, t in tasks},
        "n-samples": {name: {"original": t.documents_original, "effective": len(t.samples)} for name, t in tasks},
        "config": {"model": "evald", "model_args": ",".join(f"{k}={v}" for k, v in names.items()),
                   "batch_size": None, "limit": None, "bootstrap_iters": 1000},
        "task_hashes": {name: h for name, h in hashes.items() if h is not None},
        "lm_eval_version": cell.lm_eval_version,
        "model_source": "evald",
        "model_name": cell.model_id,
        "model_name_sanitized": sanitized(cell.model_id),
        "date": cell.evaluated_at,
        "evald": {**names, "step": cell.step, "weights_sha256": cell.weights_sha256},
    }


def _sample(task: ExportTask, sample: dict) -> dict:
    """One document as lm-eval's samples file has it: the document, target, responses, filter, each
    metric's value, and its three hashes."""
    out = {"doc_id": sample["doc_id"]}
    if sample["doc_id"] in task.docs:
        out["doc"] = task.docs[sample["doc_id"]]
    out.update({"target": sample.get("target"), "resps": [[r] for r in _listed(sample.get("resps"))],
                "filtered_resps": sample.get("resps"), "filter": "none",
                "metrics": sorted(sample.get("metrics", {}))})
    out.update({k: (v if not isinstance(v, list) else list(v)) for k, v in sample.get("metrics", {}).items()})
    out.update({k: sample[k] for k in HASH_KEYS if k in sample})
    return out


def _listed(value: object) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]
