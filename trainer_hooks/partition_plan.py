"""Which weights (or slices of them) this rank copies and writes, when several ranks write one snapshot.

With N writer ranks a snapshot is written in N parts (evald.contracts.partition),
and every rank computes the same plan from what it knows, with no communication:

* a parameter every writer holds whole (data parallel: replicated weights) is
  written by one of them; the parameters are shared out by bytes (largest
  first, to the least-loaded writer), and one larger than half a fair share is
  first cut along its first dimension into pieces for several writers, so each
  rank copies and writes about 1/N of the bytes;
* a parameter MindSpore's tensor parallelism cut (a layout in
  ``parameter_layout_dict``) is written as the slice this rank holds, with its
  region and layout; ranks holding the same slice (replicas) share out the
  distinct slices, as above;
* with ``holds`` (pipeline stages, any custom split), the rank writes exactly
  the parameters it says it holds, all of them.

The copy to host memory reads only the planned parameters (rows), so both the
blocking copy and the commit shrink with N.
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

from evald.contracts.partition import PartInfo, PartitionError, SliceSpec, TensorLayout

log = logging.getLogger("trainer_hooks.partition_plan")

Rows = tuple[int, int]                  # a [start, stop) range of a parameter's first dimension


@dataclass(frozen=True)
class PartitionPlan:
    part: PartInfo
    rows: Mapping[str, Rows | None]     # what this rank copies: name -> rows of its local tensor, None = all
    slices: Mapping[str, SliceSpec]     # of those, the entries that hold a region of the full parameter
    nbytes: int                         # bytes this rank writes
    total_bytes: int                    # bytes of every parameter this rank holds


@dataclass(frozen=True)
class _Piece:
    name: str
    nbytes: int
    holders: tuple[int, ...]
    spec: SliceSpec | None = None       # this rank's tensor-parallel slice, when it is this piece
    region: tuple = ()                  # which slice of the parameter this piece is (tensor parallel)


def writer_list(writer_ranks: Iterable[int] | str, world_size: int) -> tuple[int, ...]:
    """The writer ranks in part order: ``"all"`` is every rank of the job."""
    ranks = range(world_size) if writer_ranks == "all" else writer_ranks
    return tuple(sorted({int(r) for r in ranks}))  # type: ignore[union-attr]


def plan_partition(params: Sequence[tuple[str, tuple[int, ...], int]], *, rank: int, writers: Sequence[int],
                   layouts: Mapping[str, TensorLayout] | None = None,
                   holds: Callable[[str], bool] | None = None) -> PartitionPlan:
    """The plan of ``rank`` among ``writers``; ``params``: (name, local shape, local bytes) in network order."""
    writers = tuple(writers)
    part = PartInfo(writers.index(rank), len(writers), writers)
    layouts = layouts or {}
    held = [p for p in params if holds is None or holds(p[0])]
    total = sum(nbytes for _, _, nbytes in held)
    share = total / len(writers)
    pieces: list[tuple[_Piece, tuple[int, ...]]] = []
    for name, shape, nbytes in held:
        layout = layouts.get(name)
        if holds is not None:
            pieces.append((_Piece(name, nbytes, (rank,), _tp_slice(name, shape, layout, rank)), shape))
        elif layout is not None:
            # Every distinct slice of the stage, not only this rank's: all its ranks then plan alike.
            spec, full, devices = _tp_slice(name, shape, layout, rank), _global_shape(shape, layout), \
                layout.device_count
            stage = tuple(w for w in writers if w // devices == rank // devices)
            if spec is None:  # not cut: replicated over the stage
                pieces.append((_Piece(name, nbytes, stage), shape))
            for region in sorted({layout.region(full, w % devices) for w in stage}) if spec else ():
                holders = tuple(w for w in stage if layout.region(full, w % devices) == region)
                mine = spec if spec.region == region else None
                pieces.append((_Piece(name, nbytes, holders, mine, region), shape))
        else:
            pieces.append((_Piece(name, nbytes, writers), shape))
    load = {w: 0 for w in writers}
    rows: dict[str, Rows | None] = {}
    slices: dict[str, SliceSpec] = {}
    for piece, shape in sorted(pieces, key=lambda p: (-p[0].nbytes, p[0].name, p[0].region)):
        cuts = _cuts(piece, shape, share)
        chosen = sorted(piece.holders, key=lambda w: (load[w], writers.index(w)))[:len(cuts)]
        for writer, (start, stop) in zip(chosen, cuts):
            nbytes = piece.nbytes if len(cuts) == 1 else piece.nbytes // shape[0] * (stop - start)
            load[writer] += nbytes
            if writer != rank:
                continue
            if len(cuts) == 1:
                rows[piece.name] = None
                if piece.spec is not None:
                    slices[piece.name] = piece.spec
            else:
                rows[piece.name] = (start, stop)
                slices[piece.name] = SliceSpec(((start, stop),) + tuple((0, d) for d in shape[1:]), shape)
    order = {name: i for i, (name, _, _) in enumerate(params)}
    return PartitionPlan(part, dict(sorted(rows.items(), key=lambda kv: order[kv[0]])), slices,
                         load[rank], total)


def _cuts(piece: _Piece, shape: tuple[int, ...], share: float) -> list[Rows]:
    """One piece, or, for a replicated parameter over half a fair share, row ranges for several writers."""
    whole = [(0, shape[0] if shape else 1)]
    if piece.region or len(piece.holders) < 2 or not shape or piece.nbytes <= share / 2:
        return whole
    count = min(len(piece.holders), shape[0], math.ceil(piece.nbytes / (share / 2)))
    if count < 2:
        return whole
    bounds = [round(i * shape[0] / count) for i in range(count + 1)]
    return [(a, b) for a, b in zip(bounds, bounds[1:])]


def _global_shape(local: tuple[int, ...], layout: TensorLayout) -> tuple[int, ...]:
    return tuple(d * n for d, n in zip(local, layout.pieces(local)))


def _tp_slice(name: str, local: tuple[int, ...], layout: TensorLayout | None, rank: int) -> SliceSpec | None:
    if layout is None or all(k == -1 for k in layout.tensor_map):
        return None
    full = _global_shape(local, layout)
    layout.check(full)
    spec = SliceSpec(layout.region(full, rank % layout.device_count), full, layout)
    spec.check(local)
    return spec


def mindspore_layouts(cell: Any, named: Sequence[tuple[str, Any]]) -> dict[str, TensorLayout]:
    """Layouts MindSpore reports for ``named`` (relative name, Parameter) in ``cell.parameter_layout_dict``.

    Its entries (keyed by ``Parameter.name``) start ``(dev_matrix, tensor_map, slice_shape,
    field_size, uniform_split, opt_shard_group, ...)``. UNTESTED on a real sharded job:
    MindSpore 2.10 refuses semi-auto parallel on CPU, so these come from the documented format.
    """
    found = getattr(cell, "parameter_layout_dict", None) or {}
    layouts = {}
    for name, param in named:
        entry = found.get(getattr(param, "name", None))
        if not entry:
            continue
        dev_matrix, tensor_map = entry[0], entry[1]
        if any(isinstance(k, (list, tuple)) for k in tensor_map):
            raise PartitionError(f"{name}: a tensor dimension cut over several device axes {list(tensor_map)}")
        if len(entry) > 5 and entry[5]:
            raise PartitionError(f"{name}: sharded by the parallel optimizer (group {entry[5]!r})")
        if (len(entry) > 3 and entry[3]) or (len(entry) > 4 and not entry[4]):
            raise PartitionError(f"{name}: an uneven or field-size split")
        layouts[name] = TensorLayout(tuple(int(d) for d in dev_matrix), tuple(int(k) for k in tensor_map))
    return layouts


def planner(rank: int, writers: Sequence[int], holds: Iterable[str] | Callable[[str], bool] | None = None,
            tensor_layouts: Any = None) -> Callable[[Any, Any], PartitionPlan] | None:
    """What SnapshotWriter calls once it has the network; None for a single writer (whole snapshots)."""
    if len(writers) < 2:
        return None
    predicate = holds_predicate(holds)

    def plan(network: Any, optimizer: Any) -> PartitionPlan:
        return plan_for_network(network, optimizer, rank=rank, writers=writers, holds=predicate,
                                tensor_layouts=tensor_layouts)
    return plan


def plan_for_network(network: Any, optimizer: Any, *, rank: int, writers: Sequence[int],
                     holds: Callable[[str], bool] | None = None, tensor_layouts: Any = None) -> PartitionPlan:
    """The plan for the weights of ``network``; ``tensor_layouts``: ``{name: TensorLayout}``, or a cell
    whose ``parameter_layout_dict`` has them (default: ``network`` itself)."""
    from trainer_hooks.host_copy import weight_parameters

    named = weight_parameters(network, optimizer)
    if isinstance(tensor_layouts, Mapping):
        layouts = {n: v if isinstance(v, TensorLayout) else TensorLayout.from_json(v)
                   for n, v in tensor_layouts.items()}
    else:
        layouts = mindspore_layouts(network if tensor_layouts is None else tensor_layouts, named)
    params = [(name, tuple(int(d) for d in p.shape), _nbytes(p)) for name, p in named]
    plan = plan_partition(params, rank=rank, writers=writers, layouts=layouts, holds=holds)
    log.info("rank %d writes part %d of %d of each snapshot: %d weights (%d sliced), %.1f MB of %.1f MB",
             rank, plan.part.index, plan.part.count, len(plan.rows), len(plan.slices), plan.nbytes / 1e6,
             plan.total_bytes / 1e6)
    return plan


def _nbytes(param: Any) -> int:
    try:
        return int(param.nbytes)
    except (AttributeError, TypeError):
        return math.prod(int(d) for d in param.shape) * 4


def shared_run_id(reduce_sum: Callable[[Any], Any] | None, rank: int, world_size: int, writers: Sequence[int],
                  fallback: str) -> str:
    """A run id all ranks share when several write parts of one snapshot (never raises)."""
    if len(writers) < 2 or world_size < 2:
        return fallback
    try:
        if reduce_sum is None:
            from trainer_hooks.stop_agreement import mindspore_reduce_sum

            reduce_sum = mindspore_reduce_sum()
        if reduce_sum is not None:
            return agree_run_id(reduce_sum, rank)
    except Exception:
        log.exception("the ranks could not agree on a run id")
    log.error("%d ranks write parts of each snapshot, but without mindspore.communication they cannot agree "
              "on a run id: pass run_id= or set EVALD_RUN_ID, or evald will refuse the mixed parts", len(writers))
    return fallback


def holds_predicate(holds: Iterable[str] | Callable[[str], bool] | None) -> Callable[[str], bool] | None:
    if holds is None or callable(holds):
        return holds
    names = frozenset(holds)
    return names.__contains__


def agree_run_id(reduce_sum: Callable[[Any], Any], rank: int) -> str:
    """One run id for every rank: rank 0 draws it, an all-reduce SUM (a broadcast here) shares it."""
    import numpy as np
    import secrets

    mine = [int(time.time()), secrets.randbits(32)] if rank == 0 else [0, 0]
    when, token = (int(v) for v in reduce_sum(np.array(mine, dtype=np.int64)))
    return f"run-{time.strftime('%Y%m%d-%H%M%S', time.gmtime(when))}-{token:08x}"


def detect_rank() -> tuple[int, int]:
    """(rank, world size): MindSpore's when its communication is initialised, else RANK_ID/RANK_SIZE."""
    try:
        from mindspore.communication import GlobalComm, get_group_size, get_rank

        if GlobalComm.INITED:
            return get_rank(), get_group_size()
    except Exception:
        pass
    return int(os.environ.get("RANK_ID", os.environ.get("RANK", 0))), int(
        os.environ.get("RANK_SIZE", os.environ.get("WORLD_SIZE", 1)))
