"""Partitioned snapshots: one checkpoint written in N parts by N ranks (layout version 3).

Part of the checkpoint layout contract (docs/checkpoint-layout.md, "Partitioned
snapshots"). Each part is committed on its own, exactly like a whole snapshot
(temp directory, manifest last, atomic rename), under its own name::

    step_000000100-part-00002-of-00004/      part 2 of the 4 parts of step 100

Its manifest says which part it is (``parts``: index, count, and the writer
rank of every part) and, for a parameter it holds only a slice of, which
region of the full parameter (``slice``, ``global_shape``) and, when
MindSpore's tensor parallelism cut it, the layout it was cut by (``layout``:
``dev_matrix``, ``tensor_map``). evald treats a step as committed only when
all N parts are committed and together cover every parameter exactly once.

The layout rule (MindSpore's, see ``mindspore.Layout``): the devices form a
matrix ``dev_matrix`` numbered in row-major order (last axis fastest); tensor
dimension ``i`` with ``tensor_map[i] = k >= 0`` is cut into
``dev_matrix[-1 - k]`` equal pieces and device ``d`` holds piece number
``coordinate(d)[-1 - k]``; ``-1`` means the dimension is not cut. Devices that
differ only along matrix axes no dimension maps to hold the same slice.

Neither mindspore nor numpy is imported: the trainer's writer and evald both use this.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

PARTS_LAYOUT_VERSION = 3
PART_DIR_PATTERN = re.compile(r"step_([0-9]{9,})-part-([0-9]{5,})-of-([0-9]{5,})")  # fullmatch only
_GROUP_PATTERN = re.compile(r"step_([0-9]{9,})-part-\*-of-([0-9]{5,})")
MAX_PARTS = 1 << 16

Region = tuple[tuple[int, int], ...]


class PartitionError(ValueError):
    """A part's description is not valid, or parts do not fit together."""


def part_dir_name(step: int, index: int, count: int) -> str:
    """``step_000000100-part-00002-of-00004``: the step's own name (layout.step_dir_name), then the part."""
    if step < 0 or not 0 <= index < count:
        raise ValueError(f"no part {index} of {count} for step {step}")
    return f"step_{step:09d}-part-{index:05d}-of-{count:05d}"


def parse_part_dir_name(name: str) -> tuple[int, int, int] | None:
    """(step, index, count) of a part directory name, or None for any other name."""
    match = PART_DIR_PATTERN.fullmatch(name)
    if not match:
        return None
    step, index, count = (int(g) for g in match.groups())
    return (step, index, count) if index < count <= MAX_PARTS else None


def group_name(step: int, count: int) -> str:
    """How evald's ledger names a step read from its parts (a glob of the part names)."""
    return f"step_{step:09d}-part-*-of-{count:05d}"


def parse_group_name(name: str) -> tuple[int, int] | None:
    match = _GROUP_PATTERN.fullmatch(name)
    return (int(match.group(1)), int(match.group(2))) if match else None


def source_exists(ckpt_dir: Path, source: str) -> bool:
    """Whether the entry a ledger step is read from is still in ``ckpt_dir``. A partitioned step's source is
    its ``group_name``, a glob no entry has: it is there while every one of its parts is."""
    group = parse_group_name(source)
    if group is None:
        return os.path.lexists(Path(ckpt_dir) / source)
    step, count = group
    return all(os.path.lexists(Path(ckpt_dir) / part_dir_name(step, index, count)) for index in range(count))


def source_left(ckpt_dir: Path, source: str) -> bool:
    """Whether anything of the entry a ledger step is read from is still in ``ckpt_dir``: for a partitioned
    step, any one of its parts (each writer rank deletes its own, so one may be gone while another waits)."""
    group = parse_group_name(source)
    if group is None:
        return os.path.lexists(Path(ckpt_dir) / source)
    step, count = group
    return any(os.path.lexists(Path(ckpt_dir) / part_dir_name(step, index, count)) for index in range(count))


@dataclass(frozen=True)
class PartInfo:
    """Which part of its snapshot a manifest describes, and who writes the others."""

    index: int
    count: int
    ranks: tuple[int, ...]          # the writer rank of each part, in part order

    @property
    def rank(self) -> int:
        return self.ranks[self.index]

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "count": self.count, "ranks": list(self.ranks)}

    @classmethod
    def from_json(cls, data: Any) -> "PartInfo":
        info = cls(int(data["index"]), int(data["count"]), tuple(int(r) for r in data["ranks"]))
        if not (0 <= info.index < info.count <= MAX_PARTS and len(info.ranks) == info.count
                and len(set(info.ranks)) == info.count and min(info.ranks) >= 0):
            raise PartitionError(f"parts {data!r}: index must be below count, and ranks must list "
                                 f"one distinct rank per part")
        return info


@dataclass(frozen=True)
class TensorLayout:
    """How MindSpore's tensor parallelism cut a parameter: its device matrix and tensor map."""

    dev_matrix: tuple[int, ...]
    tensor_map: tuple[int, ...]

    @property
    def device_count(self) -> int:
        return math.prod(self.dev_matrix)

    def pieces(self, global_shape: Sequence[int]) -> tuple[int, ...]:
        """How many pieces each dimension is cut into."""
        return tuple(1 if k == -1 else self.dev_matrix[-1 - k] for k in self.tensor_map[:len(global_shape)])

    def region(self, global_shape: Sequence[int], device: int) -> Region:
        """The region of the full parameter that ``device`` (0 .. device_count-1) holds."""
        coordinate, rest = [], device % self.device_count
        for size in reversed(self.dev_matrix):
            coordinate.append(rest % size)
            rest //= size
        coordinate.reverse()
        out = []
        for dim, (k, n) in enumerate(zip(self.tensor_map, self.pieces(global_shape))):
            width = global_shape[dim] // n
            piece = 0 if k == -1 else coordinate[-1 - k]
            out.append((piece * width, (piece + 1) * width))
        return tuple(out)

    def check(self, global_shape: Sequence[int]) -> None:
        if not self.dev_matrix or min(self.dev_matrix) < 1:
            raise PartitionError(f"dev_matrix {list(self.dev_matrix)} must list positive sizes")
        if len(self.tensor_map) != len(global_shape):
            raise PartitionError(f"tensor_map {list(self.tensor_map)} does not have one entry per dimension "
                                 f"of {list(global_shape)}")
        used = [k for k in self.tensor_map if k != -1]
        if any(not 0 <= k < len(self.dev_matrix) for k in used) or len(used) != len(set(used)):
            raise PartitionError(f"tensor_map {list(self.tensor_map)} names device-matrix axes outside "
                                 f"0..{len(self.dev_matrix) - 1} or one axis twice")
        for size, n in zip(global_shape, self.pieces(global_shape)):
            if size % n:
                raise PartitionError(f"dimension {size} cannot be cut into {n} equal pieces (uneven "
                                     f"splits are not supported)")

    def to_json(self) -> dict[str, Any]:
        return {"dev_matrix": list(self.dev_matrix), "tensor_map": list(self.tensor_map)}

    @classmethod
    def from_json(cls, data: Any) -> "TensorLayout":
        return cls(tuple(int(d) for d in data["dev_matrix"]), tuple(int(k) for k in data["tensor_map"]))


@dataclass(frozen=True)
class SliceSpec:
    """The region of a full parameter that one manifest entry holds."""

    region: Region                  # [start, stop) per dimension
    global_shape: tuple[int, ...]
    layout: TensorLayout | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(stop - start for start, stop in self.region)

    def check(self, shape: Sequence[int]) -> None:
        """The region lies inside the full shape and has the entry's own shape."""
        if len(self.region) != len(self.global_shape) or tuple(shape) != self.shape:
            raise PartitionError(f"slice {[list(r) for r in self.region]} does not have the entry's shape "
                                 f"{list(shape)}")
        if any(not 0 <= a <= b <= n for (a, b), n in zip(self.region, self.global_shape)):
            raise PartitionError(f"slice {[list(r) for r in self.region]} lies outside the full shape "
                                 f"{list(self.global_shape)}")
        if self.layout is not None:
            self.layout.check(self.global_shape)
            if self.region not in {self.layout.region(self.global_shape, d)
                                   for d in range(self.layout.device_count)}:
                raise PartitionError(f"slice {[list(r) for r in self.region]} is not one that layout "
                                     f"{self.layout.to_json()} cuts")

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"slice": [list(r) for r in self.region], "global_shape": list(self.global_shape)}
        if self.layout is not None:
            data["layout"] = self.layout.to_json()
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "SliceSpec | None":
        if "slice" not in data and "global_shape" not in data:
            return None
        region = tuple((int(a), int(b)) for a, b in data["slice"])
        layout = TensorLayout.from_json(data["layout"]) if data.get("layout") is not None else None
        return cls(region, tuple(int(d) for d in data["global_shape"]), layout)


def overlap(a: Region, b: Region) -> bool:
    return all(max(a0, b0) < min(a1, b1) for (a0, a1), (b0, b1) in zip(a, b))


def tiling_problem(name: str, pieces: Sequence[tuple[str, SliceSpec | None, tuple[int, ...]]]) -> str | None:
    """Why the pieces of parameter ``name`` do not make it up exactly once, or None.

    ``pieces``: (where it is, its slice or None for the whole parameter, its shape).
    """
    if len(pieces) > 1 and any(s is None for _, s, _ in pieces):
        whole = [w for w, s, _ in pieces if s is None]
        others = [w for w, _, _ in pieces if w != whole[0]]
        return f"{name!r} is held whole by {whole[0]} and again by {', '.join(others)} (overlapping parts)"
    if pieces[0][1] is None:
        return None
    specs = [(w, s) for w, s, _ in pieces if s is not None]
    shapes = {s.global_shape for _, s in specs}
    if len(shapes) > 1:
        return f"{name!r}: its slices disagree on the full shape ({sorted(list(s) for s in shapes)})"
    layouts = {s.layout for _, s in specs}
    if len(layouts) > 1:
        return f"{name!r}: its slices were cut by different layouts"
    for i, (wa, a) in enumerate(specs):
        for wb, b in specs[i + 1:]:
            if overlap(a.region, b.region):
                return (f"{name!r}: the slice in {wa} {[list(r) for r in a.region]} overlaps the slice in "
                        f"{wb} {[list(r) for r in b.region]} (overlapping parts)")
    covered = sum(math.prod(s.shape) for _, s in specs)
    total = math.prod(specs[0][1].global_shape)
    if covered != total:
        return (f"{name!r}: its slices cover {covered} of its {total} elements "
                f"{list(specs[0][1].global_shape)}; the rest is in no part (a gap)")
    return None
