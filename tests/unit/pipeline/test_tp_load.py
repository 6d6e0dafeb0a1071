"""A tensor-parallel eval rank's weights from any stored layout (evald.pipeline.swap.tp_load): the rank's
network says what it holds (whole, or 1/N of one dimension), and exactly that is read."""

from __future__ import annotations

import numpy as np
import pytest

from bench.reshard_read import llama_weights, write_tp
from evald.contracts import layout
from evald.contracts.partition import group_name
from evald.files.errors import CheckpointError
from evald.files.recognise import CHECKPOINT2, EVALD, FOREIGN, PARTS
from evald.files.slices import tp_region
from evald.pipeline.swap.tp_load import read_rank
from tests.checkpoint2_layout import CUT, WEIGHTS, save as _save


def _rank_specs(weights, cuts, degree, rank, prefix=""):
    """The shapes a rank's network built for this degree holds."""
    return {prefix + n: (tuple(b - a for a, b in tp_region(a.shape, cuts.get(n), degree, rank)), a.dtype)
            for n, a in weights.items()}


def _expected(weights, cuts, degree, rank):
    return {n: a[tuple(slice(x, y) for x, y in tp_region(a.shape, cuts.get(n), degree, rank))]
            for n, a in weights.items()}


@pytest.mark.parametrize("written,degree", [(4, 2), (4, 1), (2, 4), (1, 2)])
def test_evald_parts_of_any_tp_degree_give_each_rank_its_slices(tmp_path, written, degree):
    weights, cuts = llama_weights(hidden=16, layers=1, vocab=32)
    if written == 1:
        layout.write_checkpoint(tmp_path, 10, weights, run_id="r")
        path, kind = tmp_path / layout.step_dir_name(10), EVALD
    else:
        write_tp(tmp_path, 10, weights, cuts, written)
        path, kind = tmp_path / group_name(10, written), PARTS
    for rank in range(degree):
        got = read_rank(path, kind, _rank_specs(weights, cuts, degree, rank, prefix="net."), degree, rank)
        want = _expected(weights, cuts, degree, rank)
        assert {n[4:] for n in got.arrays} == set(want)                  # fitted to the network's names
        assert all(np.array_equal(got.arrays["net." + n], a) for n, a in want.items())
        assert got.bytes_read == sum(a.nbytes for a in want.values())   # only its share
        live = {n: np.zeros(shape, dtype) for n, (shape, dtype) in _rank_specs(weights, cuts, degree, rank,
                                                                                 prefix="net.").items()}
        into = read_rank(path, kind, _rank_specs(weights, cuts, degree, rank, prefix="net."), degree, rank, into=live)
        assert all(into.arrays[n] is live[n] for n in live)              # read into the parameters' memory
        assert all(np.array_equal(live["net." + n], a) for n, a in want.items())


def test_a_checkpoint2_iteration_gives_each_rank_its_slices_never_an_optimizer_byte(tmp_path):
    iter_dir = _save(tmp_path / "checkpoint", 10, 2)
    for opt in iter_dir.glob("*-opt-*"):
        opt.write_bytes(b"")                                            # never read
    for rank in range(2):
        got = read_rank(iter_dir, CHECKPOINT2, _rank_specs(WEIGHTS, CUT, 2, rank), 2, rank)
        want = _expected(WEIGHTS, CUT, 2, rank)
        assert all(np.array_equal(got.arrays[n], a) for n, a in want.items())


def test_a_rank_network_that_is_not_a_slice_of_the_checkpoint_is_an_error_naming_it(tmp_path):
    iter_dir = _save(tmp_path / "checkpoint", 10, 2)
    specs = _rank_specs(WEIGHTS, CUT, 2, 0)
    specs["emb.weight"] = ((3, 6), np.dtype(np.float32))
    with pytest.raises(CheckpointError, match=r"emb.weight: rank holds \[3, 6\], checkpoint \[8, 6\]"):
        read_rank(iter_dir, CHECKPOINT2, specs, 2, 0)
    specs = _rank_specs(WEIGHTS, CUT, 2, 0)
    del specs["norm.gamma"]
    with pytest.raises(CheckpointError, match="unexpected parameters"):
        read_rank(iter_dir, CHECKPOINT2, specs, 2, 0)


def test_a_foreign_file_is_refused_for_a_tp_rank_with_what_to_use(tmp_path):
    with pytest.raises(CheckpointError, match="read whole by MindSpore's loader"):
        read_rank(tmp_path / "x.ckpt", FOREIGN, {}, 2, 0)
