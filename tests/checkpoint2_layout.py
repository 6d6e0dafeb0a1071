"""MindFormers Checkpoint 2.0 directories in the layout ``mindformers.checkpoint.save_checkpoint`` (2.0.0)
writes (file names, metadata.json, common.json, the tracker file), written in milliseconds with evald's
own safetensors writer, for in-process tests of the rules. tests/mindformers_ckpt2_writer.py runs
MindFormers' own writer for the real-process test."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from evald.contracts import safetensors_io as sio

WEIGHTS = {"emb.weight": np.arange(8 * 6, dtype=np.float32).reshape(8, 6),
           "proj.weight": np.arange(6 * 4, dtype=np.float32).reshape(6, 4) / 10,
           "norm.gamma": np.ones(6, np.float32)}
CUT = {"emb.weight": 0, "proj.weight": 1}  # Megatron: vocabulary rows; a row-parallel layer's columns


def cut(name, array, rank, world):
    dim = CUT.get(name) if world > 1 else None
    offset = [0] * array.ndim
    if dim is None:
        return array, offset
    size = array.shape[dim] // world
    offset[dim] = rank * size
    index = [slice(None)] * array.ndim
    index[dim] = slice(rank * size, (rank + 1) * size)
    return np.ascontiguousarray(array[tuple(index)]), offset


def save(checkpoint: Path, step: int, world: int = 2, *, tracker: bool = True, weights=WEIGHTS,
          metadata: bool | None = None) -> Path:
    """One save as mindformers.checkpoint.save_checkpoint lays it out (prefix "llama")."""
    iter_dir = checkpoint / f"iteration_{step:08d}"
    iter_dir.mkdir(parents=True)
    state, storage = {}, {}
    for rank in range(world):
        model = f"llama-model-{rank:07d}-{world:07d}.safetensors"
        pieces = [(n, cut(n, a, rank, world)[0]) for n, a in weights.items()]
        sio.write_file(iter_dir / model, pieces, "sha256")
        sio.write_file(iter_dir / f"llama-opt-{rank:07d}-{world:07d}.safetensors",
                       [(f"adam_m.{n}", p) for n, p in pieces], "sha256")
        for name, array in weights.items():
            piece, offset = cut(name, array, rank, world)
            meta = state.setdefault(name, {"properties": {"dtype": "Float32", "replica_id": 0},
                                           "global_shape": list(array.shape), "axis_fragmentations": None,
                                           "layout": None, "chunk": []})
            chunk = {"global_offset": offset if name in CUT else [0], "local_shape": list(piece.shape)}
            if chunk not in meta["chunk"]:
                meta["chunk"].append(chunk)
            key = str((name, tuple(chunk["global_offset"])))
            storage.setdefault(key, []).append({"file_name": model, "storage_rank": rank, "rank_group": [rank]})
            storage.setdefault(str((f"adam_m.{name}", tuple(chunk["global_offset"]))), []).append(
                {"file_name": model.replace("-model-", "-opt-"), "storage_rank": rank, "rank_group": [rank]})
            state.setdefault(f"adam_m.{name}", {**meta, "chunk": meta["chunk"]})
    (iter_dir / "common.json").write_text(json.dumps({"epoch_num": 1, "step_num": step, "global_step": step,
                                                      "loss_scale": 1.0, "global_batch_size": 8,
                                                      "ckpt_status": None}))
    if metadata if metadata is not None else world > 1:
        (iter_dir / "metadata.json").write_text(json.dumps({"state_dict_metadata": state, "storage_data": storage}))
    if tracker:
        (checkpoint / "latest_checkpointed_iteration.txt").write_text(str(step))
    return iter_dir




def many_chunks(checkpoint: Path, step: int, grid: tuple[int, int], *, world: int = 8, tracker: bool = True
                ) -> Path:
    """An iteration whose one parameter ``w`` (float32, ``2*rows`` x ``2*cols``) is stored as ``rows * cols``
    chunks of 2x2, spread over ``world`` model files (empty: only ``metadata.json`` is read to plan it, as
    the intake does), and ``common.json``: the metadata of a large model in a few megabytes."""
    rows, cols = grid
    iter_dir = checkpoint / f"iteration_{step:08d}"
    iter_dir.mkdir(parents=True)
    files = [f"llama-model-{rank:07d}-{world:07d}.safetensors" for rank in range(world)]
    for name in files:
        (iter_dir / name).write_bytes(b"")
    chunks, storage = [], {}
    for index, (r, c) in enumerate((r, c) for r in range(rows) for c in range(cols)):
        chunks.append({"global_offset": [2 * r, 2 * c], "local_shape": [2, 2]})
        storage[str(("w", (2 * r, 2 * c)))] = [{"file_name": files[index % world], "storage_rank": index % world}]
    state = {"w": {"properties": {"dtype": "Float32", "replica_id": 0}, "global_shape": [2 * rows, 2 * cols],
                   "axis_fragmentations": [rows, cols], "layout": None, "chunk": chunks}}
    (iter_dir / "metadata.json").write_text(json.dumps({"state_dict_metadata": state, "storage_data": storage}))
    (iter_dir / "common.json").write_text(json.dumps({"epoch_num": 1, "step_num": step, "ckpt_status": None}))
    if tracker:
        (checkpoint / "latest_checkpointed_iteration.txt").write_text(str(step))
    return iter_dir
