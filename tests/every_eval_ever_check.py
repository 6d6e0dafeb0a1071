"""Is a folder of Every Eval Ever files a valid 0.3.0 contribution? What the package's validator
(``every_eval_ever.validator``, which cannot be installed beside this project: tests/data/every_eval_ever/
SOURCE.md) checks, stated here in our own words and applied to what ``evald export`` wrote:

* each record and each instance row against the package's own JSON schemas (vendored unchanged);
* and one rule of ours, which the validator leaves to the writer: each declares the ``schema_version``
  those schemas are (the datastore records it as the file's version; a 0.3.0 file saying 0.2.3 misleads);
* paths: ``data/<collection>/<developer>/<model>/<UUID4>.json`` and ``<UUID4>_samples.jsonl``;
* the samples companion: a record's ``detailed_evaluation_results.file_path`` is exactly its sibling
  ``<same UUID>_samples.jsonl``, format ``jsonl``; that file exists, has at least one row, as many as
  ``total_rows`` says, the ``checksum`` its sha256, every row the record's ``evaluation_id`` and
  ``model_info.id``; a samples file has a record pointing at it;
* scores: finite; a ``continuous`` metric has both bounds, and its score lies within them.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path

import jsonschema

SCHEMAS = Path(__file__).resolve().parent / "data" / "every_eval_ever"
_UUID4 = r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"
_PATH = re.compile(rf"data/[^/]+/[^/]+/[^/]+/{_UUID4}(\.json|_samples\.jsonl)")


def schema(name: str) -> dict:
    return json.loads((SCHEMAS / f"{name}.schema.json").read_text())


def schema_version() -> str:
    """The version the vendored schemas are (0.3.0)."""
    return schema("eval")["version"]


def problems(root: Path) -> list[str]:
    """Every rule the Every Eval Ever files under ``root`` (the folder holding ``data/``) break."""
    found: list[str] = []
    records = sorted(root.rglob("*.json"))
    samples = sorted(root.rglob("*.jsonl"))
    pointed = set()
    for path in [*records, *samples]:
        relative = path.relative_to(root).as_posix()
        if not _PATH.fullmatch(relative):
            found.append(f"{relative}: not data/<collection>/<developer>/<model>/<UUID4>[_samples].json[l]")
    for path in records:
        relative = path.relative_to(root).as_posix()
        record = json.loads(path.read_text())
        found += record_problems(record, relative)
        detail = record.get("detailed_evaluation_results")
        if detail is not None:
            companion = root / detail["file_path"]
            pointed.add(companion)
            found += companion_problems(record, companion, relative)
    found += [f"{p.relative_to(root).as_posix()}: no record points at it" for p in samples if p not in pointed]
    return found


def record_problems(record: dict, where: str = "record") -> list[str]:
    validator = jsonschema.Draft7Validator(schema("eval"))
    found = [f"{where}: {'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(record)]
    if record.get("schema_version") != schema_version():
        found.append(f"{where}: schema_version {record.get('schema_version')!r}, not {schema_version()!r}")
    for index, result in enumerate(record.get("evaluation_results", [])):
        config, score = result["metric_config"], result["score_details"]["score"]
        if not (isinstance(score, (int, float)) and math.isfinite(score)):
            found.append(f"{where}: evaluation_results[{index}]: score {score!r} is not a finite number")
            continue
        if config.get("score_type") == "continuous":
            low, high = (_bound(config.get("min_score")), _bound(config.get("max_score")))
            if low is None or high is None:
                found.append(f"{where}: evaluation_results[{index}]: a continuous metric without both bounds")
            elif not low <= score <= high:
                found.append(f"{where}: evaluation_results[{index}]: score {score} outside [{low}, {high}]")
    return found


def companion_problems(record: dict, companion: Path, where: str) -> list[str]:
    detail = record["detailed_evaluation_results"]
    expected = where.removesuffix(".json") + "_samples.jsonl"
    if detail["file_path"] != expected:
        return [f"{where}: file_path {detail['file_path']!r}, not its sibling {expected!r}"]
    if detail.get("format") != "jsonl":
        return [f"{where}: format {detail.get('format')!r}, not 'jsonl'"]
    if not companion.is_file():
        return [f"{where}: its samples file {expected} does not exist"]
    text = companion.read_bytes()
    rows = [json.loads(line) for line in text.decode("utf-8").splitlines() if line.strip()]
    validator = jsonschema.Draft7Validator(schema("instance_level_eval"))
    found = [f"{expected} row {n}: {e.message}" for n, row in enumerate(rows, 1) for e in validator.iter_errors(row)]
    found += [f"{expected} row {n}: schema_version {row.get('schema_version')!r}" for n, row in enumerate(rows, 1)
              if row.get("schema_version") != schema_version()]
    if not rows:
        found.append(f"{expected}: no row (a companion needs at least one)")
    if detail.get("total_rows") is not None and detail["total_rows"] != len(rows):
        found.append(f"{where}: total_rows {detail['total_rows']}, the file has {len(rows)}")
    if detail.get("checksum") is not None and detail["checksum"] != hashlib.sha256(text).hexdigest():
        found.append(f"{where}: checksum is not the samples file's sha256")
    if {r.get("evaluation_id") for r in rows} - {record["evaluation_id"]}:
        found.append(f"{expected}: rows of another evaluation_id than the record's")
    if {r.get("model_id") for r in rows} - {record["model_info"]["id"]}:
        found.append(f"{expected}: rows of another model_id than the record's model_info.id")
    return found


def _bound(value: object) -> float | None:
    if value in ("Infinity", "-Infinity"):
        return float(value)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
