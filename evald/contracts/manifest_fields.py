"""The bounds of MANIFEST.json's values, checked once before the manifest is built.

Whoever can write the checkpoint directory writes manifests, so every value a
manifest gives evald (a step that reaches the ledger, a time that becomes a
TensorBoard wall time, a size that decides how much is read) is checked here
against the same bounds as the wire protocol (evald.contracts.wire_fields): JSON
integers (not bools, not floats, not 40-digit literals) in 0..2**63-1, finite
times, bounded strings with no control characters, no NaN/Infinity literals, and
no nesting deep enough to exhaust the parser's stack. Errors are ValueErrors whose
text names the field; Manifest.from_json turns them into LayoutError.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from evald.contracts import wire_fields as F

MAX_DIMS = 64                # dimensions of one parameter
MAX_PARAM_NAME_BYTES = 4096
MAX_FILE_NAME_BYTES = 255    # NAME_MAX
MAX_SHORT_BYTES = 256        # dtype, hash algorithm, digest
MAX_PART_RANKS = 1 << 16     # ranks listed by a partitioned snapshot's part: one per part (partition.MAX_PARTS)
_RESUME_KEYS = {"learning_rate": F.finite, "loss_scale": F.finite, "seed": None, "data_offset": F.uint}


class ManifestFieldError(ValueError):
    """A manifest value outside its bounds."""


def _no_constant(name: str) -> Any:
    raise ManifestFieldError(f"{name} is not a JSON number (NaN and Infinity are not allowed)")


_DECODER = json.JSONDecoder(parse_int=lambda s: int(s) if len(s) <= F.MAX_INT_DIGITS else F.HugeInt(len(s)),
                            parse_constant=_no_constant)


def parse(text: str) -> dict[str, Any]:
    """JSON text to a dict, refusing deep nesting before the recursive parser runs."""
    F.check_nesting(text.encode("utf-8", "surrogatepass"))
    data = _DECODER.decode(text)
    if not isinstance(data, dict):
        raise ManifestFieldError(f"a manifest is a JSON object, not {F.preview(data)}")
    return data


def check(data: Mapping[str, Any], version: int) -> None:
    """Every field Manifest.from_json converts, against its bound (ProtocolError/ManifestFieldError)."""
    F.text(_get(data, "run_id"), "run_id", F.MAX_RUN_ID_BYTES, empty=False, name=True)
    F.uint(_get(data, "step"), "step")
    if data.get("epoch") is not None:
        F.uint(data["epoch"], "epoch")
    if F.finite(_get(data, "commit_time"), "commit_time") < 0:
        raise ManifestFieldError(f"commit_time {data['commit_time']!r} is before 1970")
    hash_spec = _object(_get(data, "hash"), "hash")
    _short(_get(hash_spec, "algorithm", "hash."), "hash.algorithm")
    F.uint(_get(hash_spec, "version", "hash."), "hash.version")
    for i, spec in enumerate(_list(_get(data, "files"), "files")):
        spec = _object(spec, f"files[{i}]")
        _short(_get(spec, "name", f"files[{i}]."), f"files[{i}].name", MAX_FILE_NAME_BYTES)
        F.uint(_get(spec, "bytes", f"files[{i}]."), f"files[{i}].bytes")
        _short(_get(spec, "digest", f"files[{i}]."), f"files[{i}].digest")
    for i, param in enumerate(_list(_get(data, "params"), "params")):
        param = _object(param, f"params[{i}]")
        F.text(_get(param, "name", f"params[{i}]."), f"params[{i}].name", MAX_PARAM_NAME_BYTES, empty=False,
               name=True)
        shape = _list(_get(param, "shape", f"params[{i}]."), f"params[{i}].shape")
        if len(shape) > MAX_DIMS:
            raise ManifestFieldError(f"params[{i}].shape: {len(shape)} dimensions exceed {MAX_DIMS}")
        for d, dim in enumerate(shape):
            F.uint(dim, f"params[{i}].shape[{d}]")
        _short(_get(param, "dtype", f"params[{i}]."), f"params[{i}].dtype")
        if version != 1:
            _short(_get(param, "file", f"params[{i}]."), f"params[{i}].file", MAX_FILE_NAME_BYTES)
            F.uint(_get(param, "offset", f"params[{i}]."), f"params[{i}].offset")
        _check_slice(param, f"params[{i}]")
    _check_parts(data)
    if data.get("resume") is not None:
        for key, value in _object(data["resume"], "resume").items():
            if key not in _RESUME_KEYS:
                raise ManifestFieldError(f"resume.{F.preview(key)}: not a resume field ({', '.join(_RESUME_KEYS)})")
            if value is not None:
                (_RESUME_KEYS[key] or _int64)(value, f"resume.{key}")
    if data.get("producer") is not None:
        F.json_object(data["producer"], "producer")


def _check_slice(param: Mapping[str, Any], where: str) -> None:
    """A partitioned snapshot's slice of a parameter (layout version 3): small lists of small integers."""
    if "slice" in param:
        for d, bounds in enumerate(_dims(param["slice"], f"{where}.slice")):
            pair = _list(bounds, f"{where}.slice[{d}]")
            if len(pair) != 2:
                raise ManifestFieldError(f"{where}.slice[{d}]: must be [start, stop], got {F.preview(pair)}")
            for value in pair:
                F.uint(value, f"{where}.slice[{d}]")
    if "global_shape" in param:
        for d, dim in enumerate(_dims(param["global_shape"], f"{where}.global_shape")):
            F.uint(dim, f"{where}.global_shape[{d}]")
    if param.get("layout") is not None:
        tensor_layout = _object(param["layout"], f"{where}.layout")
        for key in ("dev_matrix", "tensor_map"):
            for d, value in enumerate(_dims(_get(tensor_layout, key, f"{where}.layout."), f"{where}.layout.{key}")):
                _int64(value, f"{where}.layout.{key}[{d}]")


def _check_parts(data: Mapping[str, Any]) -> None:
    if "parts" in data:
        parts = _object(data["parts"], "parts")
        F.uint(_get(parts, "index", "parts."), "parts.index")
        F.uint(_get(parts, "count", "parts."), "parts.count")
        ranks = _list(_get(parts, "ranks", "parts."), "parts.ranks")
        if len(ranks) > MAX_PART_RANKS:
            raise ManifestFieldError(f"parts.ranks: {len(ranks)} ranks exceed {MAX_PART_RANKS}")
        for r, rank in enumerate(ranks):
            F.uint(rank, f"parts.ranks[{r}]")
    for i, spec in enumerate(data.get("files") or []):
        if isinstance(spec, dict) and "rank" in spec:
            F.uint(spec["rank"], f"files[{i}].rank")


def _dims(value: Any, where: str) -> list:
    values = _list(value, where)
    if len(values) > MAX_DIMS:
        raise ManifestFieldError(f"{where}: {len(values)} dimensions exceed {MAX_DIMS}")
    return values


def _get(data: Mapping[str, Any], key: str, where: str = "") -> Any:
    if key not in data:
        raise ManifestFieldError(f"{where}{key}: missing")
    return data[key]


def _short(value: Any, where: str, max_bytes: int = MAX_SHORT_BYTES) -> str:
    return F.text(value, where, max_bytes, empty=False, name=True)


def _object(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise ManifestFieldError(f"{where}: must be an object, got {F.preview(value)}")
    return value


def _list(value: Any, where: str) -> list:
    if not isinstance(value, list):
        raise ManifestFieldError(f"{where}: must be a list, got {F.preview(value)}")
    return value


def _int64(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not F.MIN_INT <= value <= F.MAX_INT:
        raise ManifestFieldError(f"{where}: must be a 64-bit integer, got {F.preview(value)}")
    return value
