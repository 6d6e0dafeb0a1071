"""Per-sample outputs of a suite, written by evald's own writer (evald.ledger.samples; the format:
docs/benchmarks.md) from per-document metric columns, for tests that read them back."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from evald.ledger.samples import samples_paths, write_samples


def identity_hash(identity: Mapping) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def write_task_samples(run_dir: Path, suite: str, task: str, step: int, identity: Mapping,
                       metrics: Mapping[str, Sequence], *, doc_ids: Iterable[int] | None = None,
                       aggregated: Mapping[str, float] | None = None, mtime_ns: int | None = None) -> Path:
    """One (step, suite, task): ``metrics[name][i]`` is document ``doc_ids[i]``'s value. Returns the sidecar."""
    digest = identity_hash(identity)
    columns = {name: list(values) for name, values in metrics.items()}
    count = len(next(iter(columns.values())))
    ids = list(range(count)) if doc_ids is None else list(doc_ids)
    documents = [{"doc_id": doc_id, "target": f"t{doc_id}", "resps": [[f"r{doc_id}"]],
                  "metrics": {name: values[i] for name, values in columns.items()}} for i, doc_id in enumerate(ids)]
    if aggregated is None:
        aggregated = {name: sum(v) / count for name, v in columns.items() if not isinstance(v[0], list)}
    write_samples(run_dir, suite=suite, task=task, step=step, identity=identity, identity_sha256=digest,
                  cell_identity="ce" * 32, metrics=aggregated, samples=documents)
    sidecar = samples_paths(run_dir, suite, task, step, digest)[1]
    if mtime_ns is not None:
        os.utime(sidecar, ns=(mtime_ns, mtime_ns))
    return sidecar


IDENTITY = {"lm_eval": "0.4.13", "tasks": {"hellaswag": "c0ffee" * 4, "arc_easy": "beef" * 6}, "num_fewshot": 0,
            "subset": {"seed": 1234, "size": 200}, "tokenizer": "ab" * 16}
