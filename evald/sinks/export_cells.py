"""What ``evald export`` hands to each result format: one current suite cell of one checkpoint, whole.

A cell is exported with what names it (the run, the checkpoint's step, the snapshot digest
``weights_sha256`` of the provenance, the cell and suite identities) and, per lm-eval task, the
aggregates, every document's sample as evald kept it, and what lm-eval knows of the task (its
resolved config, version, few-shot count, metric directions, document counts). The writers are
``lm_eval_files.py``, ``every_eval_ever.py`` and ``hf_eval_results.py``.

May import: nothing of evald.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Mapping

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
