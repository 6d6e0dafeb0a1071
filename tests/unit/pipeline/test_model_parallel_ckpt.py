"""Issue 29: a legacy per-rank file of a model-parallel job (``checkpoint_network/rank_0`` holding only
rank 0's shard) is a clear error naming what is missing, the strategy file, and MindSpore's own way
through (``convert_checkpoints`` / ``unified_safetensors``); a data-parallel job's rank_0 (every rank
the same whole weights) still loads. Real files written by MindSpore's ``save_checkpoint``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")

from evald.files.errors import CheckpointError  # noqa: E402
from evald.files.recognise import FOREIGN_WEIGHTS  # noqa: E402
from evald.pipeline.swap.hot_swap import NetworkWeights  # noqa: E402
from evald.pipeline.swap.weights import load_into  # noqa: E402
from examples.tiny_lm import model  # noqa: E402

SIZE = {"d_model": 16, "seq_len": 8, "n_heads": 2, "vocab_size": 32, "n_layers": 1}


def _save(path: Path, arrays: dict[str, np.ndarray]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    ms.save_checkpoint([{"name": n, "data": ms.Tensor(a)} for n, a in arrays.items()], str(path))
    return path


def test_rank_0_of_a_model_parallel_job_names_the_missing_strategy_file_and_the_way_through(tmp_path):
    net = model.build_model(**SIZE, seed=1)
    whole = {n: p.asnumpy().copy() for n, p in net.parameters_and_names()}
    out = tmp_path / "output" / "checkpoint_network"
    for rank in range(2):  # tensor parallel 2: each rank saved its half of every matrix
        shard = {n: (np.array_split(a, 2)[rank] if a.ndim == 2 else a) for n, a in whole.items()}
        path = _save(out / f"rank_{rank}" / f"llama_rank_{rank}-network-1_10.ckpt", shard)
    with pytest.raises(CheckpointError) as caught:
        load_into(NetworkWeights(net), out / "rank_0" / "llama_rank_0-network-1_10.ckpt", FOREIGN_WEIGHTS)
    text = str(caught.value)
    assert "shape mismatch" in text                                      # what did not fit, as before
    assert "2 ranks" in text and "holds only its shard" in text and "strategy file" in text
    assert "mindspore.parallel.convert_checkpoints(" in text and "mindspore.parallel.unified_safetensors(" in text
    assert path.exists()


def test_rank_0_of_a_data_parallel_job_still_loads(tmp_path):
    net = model.build_model(**SIZE, seed=1)
    whole = {n: p.asnumpy() + 0.25 for n, p in net.parameters_and_names()}
    out = tmp_path / "output" / "checkpoint_network"
    for rank in range(2):
        _save(out / f"rank_{rank}" / f"llama_rank_{rank}-network-1_10.ckpt", whole)
    load_into(NetworkWeights(net), out / "rank_0" / "llama_rank_0-network-1_10.ckpt", FOREIGN_WEIGHTS)
    assert all(np.array_equal(p.asnumpy(), whole[n]) for n, p in net.parameters_and_names())
