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

import itertools
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


OUTSIDE, OVERLAP, GAP, IRREGULAR = "outside", "overlap", "gap", "irregular"
MAX_GRID_CELLS = 1 << 20   # pieces an irregular (non-grid) layout is cut into to be checked; ~0.5 s of work


@dataclass(frozen=True)
class Untiled:
    """Why boxes do not make up a shape exactly once. ``kind``: OUTSIDE (``boxes[0]`` is not inside the
    shape, or has another number of dimensions), OVERLAP (``boxes`` overlap; empty when only the element
    count shows it), GAP (they hold ``covered`` of the ``total`` elements, none twice), IRREGULAR (no grid,
    and too many pieces to check: ``cells``). ``boxes`` index the caller's sequence."""

    kind: str
    boxes: tuple[int, ...] = ()
    covered: int = 0
    total: int = 0
    cells: int = 0


def untiled(shape: Sequence[int], regions: Sequence[Region], max_cells: int = MAX_GRID_CELLS) -> Untiled | None:
    """None when ``regions`` (``[start, stop)`` per dimension) cover ``shape`` exactly once: every box inside
    it, no two overlapping, no element left out. Exact, and near-linear in the number of boxes.

    Every box is cut at every boundary any box has, per dimension: the cut points make a grid of cells.
    A layout cut by a device matrix (MindSpore's, MindFormers' chunks, evald's parts) is a grid whose
    cells are the boxes themselves: then each box must be one cell, no cell twice, and the count of boxes
    the count of cells (a sort and a dictionary, O(n log n)). A layout that is not such a grid is checked
    cell by cell when it makes at most ``max_cells`` cells (the first cell claimed twice is an overlap, a
    cell nobody claims a gap), else refused as IRREGULAR unless its element count already shows a gap or
    an overlap. Boxes without elements cover nothing and overlap nothing.
    """
    total, dims = math.prod(shape), len(shape)
    for i, region in enumerate(regions):
        if len(region) != dims:
            return Untiled(OUTSIDE, (i,), total=total)
    columns = list(zip(*regions)) if regions and dims else [()] * dims   # columns[k]: every box's (start, stop)
    outside = [next((i for i, (a, b) in enumerate(column) if not 0 <= a <= b <= n), len(regions))
               for column, n in zip(columns, shape)]
    if min(outside, default=len(regions)) < len(regions):
        return Untiled(OUTSIDE, (min(outside),), total=total)
    lengths = [[b - a for a, b in column] for column in columns]
    sizes = [math.prod(box) for box in zip(*lengths)] if dims else [1] * len(regions)
    solid = [i for i, size in enumerate(sizes) if size]
    covered = sum(sizes)
    if len(solid) < len(regions):
        columns = [[column[i] for i in solid] for column in columns]
    bounds = [sorted({0, n, *(a for a, _ in column), *(b for _, b in column)}) for column, n in zip(columns, shape)]
    cells = math.prod(len(points) - 1 for points in bounds)
    first: list[list[int]] = []       # per dimension, each box's first cell
    wheres = [{point: j for j, point in enumerate(points)} for points in bounds]
    grid = True
    for column, where in zip(columns, wheres):
        starts = [where[a] for a, _ in column]
        grid = grid and all(where[b] - j == 1 for (_, b), j in zip(column, starts))
        first.append(starts)
    if grid:   # each box is one cell: no cell twice, and as many boxes as cells
        owner: dict[tuple[int, ...], int] = {}
        for i, cell in zip(solid, zip(*first) if dims else [()] * len(solid)):
            other = owner.setdefault(cell, i)
            if other != i:
                return Untiled(OVERLAP, (other, i), covered, total, cells)
        return None if len(solid) == cells else Untiled(GAP, (), covered, total, cells)
    if cells > max_cells:
        if covered != total:
            return Untiled(GAP if covered < total else OVERLAP, (), covered, total, cells)
        return Untiled(IRREGULAR, (), covered, total, cells)
    spans = [tuple((where[a], where[b]) for (a, b), where in zip(box, wheres)) for box in zip(*columns)]
    return _paint(solid, spans, [len(points) - 1 for points in bounds], covered, total, cells)


def _paint(solid: list[int], spans: list[tuple[tuple[int, int], ...]], counts: list[int], covered: int,
           total: int, cells: int) -> Untiled | None:
    """Claim every cell of every box, once (at most ``cells`` + 1 claims: the first cell claimed twice stops it)."""
    strides = [math.prod(counts[k + 1:]) for k in range(len(counts))]
    owner = [-1] * cells
    for i, span in zip(solid, spans):
        for cell in itertools.product(*(range(j0 * s, j1 * s, s) for (j0, j1), s in zip(span, strides))):
            at = sum(cell)
            if owner[at] >= 0:
                return Untiled(OVERLAP, (owner[at], i), covered, total, cells)
            owner[at] = i
    return None if min(owner, default=0) >= 0 else Untiled(GAP, (), covered, total, cells)


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
    full = specs[0][1].global_shape
    problem = untiled(full, [s.region for _, s in specs])
    if problem is None:
        return None
    shown = [f"{specs[i][0]} {[list(r) for r in specs[i][1].region]}" for i in problem.boxes]
    if problem.kind == OUTSIDE:
        return f"{name!r}: the slice in {shown[0]} lies outside the full shape {list(full)}"
    if problem.kind == OVERLAP and shown:
        return f"{name!r}: the slice in {shown[0]} overlaps the slice in {shown[1]} (overlapping parts)"
    if problem.kind == OVERLAP:
        return (f"{name!r}: its slices hold {problem.covered} elements of its {problem.total} "
                f"{list(full)}: some overlap (overlapping parts)")
    if problem.kind == GAP:
        return (f"{name!r}: its slices cover {problem.covered} of its {problem.total} elements "
                f"{list(full)}; the rest is in no part (a gap)")
    return (f"{name!r}: its {len(specs)} slices do not cut {list(full)} into a grid, and checking them would take "
            f"{problem.cells} pieces (more than {MAX_GRID_CELLS}); not read")
