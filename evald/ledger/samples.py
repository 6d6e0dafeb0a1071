"""Per-sample benchmark results beside the ledger, one compressed JSONL and its sidecar per
(step, suite, task): the writer and the one reader of the format (docs/benchmarks.md, "Per-sample
results", is its description).

Layout (in the run directory)::

    samples/SUITE/TASK/step_<STEP>.<IDENTITY12>.jsonl.gz   one JSON object per document
    samples/SUITE/TASK/step_<STEP>.<IDENTITY12>.json       the sidecar: identity, hashes, aggregates

Writing: atomically (temporary file, fsync, rename; the JSONL first, so a sidecar always has its
samples) and deterministically (gzip without a timestamp), so a crash and a re-evaluation write the
same bytes; a step rewritten under another cell identity keeps the old pair renamed
``*.superseded-<CELL12>``. Strict JSON: a number that is not finite (none should arrive: a
non-finite log-likelihood fails the cell, evald.pipeline.suites.runner) is written as ``null`` and
its place named in the record's ``"nonfinite"`` list, never as a ``NaN``/``Infinity`` literal. Sizes
are measured in docs/performance.md.

Names: a suite or task name is one directory (:func:`plain_name`: no ``/``, no leading dot, no control
character...), and the identity hash 64 hex digits, checked where paths are built: a backfill fleet's
merge writes names and hashes read from cell files (evald.daemon.fleet_merge), and this is the last line.

Reading: the files are input (another run's, a copied folder, a damaged disk), so every read is
bounded and validated, and every error is a :class:`SampleFileError` naming the file (and line):
opened below the run directory by the one rule (evald.contracts.safe_open: no link anywhere below it,
no FIFO or device, no hard link); strict UTF-8 JSON (no ``NaN``/``Infinity``; no lone surrogate escape
``"\\ud800"``, which JSON's reader takes and no UTF-8 writer can write; metric values finite, integers
within 64 bits), nested at most ``MAX_DEPTH`` deep (measured before parsing, so 100,000 brackets cost no
recursion); a sidecar's identity hash is recomputed from its identity, and its step, suite and task must
be those of its name.

- :func:`list_samples` / :func:`current` / :func:`find_samples`: which files exist, which is current
  (the newest sidecar of a step)
- :func:`read_sidecar`: the identity, its hash, the cell identity and the aggregates
- :func:`read_documents`: every document, whole, sorted by doc_id
- :func:`read_samples`: every document's metric values as arrays (``evald compare``, the paired SE)
- :func:`read_step`: ``(sidecar, documents)`` of one (suite, task, step), the current identity or one asked for

May import: contracts.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import math
import os
import re
import stat
import unicodedata
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from evald.contracts.layout import atomic_write_bytes
from evald.contracts.safe_open import UnsafeFile, open_beneath, open_dir_beneath

SAMPLES_DIR = "samples"
MAX_SIDECAR_BYTES = 1 << 20              # a sidecar: identity and aggregated metrics
MAX_SAMPLES_BYTES = 1 << 30              # one samples file, compressed or not
MAX_LINE_BYTES = 16 << 20                # one document's line (generations can be long)
MAX_DOCUMENTS = 1_000_000                # documents in one samples file
MAX_METRICS = 64                         # metrics per document
MAX_DOC_ID = 2**53                       # a JSON integer every reader agrees on
MAX_DEPTH = 64                           # nesting of arrays and objects in one line or sidecar (evald writes <= 6)
MAX_SIDECAR_METRICS = 4 * MAX_METRICS    # aggregates in a sidecar (each metric, its stderr, other filters)
MAX_INT = 2**63 - 1                      # a metric's integer beyond 64 bits is refused (no float holds 10**400)
NONFINITE = "nonfinite"                  # a record's list of the places written as null for a non-finite number
_NAME = re.compile(r"step_([0-9]{1,19})\.([0-9a-f]{12})\.json")   # ASCII digits: int() reads any script's
_HASH = re.compile(r"[0-9a-f]{64}")
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)   # a JSON string literal, escapes included
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")   # \ud800-\udfff: half of a pair (emoji), or alone
_SURROGATE = re.compile("[\ud800-\udfff]")                             # one left alone once parsed
MAX_NAME_CHARS = 200                     # a suite's or task's name: one directory of the path
_NOT_IN_NAMES = frozenset(("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"))   # controls, format, surrogates, unassigned


class SampleFileError(ValueError):
    """A per-sample file is missing, malformed or beyond its bounds; the message names it."""


class SamplesNotFound(SampleFileError):
    """No per-sample file for that (suite, task, step), or not for the identity asked for."""


class UnsafeSampleName(SampleFileError):
    """A suite or task name that is not a plain name: it would not name one directory below samples/."""


@dataclass(frozen=True)
class SampleFile:
    """One (step, suite, task, identity): the samples file and its sidecar."""

    suite: str
    task: str
    step: int
    identity12: str
    sidecar: Path
    mtime_ns: int
    run_dir: Path          # the root its reads stay below: no link under it is followed

    @property
    def samples(self) -> Path:
        return self.sidecar.with_name(f"step_{self.step}.{self.identity12}.jsonl.gz")

    def below_run_dir(self, path: Path) -> str:
        """``path`` (its sidecar or samples file) relative to the run directory."""
        return f"{SAMPLES_DIR}/{self.suite}/{self.task}/{path.name}"


@dataclass(frozen=True)
class Sidecar:
    identity: dict
    identity_hash: str
    metrics: dict
    cell_identity: str | None = None


@dataclass(frozen=True)
class TaskSamples:
    """One file's documents: ``doc_ids`` sorted, ``metrics[name][i]`` the value of document ``doc_ids[i]``."""

    file: SampleFile | None   # None: from memory (samples_of), the file not read
    doc_ids: np.ndarray
    metrics: dict[str, np.ndarray]


# -- writing ------------------------------------------------------------------------------------------

def plain_name(what: str, name: object) -> str:
    """``name`` when it can name one directory below ``samples/``: a string of 1 to 200 characters, no
    ``/`` or ``\\``, no leading dot (so neither ``.`` nor ``..``), no leading or trailing space, no control,
    format, surrogate or unassigned character (NUL, newlines, bidi overrides). UnsafeSampleName otherwise:
    names reach this from lm-eval's tasks and from a backfill fleet's cell files (evald.daemon.fleet_merge)."""
    if not isinstance(name, str):
        raise UnsafeSampleName(f"a {what} name must be a string, got {type(name).__name__}")
    why = ("empty" if not name else f"longer than {MAX_NAME_CHARS} characters" if len(name) > MAX_NAME_CHARS
           else "holding a path separator" if "/" in name or "\\" in name
           else "starting with a dot" if name.startswith(".")
           else "starting or ending with a space" if name != name.strip()
           else "holding a control, format, surrogate or unassigned character"
           if any(unicodedata.category(c) in _NOT_IN_NAMES for c in name) else None)
    if why:
        raise UnsafeSampleName(f"the {what} name {json.dumps(name)[:MAX_NAME_CHARS + 40]} is not a plain name "
                               f"({why}): per-sample files go to RUN_DIR/{SAMPLES_DIR}/SUITE/TASK/, one directory "
                               f"per name, so a name may not leave or nest in that directory")
    return name


def samples_dir(run_dir: Path, suite: str, task: str) -> Path:
    """``RUN_DIR/samples/SUITE/TASK``; UnsafeSampleName when a name is not plain (:func:`plain_name`)."""
    return Path(run_dir) / SAMPLES_DIR / plain_name("suite", suite) / plain_name("task", task)


def samples_paths(run_dir: Path, suite: str, task: str, step: int, identity_sha256: str) -> tuple[Path, Path]:
    stem = f"step_{int(step)}.{identity_sha256[:12]}"
    folder = samples_dir(run_dir, suite, task)
    return folder / f"{stem}.jsonl.gz", folder / f"{stem}.json"


def write_samples(run_dir: Path, *, suite: str, task: str, step: int, identity: Mapping[str, Any],
                  identity_sha256: str, cell_identity: str, metrics: Mapping[str, float],
                  samples: Sequence[Mapping[str, Any]]) -> Path:
    """Write one task's per-sample file and its sidecar, atomically; the JSONL path. UnsafeSampleName for a
    suite or task name that is not a plain name, before anything is written."""
    if not isinstance(identity_sha256, str) or not _HASH.fullmatch(identity_sha256):
        raise SampleFileError(f"identity_sha256 must be 64 lowercase hex digits, got {identity_sha256!r:.80}")
    data, sidecar = samples_paths(run_dir, suite, task, step, identity_sha256)
    _make_dirs(Path(run_dir), (SAMPLES_DIR, suite, task))
    if sidecar.exists():
        try:
            old = read_sidecar(SampleFile(suite, task, int(step), identity_sha256[:12], sidecar, 0,
                                          Path(run_dir))).cell_identity
        except (SampleFileError, OSError):
            old = None
        if old and old != cell_identity:
            for path in (data, sidecar):
                if path.exists():
                    os.replace(path, path.with_name(f"{path.name}.superseded-{old[-12:]}"))  # the cell's own tail
    lines = "".join(json.dumps(_strict_record(s), sort_keys=True, separators=(",", ":"), allow_nan=False) + "\n"
                    for s in samples)
    atomic_write_bytes(data, gzip.compress(lines.encode("utf-8"), compresslevel=6, mtime=0))
    head = {"suite": suite, "task": task, "step": int(step), "identity_sha256": identity_sha256,
            "cell_identity": cell_identity, "identity": dict(identity), "metrics": dict(metrics),
            "documents": len(samples)}
    atomic_write_bytes(sidecar, json.dumps(_strict_record(head), sort_keys=True, indent=1, allow_nan=False).encode("utf-8"))
    return data


def _make_dirs(run_dir: Path, parts: tuple[str, ...]) -> None:
    """``run_dir/parts...``, each directory created where it is missing, none of them a link (a link there
    would carry the files out of the run directory)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    for depth in range(1, len(parts) + 1):
        relative = "/".join(parts[:depth])
        try:
            try:
                os.close(open_dir_beneath(run_dir, relative))
            except FileNotFoundError:       # its parent was just opened without a link on the way
                with contextlib.suppress(FileExistsError):
                    os.mkdir(run_dir / relative)
                os.close(open_dir_beneath(run_dir, relative))
        except UnsafeFile as exc:
            raise SampleFileError(f"per-sample files of {parts[1]}/{parts[2]} are not written: {exc}") from None


def identity_digest(identity: Mapping[str, Any]) -> str:
    """The sha256 of an identity in its canonical JSON (sorted keys, no spaces): what the suite runner
    hashes (evald.pipeline.suites.runner) and what a sidecar's ``identity_sha256`` must equal."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _strict_record(record: Mapping[str, Any]) -> dict:
    """``record`` with every non-finite float replaced by None, those places listed under ``"nonfinite"``
    (``"metrics.ppl"``, ``"resps.0.0"``), so the line is strict JSON and says what it lost."""
    places: list[str] = []
    out = {key: _finite_or_none(value, str(key), places) for key, value in record.items()}
    if places:
        out[NONFINITE] = sorted(places)
    return out


def _finite_or_none(value: Any, place: str, places: list[str]) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        places.append(place)
        return None
    if isinstance(value, Mapping):
        return {k: _finite_or_none(v, f"{place}.{k}", places) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_or_none(v, f"{place}.{i}", places) for i, v in enumerate(value)]
    return value


# -- finding ------------------------------------------------------------------------------------------

def list_samples(run_dir: Path, *, suite: str | None = None, task: str | None = None,
                 step: int | None = None) -> list[SampleFile]:
    """Every sidecar under ``RUN_DIR/samples`` (filtered), newest last within each (suite, task, step). Listed
    below the run directory without following any link (evald.contracts.safe_open); a directory whose
    name is not plain (:func:`plain_name`) is no suite's or task's and is passed over. SampleFileError when
    ``samples`` or a directory in it is a link or no directory."""
    run_dir = Path(run_dir)
    found = []
    for suite_name, _ in _entries(run_dir, SAMPLES_DIR, directories=True):
        if suite is not None and suite_name != suite:
            continue
        for task_name, _ in _entries(run_dir, f"{SAMPLES_DIR}/{suite_name}", directories=True):
            if task is not None and task_name != task:
                continue
            folder = run_dir / SAMPLES_DIR / suite_name / task_name
            for name, info in _entries(run_dir, f"{SAMPLES_DIR}/{suite_name}/{task_name}", directories=False):
                match = _NAME.fullmatch(name)
                if not match:
                    continue
                at = int(match.group(1))
                if step is None or at == step:
                    found.append(SampleFile(suite_name, task_name, at, match.group(2), folder / name,
                                            info.st_mtime_ns, run_dir))
    return sorted(found, key=lambda f: (f.suite, f.task, f.step, f.mtime_ns, f.identity12))


def current(files: list[SampleFile]) -> dict[tuple[str, str, int], SampleFile]:
    """The current identity of each (suite, task, step): its newest sidecar."""
    newest: dict[tuple[str, str, int], SampleFile] = {}
    for f in files:  # sorted oldest first
        newest[(f.suite, f.task, f.step)] = f
    return newest


def find_samples(run_dir: Path, suite: str, task: str, step: int, identity: str | None = None) -> SampleFile:
    """The file of (suite, task, step): under ``identity`` (its hash, or a prefix of it), else the current
    one. SamplesNotFound when there is none."""
    found = list_samples(run_dir, suite=suite, task=task, step=int(step))
    if identity is not None:
        found = [f for f in found if f.identity12.startswith(identity.lower()[:12])]
    if not found:
        raise SamplesNotFound(f"no per-sample results of suite {suite!r}, task {task!r}, step {step} in "
                              f"{samples_dir(run_dir, suite, task)}"
                              + (f" with identity {identity[:12]}" if identity else ""))
    return found[-1]


def _entries(run_dir: Path, relative: str, *, directories: bool) -> list[tuple[str, os.stat_result]]:
    """The sub-directories with plain names (``directories``), else the regular files, of ``run_dir/relative``
    with their ``lstat``, by name; none when it does not exist."""
    try:
        fd = open_dir_beneath(run_dir, relative)
    except FileNotFoundError:
        return []
    except (UnsafeFile, OSError) as exc:
        raise SampleFileError(f"{Path(run_dir) / relative} cannot be listed: {exc}") from None
    out = []
    try:
        with os.scandir(fd) as entries:
            for entry in entries:
                try:
                    info = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue            # removed while listed
                if directories and stat.S_ISDIR(info.st_mode):
                    try:
                        out.append((plain_name("directory", entry.name), info))
                    except UnsafeSampleName:
                        continue
                elif not directories and stat.S_ISREG(info.st_mode):
                    out.append((entry.name, info))
    finally:
        os.close(fd)
    return sorted(out, key=lambda e: e[0])


# -- reading ------------------------------------------------------------------------------------------

def _open(file: SampleFile, path: Path, limit: int) -> Any:
    """``path`` (``file``'s sidecar or samples) opened below its run directory by the one rule
    (evald.contracts.safe_open: no link anywhere below the run directory, no FIFO or device, one link, at
    most ``limit`` bytes), as a binary file object; SampleFileError naming it otherwise."""
    try:
        opened = open_beneath(file.run_dir, file.below_run_dir(path), limit)
    except FileNotFoundError:
        raise SampleFileError(f"{path} does not exist") from None
    except UnsafeFile as exc:   # it names the file and what it is
        raise SampleFileError(f"{exc} (a symbolic link is not followed below the run directory {file.run_dir}); "
                              f"not read") from None
    except OSError as exc:
        raise SampleFileError(f"{path} cannot be opened: {exc.strerror or exc}") from None
    return os.fdopen(opened.fd, "rb")       # the file object owns the descriptor from here


def read_sidecar(file: SampleFile) -> Sidecar:
    """The sidecar of ``file``, validated: its fields' types, its metrics finite numbers (or null where the
    writer flagged a non-finite one), its step, suite and task those of its name, its identity_sha256 the
    hash of its identity."""
    path = file.sidecar
    with _open(file, path, MAX_SIDECAR_BYTES) as handle:
        data = _json_object(str(path), handle.read(MAX_SIDECAR_BYTES + 1), "a sidecar")
    # written as "identity_sha256"; "identity_hash" (the name evald compare prints) is read too
    identity, metrics, cell = data.get("identity"), data.get("metrics"), data.get("cell_identity")
    digest = data.get("identity_sha256", data.get("identity_hash"))
    if not isinstance(identity, dict):
        raise SampleFileError(f"{path}: 'identity' must be an object, got {type(identity).__name__}")
    if not isinstance(digest, str) or not _HASH.fullmatch(digest):
        raise SampleFileError(f"{path}: 'identity_sha256' must be 64 lowercase hex digits, got {digest!r:.80}")
    if not digest.startswith(file.identity12):
        raise SampleFileError(f"{path}: its name says identity {file.identity12}, its identity_sha256 is "
                              f"{digest[:12]}")
    if not isinstance(metrics, dict):
        raise SampleFileError(f"{path}: 'metrics' must be an object, got {type(metrics).__name__}")
    if cell is not None and not isinstance(cell, str):
        raise SampleFileError(f"{path}: 'cell_identity' must be a string, got {type(cell).__name__}")
    if len(metrics) > MAX_SIDECAR_METRICS:
        raise SampleFileError(f"{path}: {len(metrics)} sidecar metrics, more than {MAX_SIDECAR_METRICS}")
    for name, value in metrics.items():
        if len(name) > 200:
            raise SampleFileError(f"{path}: a sidecar metric name longer than 200 characters")
        if not (_number(value) or value is None):
            raise SampleFileError(f"{path}: sidecar metric {name!r} must be a finite number (or null where the writer "
                                  f"flagged a non-finite one), got {json.dumps(value)[:60]}")
    for field, named in (("step", file.step), ("suite", file.suite), ("task", file.task)):
        own = data.get(field, _MISSING)
        if own is _MISSING or type(own) is not type(named) or own != named:
            stated = "missing" if own is _MISSING else json.dumps(own)[:60]
            raise SampleFileError(f"{path}: its {field} is {stated}, but its name says {named} (samples/SUITE/TASK/"
                                  f"step_STEP...): a sidecar copied or renamed from another cell is not this one")
    recomputed = identity_digest(identity)
    if recomputed != digest:
        raise SampleFileError(f"{path}: its identity hashes to {recomputed[:12]}, not the identity_sha256 it states "
                              f"({digest[:12]}): the identity was edited or damaged after it was written; its "
                              f"results cannot be compared")
    return Sidecar(identity, digest, metrics, cell)


_MISSING = object()


def _lines(file: SampleFile) -> Iterator[tuple[str, dict]]:
    """``(where, document)`` of each non-blank line of ``file``'s samples: a JSON object with an integer
    doc_id and a metrics object, within the bounds."""
    path = file.samples
    with _open(file, path, MAX_SAMPLES_BYTES) as raw, gzip.GzipFile(fileobj=raw) as lines:
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
            where = f"{path} line {number}"
            yield where, _document(where, line)


class _NotStrict(ValueError):
    """A NaN/Infinity literal: Python's json reads it, JSON has no such value, and evald never writes one."""


def _refuse_constant(name: str) -> Any:
    raise _NotStrict(f"{name} is not a JSON value (evald writes a non-finite number as null, named in "
                     f"{NONFINITE!r})")


def nesting_depth(text: str) -> int:
    """How deeply arrays and objects nest in ``text`` (brackets inside strings do not count), without
    parsing it: json's decoder recurses once per level, and 100,000 levels exhaust the stack."""
    brackets = _NOT_BRACKET.sub("", _JSON_STRING.sub("", text))
    if not brackets:
        return 0
    codes = np.frombuffer(brackets.encode("ascii"), dtype=np.uint8)
    steps = np.where((codes == ord("[")) | (codes == ord("{")), 1, -1)
    return int(np.cumsum(steps).max())


def _json_object(where: str, raw: bytes, what: str) -> dict:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SampleFileError(f"{where}: not UTF-8 ({exc})") from None
    openings = text.count("[") + text.count("{")        # the common line has too few to nest deeper: no scan
    depth = nesting_depth(text) if openings > MAX_DEPTH else 0
    if depth > MAX_DEPTH:
        raise SampleFileError(f"{where}: nested more than {MAX_DEPTH} levels deep ({depth}); evald writes at most "
                              f"a few levels")
    try:
        # only the constants get a hook: a parse_int/parse_float hook would leave json's C fast path (5x slower);
        # numbers are bounded where they are used (_number: finite, integers within 64 bits)
        data = json.loads(text, parse_constant=_refuse_constant)
    except _NotStrict as exc:
        raise SampleFileError(f"{where}: not strict JSON: {exc}") from None
    except (ValueError, RecursionError) as exc:
        raise SampleFileError(f"{where}: not JSON ({str(exc)[:200]})") from None
    if not isinstance(data, dict):
        raise SampleFileError(f"{where}: {what} is a JSON object, got {type(data).__name__}")
    # the common line has no surrogate escape at all (one with emoji has pairs): only then is it encoded
    if "\\u" in text and _SURROGATE_ESCAPE.search(text) and not _utf8_encodable(data):
        place = (_lone_surrogate(data) or "a string")[:200]
        raise SampleFileError(f"{where}: {place} holds a lone surrogate escape (\\ud800-\\udfff without its pair): "
                              f"JSON can escape it, but it is no Unicode character and no UTF-8 file can hold it, "
                              f"so it is not strict UTF-8 JSON")
    return data


def _utf8_encodable(data: dict) -> bool:
    """Whether every string of ``data`` (keys too) is Unicode text: an escaped pair parses to one character,
    a lone half stays a surrogate, which UTF-8 cannot encode. (A scan of the raw text cannot tell: ``\\\\``
    before ``ud800`` is an escaped backslash, not an escape.)"""
    try:
        json.dumps(data, ensure_ascii=False, check_circular=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _lone_surrogate(data: dict) -> str | None:
    """Where a string (a key or a value) holding a lone surrogate is, in words; None if none does.
    Iterative: the nesting is already bounded, but a walk needs no recursion."""
    stack: list[tuple[str, Any]] = [("", data)]
    while stack:
        place, value = stack.pop()
        if isinstance(value, str):
            if _SURROGATE.search(value):
                return f"the string at {place or 'the top'}"
        elif isinstance(value, dict):
            for key, item in value.items():
                if _SURROGATE.search(key):
                    return f"a key {'in ' + place if place else 'at the top'}"
                stack.append((f"{place}.{key}" if place else key, item))
        elif isinstance(value, list):
            stack.extend((f"{place}.{i}", item) for i, item in enumerate(value))
    return None


def _document(where: str, line: bytes) -> dict:
    doc = _json_object(where, line, "a document")
    doc_id, metrics = doc.get("doc_id"), doc.get("metrics")
    if type(doc_id) is not int or not 0 <= doc_id <= MAX_DOC_ID:
        raise SampleFileError(f"{where}: 'doc_id' must be an integer in [0, 2**53], got {doc_id!r:.40}")
    if not isinstance(metrics, dict):
        raise SampleFileError(f"{where}: 'metrics' must be an object, got {type(metrics).__name__}")
    if len(metrics) > MAX_METRICS:
        raise SampleFileError(f"{where}: {len(metrics)} metrics, more than {MAX_METRICS}")
    if any(len(name) > 200 for name in metrics):
        raise SampleFileError(f"{where}: a metric name longer than 200 characters")
    return doc


def read_documents(file: SampleFile) -> list[dict]:
    """Every document of ``file``'s samples, whole (target, resps, metrics as written), sorted by doc_id."""
    documents = sorted((doc for _, doc in _lines(file)), key=lambda doc: doc["doc_id"])
    _once_each(file.samples, np.asarray([doc["doc_id"] for doc in documents], dtype=np.int64))
    return documents


def read_samples(file: SampleFile) -> TaskSamples:
    """Every document's metric values, as arrays: each value a finite number or a ``[loglikelihood, weight]``
    pair, each metric on every document."""
    return _task_samples(file, file.samples, _lines(file))


def samples_of(records: Sequence[Mapping[str, Any]], where: Path) -> TaskSamples:
    """What ``read_samples`` gives for the file ``write_samples`` makes of ``records`` (at ``where``), from
    memory: each record in the same strict JSON form, with the same checks, and no file read."""
    documents = ((f"{where} document {i}", json.dumps(_strict_record(r), allow_nan=False).encode("utf-8"))
                 for i, r in enumerate(records, 1))
    return _task_samples(None, where, ((place, _document(place, line)) for place, line in documents))


def _task_samples(file: SampleFile | None, path: Path, documents: Iterator[tuple[str, dict]]) -> TaskSamples:
    ids: list[int] = []
    values: dict[str, list] = {}
    for where, doc in documents:
        metrics = doc["metrics"]
        if not metrics:
            raise SampleFileError(f"{where}: 'metrics' must be a non-empty object")
        for name, value in metrics.items():
            if not (_number(value) or (isinstance(value, list) and len(value) == 2 and all(map(_number, value)))):
                raise SampleFileError(f"{where}: metric {name!r} must be a finite number or a [loglikelihood, "
                                      f"weight] pair, got {json.dumps(value)[:60]}")
            values.setdefault(name, []).append(value)
        ids.append(doc["doc_id"])
    if not ids:
        raise SampleFileError(f"{path}: no documents")
    order = np.argsort(np.asarray(ids, dtype=np.int64), kind="stable")
    doc_ids = np.asarray(ids, dtype=np.int64)[order]
    _once_each(path, doc_ids)
    arrays = {}
    for name, column in values.items():
        if len(column) != len(ids):
            raise SampleFileError(f"{path}: metric {name!r} is on {len(column)} of {len(ids)} documents")
        shapes = {isinstance(v, list) for v in column}
        if len(shapes) > 1:
            raise SampleFileError(f"{path}: metric {name!r} is a number on some documents and a pair on others")
        arrays[name] = np.asarray(column, dtype=np.float64)[order]
    return TaskSamples(file, doc_ids, arrays)


def _once_each(path: Path, doc_ids: np.ndarray) -> None:
    """``doc_ids`` (sorted) names each document once."""
    repeated = doc_ids[1:][doc_ids[1:] == doc_ids[:-1]]
    if repeated.size:
        raise SampleFileError(f"{path}: doc_id {int(repeated[0])} appears more than once")


def _number(value: object) -> bool:
    """A finite float, or an integer within 64 bits (10**400 is a JSON integer no float holds)."""
    if type(value) is int:
        return -MAX_INT <= value <= MAX_INT
    return type(value) is float and math.isfinite(value)


def read_step(run_dir: Path, suite: str, task: str, step: int,
              identity: str | None = None) -> tuple[Sidecar, list[dict]]:
    """``(sidecar, documents)`` of one (suite, task, step), under ``identity`` (a prefix of its hash) or
    else the current one; SamplesNotFound when there is none, SampleFileError when it is malformed."""
    file = find_samples(run_dir, suite, task, step, identity)
    return read_sidecar(file), read_documents(file)
