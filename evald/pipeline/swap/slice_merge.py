"""Whole parameters from their slices, with MindSpore's own tools.

A tensor-parallel slice comes with the layout MindSpore reported for it
(``dev_matrix``, ``tensor_map``; evald.contracts.partition). evald writes those
layouts as a strategy file in MindSpore's JSON format, reads it back with
``mindspore.parallel.build_searched_strategy`` and merges with
``mindspore.parallel.merge_sliced_parameter``, which wants one slice per device
in device order: devices that hold the same slice (replicas, written once) get
the same array. Slices without a layout (a replicated parameter cut along its
first dimension so that several ranks share its bytes) are merged by
``merge_sliced_parameter`` without a strategy, which joins them along that
dimension in order (evald.files.parts reads those straight into the parameter's
rows instead when it can).

UNTESTED on a real tensor-parallel job: MindSpore 2.10 refuses semi-auto
parallel on CPU. tests/unit/pipeline/test_partitions.py checks the merge, bit for bit, on
parameters cut by the documented layout rule.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Mapping, Sequence

import numpy as np

from evald.contracts.partition import SliceSpec


def merge_slices(sliced: Mapping[str, Sequence[tuple[SliceSpec, np.ndarray]]]) -> dict[str, np.ndarray]:
    """``{name: full array}`` from ``{name: [(slice, array), ...]}`` (the slices already tile each parameter)."""
    import mindspore as ms
    from mindspore.parallel import build_searched_strategy, merge_sliced_parameter

    with_layout = {n: pieces for n, pieces in sliced.items() if pieces[0][0].layout is not None}
    strategy = _strategy(with_layout, build_searched_strategy) if with_layout else None
    merged = {}
    for name, pieces in sliced.items():
        spec = pieces[0][0]
        if spec.layout is None:
            ordered = [array for _, array in sorted(pieces, key=lambda p: p[0].region[0][0])]
            parameter = merge_sliced_parameter([ms.Parameter(ms.Tensor(a), name=name) for a in ordered])
        else:
            by_region = {s.region: array for s, array in pieces}
            per_device = [by_region[spec.layout.region(spec.global_shape, d)]
                          for d in range(spec.layout.device_count)]
            parameter = merge_sliced_parameter([ms.Parameter(ms.Tensor(a), name=name) for a in per_device],
                                               {name: strategy[name]})  # type: ignore[index]
        full = parameter.asnumpy()
        if full.dtype != pieces[0][1].dtype:  # bfloat16 is merged as float32 (exactly): give it back its dtype
            full = full.astype(pieces[0][1].dtype)
        merged[name] = full.reshape(spec.global_shape)
    return merged


def _strategy(sliced: Mapping[str, Sequence[tuple[SliceSpec, np.ndarray]]], build_searched_strategy) -> dict:
    """MindSpore's parsed strategy for ``sliced``, from a strategy file in its JSON format."""
    items = {}
    for name, pieces in sliced.items():
        layout = pieces[0][0].layout
        assert layout is not None
        items[name] = {"dev_matrix": list(layout.dev_matrix), "tensor_map": list(layout.tensor_map),
                       "param_split_shape": [], "indices_offset": [], "field": 0,
                       "opt_weight_shard_size": 0, "opt_weight_shard_step": 0}
    with tempfile.TemporaryDirectory(prefix="evald-strategy-") as tmp:
        path = os.path.join(tmp, "strategy.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"current_stage": 0, "parallel_layout_item": items}, f)
        return build_searched_strategy(path)
