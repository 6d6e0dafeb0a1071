"""Per-sample benchmark results beside the ledger: one compressed JSONL per (step, suite, task).

Layout (in the run directory)::

    samples/SUITE/TASK/step_<STEP>.<IDENTITY12>.jsonl.gz   one JSON object per document, by doc_id:
        {"doc_id": int, "target": str, "resps": [...], "metrics": {"acc": 0/1 or float, ...}}
    samples/SUITE/TASK/step_<STEP>.<IDENTITY12>.json       the sidecar: the full suite identity,
        its sha256, the cell identity (suite + network), and the task's aggregated metrics
        (lm-eval's, with ``*_stderr``)

IDENTITY12 is the first 12 hex digits of the suite identity's sha256 (evald.pipeline.suites), so two
runs' files of the same suite identity compare document by document. Both files are written
atomically (temporary file, fsync, rename; the JSONL first, so a sidecar always has its samples)
and deterministically (gzip without a timestamp), so a crash and a re-evaluation write the same
bytes. If a step's file is rewritten under another cell identity (another model configuration,
same suite), the old pair is kept renamed ``*.superseded-<CELL12>``.

Size (measured, docs/performance.md): a 4-way multiple-choice document is about 185 bytes of JSON
(4 log-likelihoods with their greedy flags, the target, acc and acc_norm), 45 bytes gzipped; a
rolling (bits-per-byte) document holds its text as the target, about 530 bytes for the demo's
320-byte documents, 160 gzipped. Targets and generated texts are cut at
evald.pipeline.suites.SAMPLE_TEXT_LIMIT (4096) characters, so a document never exceeds ~9 KB.

``read_samples(run_dir, suite, task, step)`` returns ``(identity, samples)``; it is what
``evald compare`` reads.

May import: contracts.
"""

from __future__ import annotations

import gzip
import json
import os
import secrets
from pathlib import Path
from typing import Any, Mapping, Sequence

SAMPLES_DIR = "samples"


class SamplesNotFound(FileNotFoundError):
    """No per-sample file for that (suite, task, step), or not for the identity asked for."""


def samples_dir(run_dir: Path, suite: str, task: str) -> Path:
    return Path(run_dir) / SAMPLES_DIR / suite / task


def samples_paths(run_dir: Path, suite: str, task: str, step: int, identity_sha256: str) -> tuple[Path, Path]:
    stem = f"step_{int(step)}.{identity_sha256[:12]}"
    folder = samples_dir(run_dir, suite, task)
    return folder / f"{stem}.jsonl.gz", folder / f"{stem}.json"


def write_samples(run_dir: Path, *, suite: str, task: str, step: int, identity: Mapping[str, Any],
                  identity_sha256: str, cell_identity: str, metrics: Mapping[str, float],
                  samples: Sequence[Mapping[str, Any]]) -> Path:
    """Write one task's per-sample file and its sidecar, atomically; the JSONL path."""
    data, sidecar = samples_paths(run_dir, suite, task, step, identity_sha256)
    data.parent.mkdir(parents=True, exist_ok=True)
    if sidecar.exists():
        try:
            old = json.loads(sidecar.read_text()).get("cell_identity")
        except (OSError, ValueError):
            old = None
        if old and old != cell_identity:
            for path in (data, sidecar):
                if path.exists():
                    os.replace(path, path.with_name(f"{path.name}.superseded-{old[:12]}"))
    lines = "".join(json.dumps(dict(s), sort_keys=True, separators=(",", ":")) + "\n" for s in samples)
    _atomic(data, gzip.compress(lines.encode("utf-8"), compresslevel=6, mtime=0))
    head = {"suite": suite, "task": task, "step": int(step), "identity_sha256": identity_sha256,
            "cell_identity": cell_identity, "identity": dict(identity), "metrics": dict(metrics),
            "documents": len(samples)}
    _atomic(sidecar, json.dumps(head, sort_keys=True, indent=1).encode("utf-8"))
    return data


def read_samples(run_dir: Path, suite: str, task: str, step: int,
                 identity: str | None = None) -> tuple[dict[str, Any], list[dict]]:
    """``(sidecar, samples)`` of one (suite, task, step): the sidecar dict has ``identity`` (the full
    suite identity), ``identity_sha256``, ``metrics`` (aggregates with stderrs); samples are sorted by
    doc_id. ``identity`` (a sha256 or its first 12+ hex digits) picks among several suite identities;
    without it the most recently written one is returned. SamplesNotFound otherwise."""
    folder = samples_dir(run_dir, suite, task)
    found = sorted(folder.glob(f"step_{int(step)}.*.json"), key=lambda p: p.stat().st_mtime_ns)
    if identity is not None:
        found = [p for p in found if identity.startswith(p.stem.split(".")[1]) or
                 p.stem.split(".")[1].startswith(identity[:12])]
    if not found:
        raise SamplesNotFound(f"no per-sample results of suite {suite!r}, task {task!r}, step {step} in {folder}"
                              + (f" with identity {identity[:12]}" if identity else ""))
    sidecar_path = found[-1]
    sidecar = json.loads(sidecar_path.read_text())
    data_path = sidecar_path.with_name(sidecar_path.stem + ".jsonl.gz")
    with gzip.open(data_path, "rt", encoding="utf-8") as f:
        samples = [json.loads(line) for line in f if line.strip()]
    return sidecar, samples


def sample_steps(run_dir: Path, suite: str, task: str) -> list[int]:
    """The steps that have per-sample results for (suite, task)."""
    return sorted({int(p.name.split(".")[0][len("step_"):])
                   for p in samples_dir(run_dir, suite, task).glob("step_*.json")})


def _atomic(path: Path, payload: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{secrets.token_hex(4)}")
    try:
        with open(tmp, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    try:
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass
