"""MANIFEST.json of the checkpoint layout: what it says, and the checks a reader makes on it.

Part of the layout contract; import these names from evald.contracts.layout.
Documented in docs/checkpoint-layout.md. Version 2 lists every weights file
(name, bytes, digest) and, for every parameter, its file, dtype, shape and
absolute byte offset, and names its integrity check and that check's version
(evald.contracts.integrity: xxh3-128 by default, or sha256); version 3 is a part
of a partitioned snapshot. Nothing released wrote another version, so any other is
refused with a clear error. Everything is
validated here, once, before any weights file is opened: a known integrity check,
a file name cannot leave the checkpoint directory, no parameter can reach past
its file's declared size.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

import numpy as np

from evald.contracts import integrity, manifest_fields
from evald.contracts import safetensors_io as sio
from evald.contracts.partition import PARTS_LAYOUT_VERSION, PartInfo, PartitionError, SliceSpec

LAYOUT_VERSION = 2                  # a whole snapshot; a part of a partitioned one is PARTS_LAYOUT_VERSION
READABLE_VERSIONS = (2, PARTS_LAYOUT_VERSION)
MANIFEST_FILE = "MANIFEST.json"
WEIGHTS_FILE = "weights.safetensors"
HASH_ALGORITHM = integrity.DEFAULT          # what a writer uses unless told; why: docs/performance.md
HASH_VERSION = integrity.WRITTEN_VERSION    # 1: one digest per file, of all its bytes in order
# Keys of a part of a partitioned snapshot (evald.contracts.partition): only version 3 has them.
PARTITION_KEYS = ("parts",), ("slice", "global_shape"), ("rank",)
_SAFE_FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,200}")  # fullmatch


class LayoutError(ValueError):
    """A checkpoint directory does not follow the layout (or fails verification)."""


class AlreadyCommitted(FileExistsError):
    """That step is already committed: a resumed run repeating a step keeps the first checkpoint."""


@dataclass(frozen=True)
class ParamSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str                      # numpy dtype name
    file: str = WEIGHTS_FILE        # the weights file that holds it
    offset: int | None = None       # absolute byte offset in that file
    sliced: SliceSpec | None = None  # version 3: the region of the full parameter this entry holds


@dataclass(frozen=True)
class FileSpec:
    name: str
    bytes: int
    digest: str                     # hex digest of all the file's bytes (Manifest.hash_algorithm)
    rank: int | None = None         # version 3: the rank that wrote it


@dataclass(frozen=True)
class ResumeInfo:
    """What a resume needs beyond the weights (the seed article, section 4.4)."""

    learning_rate: float | None = None
    loss_scale: float | None = None
    seed: int | None = None
    data_offset: int | None = None


@dataclass(frozen=True)
class Manifest:
    run_id: str
    step: int
    epoch: int | None
    commit_time: float
    files: tuple[FileSpec, ...]
    params: tuple[ParamSpec, ...]
    resume: ResumeInfo = field(default_factory=ResumeInfo)
    producer: Mapping[str, Any] = field(default_factory=dict)
    hash_algorithm: str = HASH_ALGORITHM
    layout_version: int = LAYOUT_VERSION
    parts: PartInfo | None = None   # version 3: which part of the snapshot this is
    hash_version: int = HASH_VERSION  # of ``hash_algorithm`` (evald.contracts.integrity)

    def to_json(self) -> str:
        data = {k: v for k, v in asdict(self).items()
                if k not in ("files", "params", "hash_algorithm", "hash_version", "parts")}
        data["hash"] = {"algorithm": self.hash_algorithm, "version": self.hash_version}
        data["files"] = [{"name": f.name, "bytes": f.bytes, "digest": f.digest} for f in self.files]
        data["params"] = [{"name": p.name, "shape": list(p.shape), "dtype": p.dtype, "file": p.file,
                           "offset": p.offset, **(p.sliced.to_json() if p.sliced else {})}
                          for p in self.params]
        if self.parts is not None:
            data["parts"] = self.parts.to_json()
            for f, spec in zip(data["files"], self.files):
                f["rank"] = spec.rank
        return json.dumps(data, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str, source: str = "<manifest>") -> "Manifest":
        try:
            data = manifest_fields.parse(text)  # bounded nesting, no NaN, no 40-digit integers
            version = data.get("layout_version")
            if version not in READABLE_VERSIONS:
                raise LayoutError(
                    f"{source}: layout_version {version!r} is not one this code reads {READABLE_VERSIONS}; "
                    f"upgrade evald or the trainer hook so both agree"
                )
            if version != PARTS_LAYOUT_VERSION:
                _refuse_partitioned(data, source)
            manifest_fields.check(data, version)  # every value within bounds before it is used
            algorithm, hash_version = data["hash"]["algorithm"], data["hash"]["version"]
            try:  # the one place a manifest's check is judged: before any weights file is opened
                integrity.lookup(algorithm, hash_version, source)
            except integrity.UnknownCheck as exc:
                raise LayoutError(str(exc)) from exc
            files = tuple(FileSpec(str(f["name"]), int(f["bytes"]), str(f["digest"]),
                                   None if f.get("rank") is None else int(f["rank"])) for f in data["files"])
            params = tuple(ParamSpec(str(p["name"]), _shape(p["shape"]), str(p["dtype"]), str(p["file"]),
                                     int(p["offset"]), SliceSpec.from_json(p)) for p in data["params"])
            manifest = cls(
                run_id=str(data["run_id"]),
                step=int(data["step"]),
                epoch=None if data.get("epoch") is None else int(data["epoch"]),
                commit_time=float(data["commit_time"]),
                files=files,
                params=params,
                resume=ResumeInfo(**data.get("resume") or {}),
                producer=dict(data.get("producer") or {}),
                hash_algorithm=algorithm,
                hash_version=hash_version,
                layout_version=int(version),
                parts=PartInfo.from_json(data["parts"]) if version == PARTS_LAYOUT_VERSION else None,
            )
        except LayoutError:
            raise
        except PartitionError as exc:
            raise LayoutError(f"{source}: not a valid part of a partitioned checkpoint: {exc}") from exc
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise LayoutError(f"{source}: not a valid manifest ({exc!r})") from exc
        _check(manifest, source)
        return manifest


def _shape(dims) -> tuple[int, ...]:
    shape = tuple(int(d) for d in dims)
    if any(d < 0 for d in shape):
        raise ValueError(f"negative dimension in shape {list(dims)}")
    return shape


def _refuse_partitioned(data: Mapping, source: str) -> None:
    top, per_param, per_file = PARTITION_KEYS
    if (any(k in data for k in top) or any(k in p for p in data.get("params", ()) for k in per_param)
            or any(k in f for f in data.get("files", ()) for k in per_file)):
        raise LayoutError(f"{source}: a partitioned checkpoint's keys (parts, slice, rank) in a version "
                          f"{data.get('layout_version')} manifest; parts are layout version "
                          f"{PARTS_LAYOUT_VERSION}")


def _check(manifest: Manifest, source: str) -> None:
    """Names safe and unique, digests well-formed, every parameter inside its file."""
    problems = []
    digest_len = integrity.CHECKS[(manifest.hash_algorithm, manifest.hash_version)].hex_digits  # from_json checked it
    sizes = {}
    for f in manifest.files:
        if not _SAFE_FILE_NAME.fullmatch(f.name) or f.name == MANIFEST_FILE:
            problems.append(f"file name {f.name!r} is not a plain weights file name")
        if f.name in sizes:
            problems.append(f"file {f.name!r} is listed twice")
        if f.bytes < 8 or not re.fullmatch(f"[0-9a-f]{{{digest_len}}}", f.digest):
            problems.append(f"file {f.name!r}: bad size {f.bytes} or {manifest.hash_algorithm} digest")
        sizes[f.name] = f.bytes
        if manifest.parts is not None and f.rank != manifest.parts.rank:
            problems.append(f"file {f.name!r} names rank {f.rank}, but this is rank {manifest.parts.rank}'s part")
    seen, spans = set(), {}
    for p in manifest.params:
        if p.name in seen:
            problems.append(f"parameter {p.name!r} is listed twice")
        seen.add(p.name)
        try:
            nbytes = sio.Segment(p.name, p.dtype, p.shape, p.offset or 0).nbytes
        except sio.WeightsFileError as exc:
            problems.append(f"parameter {p.name!r}: {exc}")
            continue
        if p.sliced is not None:
            try:
                p.sliced.check(p.shape)
            except PartitionError as exc:
                problems.append(f"parameter {p.name!r}: {exc}")
        if p.file not in sizes:
            problems.append(f"parameter {p.name!r} is in {p.file!r}, which the manifest does not list")
        elif p.offset is not None:
            if p.offset < 8 or p.offset + nbytes > sizes[p.file]:
                problems.append(f"parameter {p.name!r} ({nbytes} bytes at {p.offset}) lies outside {p.file!r}")
            spans.setdefault(p.file, []).append((p.offset, p.offset + nbytes, p.name))
    for name, ranges in spans.items():
        ranges.sort()
        problems += [f"parameters {a[2]!r} and {b[2]!r} overlap in {name!r}"
                     for a, b in zip(ranges, ranges[1:]) if b[0] < a[1]]
    if problems:
        raise LayoutError(f"{source}: not a valid manifest: " + "; ".join(problems[:5]))


_NUMPY_NAME_OF_MINDSPORE = {
    "Float16": "float16", "Float32": "float32", "Float64": "float64", "BFloat16": "bfloat16",
    "Int8": "int8", "Int16": "int16", "Int32": "int32", "Int64": "int64",
    "UInt8": "uint8", "UInt16": "uint16", "UInt32": "uint32", "UInt64": "uint64", "Bool": "bool",
}


def numpy_dtype_of(mindspore_dtype: object) -> np.dtype | None:
    """The numpy dtype of a MindSpore dtype (by its name; mindspore.dtype_to_nptype is deprecated
    since 2.7), or None when numpy has none (bfloat16 before mindspore registers it)."""
    name = _NUMPY_NAME_OF_MINDSPORE.get(str(mindspore_dtype))
    try:
        return np.dtype(name) if name else None
    except TypeError:
        return None
