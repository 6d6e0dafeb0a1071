"""What ``evald export`` hands to each result format: one current suite cell of one checkpoint, whole.

A cell is exported with what names it (the run, the checkpoint's step, the snapshot digest
``weights_sha256`` of the provenance, the cell and suite identities) and, per lm-eval task, the
aggregates, every document's sample as evald kept it, and what lm-eval knows of the task (its
resolved config, version, few-shot count, metric directions, document counts). The writers are
``lm_eval_files.py``, ``every_eval_ever.py`` and ``hf_eval_results.py``.

Which metric is a task's headline, the one a format with room for a single number per task gets
(Hugging Face's rows): ``primary_metric``. Perplexities (lm-eval's ``perplexity``, ``word_perplexity``,
``byte_perplexity``) never are: ``exp`` of a mean negative log-likelihood, unbounded above, they reach
1e10 and more on a small or young model (the demo's step 400: a word perplexity of 4.1e10), a number
that says less than the ``bits_per_byte`` lm-eval reports beside them, which is the headline of a
rolling log-likelihood task.

May import: nothing of evald.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

STDERR_SUFFIX = "_stderr"


@dataclass(frozen=True)
class ExportTask:
    name: str
    metrics: Mapping[str, float]           # evald's names: "acc", "acc_stderr", "acc@filter"
    samples: list[dict]                    # evald's per-sample records (doc_id, target, resps, metrics, hashes)
    config: Mapping[str, Any]              # lm-eval's resolved task config (dump_config), few-shot applied
    version: Any
    num_fewshot: int
    higher_is_better: Mapping[str, bool | None]
    documents_original: int                # the task's evaluation documents
    docs: Mapping[int, Any] = field(default_factory=dict)   # doc_id -> the document, as lm-eval loads it


@dataclass(frozen=True)
class ExportCell:
    run_name: str
    run_id: str | None
    model_name: str
    suite: str
    step: int
    weights_sha256: str | None            # the snapshot digest (evald.pipeline.swap.provenance)
    cell_identity: str
    suite_identity_sha256: str
    lm_eval_version: str
    evald_version: str
    evaluated_at: float
    tasks: Mapping[str, ExportTask]

    @property
    def model_id(self) -> str:
        """The checkpoint as a model: the run's model at this step."""
        return f"{self.model_name}@step-{self.step}"

    def timestamp(self) -> str:
        """lm-eval's file-name date (``%Y-%m-%dT%H-%M-%S.%f``) of the evaluation, in UTC."""
        seconds = int(self.evaluated_at)
        micro = int(round((self.evaluated_at - seconds) * 1e6)) % 1_000_000
        return time.strftime("%Y-%m-%dT%H-%M-%S", time.gmtime(seconds)) + f".{micro:06d}"

    def names(self) -> dict[str, str]:
        """What names the checkpoint, as strings (every format's free-form details)."""
        return {"evald_run": self.run_name, "evald_run_id": self.run_id or "", "step": str(self.step),
                "weights_sha256": self.weights_sha256 or "unknown", "cell_identity": self.cell_identity,
                "suite": self.suite, "suite_identity_sha256": self.suite_identity_sha256,
                "evald_version": self.evald_version}


def lm_eval_key(metric: str) -> str:
    """evald's ``acc`` / ``acc@filter`` as lm-eval's ``acc,none`` / ``acc,filter``."""
    name, _, filt = metric.partition("@")
    return f"{name},{filt or 'none'}"


def scored_metrics(task: ExportTask) -> list[str]:
    """The task's metrics, without their standard errors."""
    return [m for m in task.metrics if not m.split("@")[0].endswith(STDERR_SUFFIX)]


def is_perplexity(metric: str) -> bool:
    """lm-eval's ``perplexity``, ``word_perplexity`` or ``byte_perplexity`` (under any filter)."""
    return metric.partition("@")[0].endswith("perplexity")


def evald_metric(metric: str, filter_name: str | None) -> str:
    """lm-eval's metric under a filter as evald names it: ``acc`` (no filter, lm-eval's ``none``), ``acc@strict``."""
    return metric if filter_name in (None, "none") else f"{metric}@{filter_name}"


def primary_metric(task: ExportTask) -> str | None:
    """The task's headline metric (evald's name), with a value: the first metric its lm-eval config lists
    (``metric_list``: the task author's order) under its first filter (``filter_list``; lm-eval's
    ``none`` without one), then the same metric's other filters, then the next metric; then the metrics
    lm-eval reports directions for, then any. Never a perplexity; None when the task has nothing else."""
    config = task.config
    declared = [m.get("metric") for m in config.get("metric_list") or () if isinstance(m, Mapping)]
    filters = [f.get("name") for f in config.get("filter_list") or () if isinstance(f, Mapping)]
    filters = [f for f in filters if isinstance(f, str)] or [None]
    candidates = [evald_metric(m, f) for m in declared if isinstance(m, str) for f in filters]
    candidates += [*task.higher_is_better, *scored_metrics(task)]
    return next((m for m in candidates if m in task.metrics and not is_perplexity(m)
                 and not m.partition("@")[0].endswith(STDERR_SUFFIX)), None)


def higher_is_better(task: ExportTask, metric: str) -> bool | None:
    """The metric's direction as lm-eval's task states it; for a perplexity or bits per byte that it does
    not state, lower (by definition); else None (not known)."""
    base = metric.partition("@")[0]
    stated = task.higher_is_better.get(base)
    if isinstance(stated, bool):
        return stated
    return False if is_perplexity(base) or base == "bits_per_byte" else None


def aggregation_of(task: ExportTask, metric: str) -> str | None:
    """The aggregation the task's config names for the metric (``mean``, ``perplexity``...), if it names one."""
    base = metric.partition("@")[0]
    found = [m.get("aggregation") for m in task.config.get("metric_list") or ()
             if isinstance(m, Mapping) and m.get("metric") == base]
    return found[0] if found and isinstance(found[0], str) else None


def stderr_of(task: ExportTask, metric: str) -> float | None:
    name, _, filt = metric.partition("@")
    value = task.metrics.get(f"{name}{STDERR_SUFFIX}" + (f"@{filt}" if filt else ""))
    return None if value is None or value != value else float(value)


def stable_uuid4(*parts: str) -> str:
    """A version-4-shaped UUID derived from ``parts``: the same cell always gets the same file name."""
    raw = bytearray(hashlib.sha256("\0".join(parts).encode()).digest()[:16])
    raw[6] = (raw[6] & 0x0F) | 0x40
    raw[8] = (raw[8] & 0x3F) | 0x80
    return str(uuid.UUID(bytes=bytes(raw)))
