"""The fixed validation subset: same samples every time, fixed batch shapes."""

from __future__ import annotations

import numpy as np
import pytest

from evald.pipeline.subset import fixed_batches, select_subset


def test_same_seed_same_samples_different_seed_different_samples():
    a = select_subset(1000, 64, seed=1234)
    assert np.array_equal(a, select_subset(1000, 64, seed=1234))
    assert not np.array_equal(a, select_subset(1000, 64, seed=1235))
    assert len(set(a.tolist())) == 64 and np.all(np.diff(a) > 0)


def test_subset_larger_than_data_takes_everything():
    assert select_subset(10, 64, seed=0).tolist() == list(range(10))
    with pytest.raises(ValueError, match="empty"):
        select_subset(0, 4, seed=0)


def test_batches_have_one_shape_and_padding_has_zero_weight():
    data = np.arange(10 * 3).reshape(10, 3)
    batches = fixed_batches(data, range(10), batch_size=4)
    assert [b.arrays[0].shape for b in batches] == [(4, 3)] * 3
    assert batches[-1].weights.tolist() == [1, 1, 0, 0]
    assert sum(b.weights.sum() for b in batches) == 10


def test_tuple_items_become_parallel_arrays():
    data = [(np.full(2, i, np.float32), np.int64(i % 2)) for i in range(5)]
    [batch] = fixed_batches(data, range(5), batch_size=5)
    assert batch.arrays[0].shape == (5, 2) and batch.arrays[1].tolist() == [0, 1, 0, 1, 0]


def test_the_subset_record_reproduces_the_indices_and_says_when_data_is_short(caplog):
    import json

    from evald.pipeline.subset import SubsetInfo

    info = SubsetInfo.of(select_subset(1000, 10, 3), num_samples=1000, requested=10, seed=3)
    data = json.loads(info.to_json())
    assert data["indices"] == list(select_subset(1000, 10, 3)) and len(data["sha256"]) == 64
    assert "default_rng(seed)" in data["rule"]
    assert caplog.records == []
    with caplog.at_level("WARNING", logger="evald.pipeline.subset"):
        short = SubsetInfo.of(select_subset(5, 10, 3), num_samples=5, requested=10, seed=3)
    assert short.indices == (0, 1, 2, 3, 4)
    assert "has 5 samples, fewer than --subset-size 10: every sample is evaluated" in caplog.text
