"""Reading the per-sample outputs of a suite back: which exist, which identity is current, and
each document's metric values, validated and bounded (these files are input here).

The files, per (step, suite, task), written beside the run's other state::

    RUN_DIR/samples/SUITE/TASK/step_<STEP>.<IDENTITY12>.jsonl.gz   one JSON object per document:
        {"doc_id": int, "target": str, "resps": [...], "metrics": {"acc": 0 or 1, ...}}
    RUN_DIR/samples/SUITE/TASK/step_<STEP>.<IDENTITY12>.json       the sidecar:
        {"identity": {...}, "identity_hash": "<64 hex>", "metrics": {"acc": x, "acc_stderr": y, ...}}
        (the hash may be named "identity_sha256" instead)

``IDENTITY12`` is the first 12 hex digits of the suite identity's hash. One step may have
several identities (the suite or the tokenizer changed); the newest sidecar (by modification
time, then name) is the current one, the others are superseded. A per-document metric value is
a finite number, or a ``[loglikelihood, weight]`` pair (lm-eval's rolling-loglikelihood output).
Every bound below is checked while reading, and every error names the file (and line).

May import: decisions (the paired statistics for :func:`paired_se_of_monitor`).
"""

from __future__ import annotations

import gzip
import json
import math
import os
import re
import stat
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from evald.decisions import paired
from evald.decisions.monitor_targets import parse_suite_monitor

SAMPLES_DIR = "samples"
MAX_SIDECAR_BYTES = 1 << 20              # a sidecar: identity and aggregated metrics
MAX_SAMPLES_BYTES = 1 << 30              # one samples file, decompressed
MAX_LINE_BYTES = 16 << 20                # one document's line (generations can be long)
MAX_DOCUMENTS = 1_000_000                # documents in one samples file
MAX_METRICS = 64                         # metrics per document
MAX_DOC_ID = 2**53                       # a JSON integer every reader agrees on
_NAME = re.compile(r"step_(\d{1,19})\.([0-9a-f]{12})\.json")
_HASH = re.compile(r"[0-9a-f]{64}")


class SampleFileError(ValueError):
    """A per-sample file is missing, malformed or beyond its bounds; the message names it."""


@dataclass(frozen=True)
class SampleFile:
    """One (step, suite, task, identity): the samples file and its sidecar."""

    suite: str
    task: str
    step: int
    identity12: str
    sidecar: Path
    mtime_ns: int

    @property
    def samples(self) -> Path:
        return self.sidecar.with_name(f"step_{self.step}.{self.identity12}.jsonl.gz")


@dataclass(frozen=True)
class Sidecar:
    identity: dict
    identity_hash: str
    metrics: dict


@dataclass(frozen=True)
class TaskSamples:
    """One file's documents: ``doc_ids`` sorted, ``metrics[name][i]`` the value of document ``doc_ids[i]``."""

    file: SampleFile
    doc_ids: np.ndarray
    metrics: dict[str, np.ndarray]


def list_samples(run_dir: Path, *, suite: str | None = None, task: str | None = None,
                 step: int | None = None) -> list[SampleFile]:
    """Every sidecar under ``RUN_DIR/samples`` (filtered), newest last within each (suite, task, step)."""
    root = Path(run_dir) / SAMPLES_DIR
    found = []
    for suite_dir in _subdirs(root):
        if suite is not None and suite_dir.name != suite:
            continue
        for task_dir in _subdirs(suite_dir):
            if task is not None and task_dir.name != task:
                continue
            for entry in sorted(os.scandir(task_dir), key=lambda e: e.name):
                match = _NAME.fullmatch(entry.name)
                if not match or not entry.is_file(follow_symlinks=False):
                    continue
                at = int(match.group(1))
                if step is None or at == step:
                    found.append(SampleFile(suite_dir.name, task_dir.name, at, match.group(2), Path(entry.path),
                                            entry.stat(follow_symlinks=False).st_mtime_ns))
    return sorted(found, key=lambda f: (f.suite, f.task, f.step, f.mtime_ns, f.identity12))


def current(files: list[SampleFile]) -> dict[tuple[str, str, int], SampleFile]:
    """The current identity of each (suite, task, step): its newest sidecar."""
    newest: dict[tuple[str, str, int], SampleFile] = {}
    for f in files:  # sorted oldest first
        newest[(f.suite, f.task, f.step)] = f
    return newest


def _subdirs(path: Path) -> list[Path]:
    try:
        entries = sorted(os.scandir(path), key=lambda e: e.name)
    except FileNotFoundError:
        return []
    return [Path(e.path) for e in entries if e.is_dir(follow_symlinks=False)]


def _open_regular(path: Path, limit: int):
    """Open a regular file (not a link, FIFO or device) no larger than ``limit`` bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        raise SampleFileError(f"{path} does not exist") from None
    except OSError as exc:
        raise SampleFileError(f"{path} cannot be opened: {exc.strerror} (a symbolic link is not followed)") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise SampleFileError(f"{path} is not a regular file")
    if info.st_size > limit:
        os.close(fd)
        raise SampleFileError(f"{path} holds {info.st_size} bytes, more than the {limit} a per-sample file may")
    return os.fdopen(fd, "rb")


def read_sidecar(file: SampleFile) -> Sidecar:
    path = file.sidecar
    with _open_regular(path, MAX_SIDECAR_BYTES) as handle:
        raw = handle.read(MAX_SIDECAR_BYTES + 1)
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise SampleFileError(f"{path} is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise SampleFileError(f"{path}: a sidecar is a JSON object, got {type(data).__name__}")
    # "identity_hash" in the contract; "identity_sha256" as evald/ledger/samples.py (h17a-bench) writes it
    identity, metrics = data.get("identity"), data.get("metrics")
    digest = data.get("identity_hash", data.get("identity_sha256"))
    if not isinstance(identity, dict):
        raise SampleFileError(f"{path}: 'identity' must be an object, got {type(identity).__name__}")
    if not isinstance(digest, str) or not _HASH.fullmatch(digest):
        raise SampleFileError(f"{path}: 'identity_hash' must be 64 lowercase hex digits, got {digest!r:.80}")
    if not digest.startswith(file.identity12):
        raise SampleFileError(f"{path}: its name says identity {file.identity12}, its identity_hash is {digest[:12]}")
    if not isinstance(metrics, dict):
        raise SampleFileError(f"{path}: 'metrics' must be an object, got {type(metrics).__name__}")
    return Sidecar(identity, digest, metrics)


def read_samples(file: SampleFile) -> TaskSamples:
    """Every document of ``file``'s samples, validated; metrics every document has, as arrays."""
    path = file.samples
    ids: list[int] = []
    values: dict[str, list] = {}
    with _open_regular(path, MAX_SAMPLES_BYTES) as raw, gzip.GzipFile(fileobj=raw) as lines:
        total = 0
        for number in range(1, MAX_DOCUMENTS + 2):
            try:
                line = lines.readline(MAX_LINE_BYTES + 1)
            except (OSError, EOFError, zlib.error) as exc:
                raise SampleFileError(f"{path}: not a complete gzip file ({exc})") from None
            if not line:
                break
            total += len(line)
            if number > MAX_DOCUMENTS:
                raise SampleFileError(f"{path}: more than {MAX_DOCUMENTS} documents")
            if len(line) > MAX_LINE_BYTES:
                raise SampleFileError(f"{path} line {number}: longer than {MAX_LINE_BYTES} bytes")
            if total > MAX_SAMPLES_BYTES:
                raise SampleFileError(f"{path}: more than {MAX_SAMPLES_BYTES} bytes once decompressed")
            if not line.strip():
                continue
            doc_id, metrics = _document(path, number, line)
            ids.append(doc_id)
            for name, value in metrics.items():
                values.setdefault(name, []).append(value)
    if not ids:
        raise SampleFileError(f"{path}: no documents")
    order = np.argsort(np.asarray(ids, dtype=np.int64), kind="stable")
    doc_ids = np.asarray(ids, dtype=np.int64)[order]
    repeated = doc_ids[1:][doc_ids[1:] == doc_ids[:-1]]
    if repeated.size:
        raise SampleFileError(f"{path}: doc_id {int(repeated[0])} appears more than once")
    arrays = {}
    for name, column in values.items():
        if len(column) != len(ids):
            raise SampleFileError(f"{path}: metric {name!r} is on {len(column)} of {len(ids)} documents")
        shapes = {isinstance(v, list) for v in column}
        if len(shapes) > 1:
            raise SampleFileError(f"{path}: metric {name!r} is a number on some documents and a pair on others")
        arrays[name] = np.asarray(column, dtype=np.float64)[order]
    return TaskSamples(file, doc_ids, arrays)


def _document(path: Path, number: int, line: bytes) -> tuple[int, dict]:
    where = f"{path} line {number}"
    try:
        doc = json.loads(line)
    except (ValueError, UnicodeDecodeError) as exc:
        raise SampleFileError(f"{where}: not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise SampleFileError(f"{where}: a document is a JSON object, got {type(doc).__name__}")
    doc_id, metrics = doc.get("doc_id"), doc.get("metrics")
    if type(doc_id) is not int or not 0 <= doc_id <= MAX_DOC_ID:
        raise SampleFileError(f"{where}: 'doc_id' must be an integer in [0, 2**53], got {doc_id!r:.40}")
    if not isinstance(metrics, dict) or not metrics:
        raise SampleFileError(f"{where}: 'metrics' must be a non-empty object")
    if len(metrics) > MAX_METRICS:
        raise SampleFileError(f"{where}: {len(metrics)} metrics, more than {MAX_METRICS}")
    for name, value in metrics.items():
        if len(name) > 200:
            raise SampleFileError(f"{where}: a metric name longer than 200 characters")
        if not (_number(value) or (isinstance(value, list) and len(value) == 2 and all(map(_number, value)))):
            raise SampleFileError(f"{where}: metric {name!r} must be a finite number or a [loglikelihood, "
                                  f"weight] pair, got {json.dumps(value)[:60]}")
    return doc_id, metrics


def _number(value: object) -> bool:
    return type(value) in (int, float) and math.isfinite(value)


@dataclass(frozen=True)
class PairedSE:
    """The paired SE of the monitored metric's difference, or None and why the unpaired rule applies."""

    value: float | None
    reason: str


def paired_se_of_monitor(run_dir: Path, monitor: str, step: int, best_step: int | None) -> PairedSE:
    """The paired SE of ``monitor``'s difference between ``step`` and ``best_step``, from their current
    per-sample outputs. Its value is None, with the reason, when it cannot be had: not a suite metric,
    no best step yet, a file missing or malformed, the two steps' current identities differ, or they
    scored different documents. Never raises for a bad file: the caller then uses the unpaired rule."""
    target = parse_suite_monitor(monitor)
    if target is None:
        return PairedSE(None, f"{monitor} is not a suite metric (SUITE/TASK/METRIC)")
    if best_step is None or best_step == step:
        return PairedSE(None, "no earlier best step to pair with")
    try:
        newest = current(list_samples(run_dir, suite=target.suite, task=target.task))
    except OSError as exc:
        return PairedSE(None, f"the per-sample outputs under {Path(run_dir) / SAMPLES_DIR} cannot be listed: {exc}")
    here = newest.get((target.suite, target.task, step))
    best = newest.get((target.suite, target.task, best_step))
    if here is None or best is None:
        missing = step if here is None else best_step
        return PairedSE(None, f"step {missing} has no per-sample outputs for {target.suite}/{target.task}")
    if here.identity12 != best.identity12:
        return PairedSE(None, f"steps {best_step} and {step} were scored under different identities "
                              f"({best.identity12}, {here.identity12})")
    try:
        a, b = read_samples(best), read_samples(here)
    except SampleFileError as exc:
        return PairedSE(None, str(exc))
    if target.metric not in a.metrics or target.metric not in b.metrics:
        return PairedSE(None, f"the per-sample outputs of {target.suite}/{target.task} have no {target.metric!r}")
    if not np.array_equal(a.doc_ids, b.doc_ids):
        return PairedSE(None, f"steps {best_step} and {step} scored different documents")
    try:
        se = paired.paired_se(target.metric, a.metrics[target.metric], b.metrics[target.metric])
    except paired.PairedError as exc:
        return PairedSE(None, str(exc))
    return PairedSE(se, f"paired over {a.doc_ids.size} documents")
