"""The fixed validation subset: the same samples, in the same fixed-shape batches, every time.

The selection rule (docs/metrics.md, "The fixed subset"), from the validation set's
length N alone, so every checkpoint and every restart sees the same samples:

    indices = sorted(numpy.random.default_rng(SEED).choice(N, size=min(SIZE, N), replace=False))

evald records the indices and their sha256 in ``LOGDIR/subset.json`` and shows the hash
in TensorBoard; ``evald subset`` prints them (docs/metrics.md). Batches all have
``batch_size`` rows (the last one is padded by repeating samples with weight 0), so a
Graph-mode network compiles once.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

log = logging.getLogger("evald.pipeline.subset")

RULE = "sorted(numpy.random.default_rng(seed).choice(num_samples, size=min(subset_size, num_samples), replace=False))"


def select_subset(num_samples: int, subset_size: int, seed: int) -> np.ndarray:
    """Sorted indices of ``min(subset_size, num_samples)`` distinct samples, fixed by ``seed``."""
    if num_samples <= 0:
        raise ValueError("the validation set is empty; check the data factory")
    size = min(int(subset_size), num_samples)
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(num_samples, size=size, replace=False))


@dataclass(frozen=True)
class SubsetInfo:
    """Which samples were used: enough to reproduce an evaluation in process."""

    indices: tuple[int, ...]
    num_samples: int
    requested: int
    seed: int
    sha256: str

    @classmethod
    def of(cls, indices: Sequence[int], *, num_samples: int, requested: int, seed: int) -> "SubsetInfo":
        ints = tuple(int(i) for i in indices)
        digest = hashlib.sha256(",".join(map(str, ints)).encode()).hexdigest()
        info = cls(ints, num_samples, requested, seed, digest)
        if num_samples < requested:
            log.warning("the validation set has %d samples, fewer than --subset-size %d: every sample is "
                        "evaluated (subset %s)", num_samples, requested, digest[:12])
        return info

    def describe(self) -> str:
        return (f"subset of {len(self.indices)} of {self.num_samples} samples (seed {self.seed}, sha256 "
                f"{self.sha256[:12]})")

    def to_json(self) -> str:
        return json.dumps({"rule": RULE, "num_samples": self.num_samples, "subset_size": self.requested,
                           "seed": self.seed, "count": len(self.indices), "sha256": self.sha256,
                           "sha256_of": "the indices as decimal numbers joined by ','",
                           "indices": list(self.indices)})


@dataclass(frozen=True)
class Batch:
    arrays: tuple[np.ndarray, ...]   # each with leading dimension batch_size
    weights: np.ndarray              # (batch_size,) 1.0 for real rows, 0.0 for padding


def fixed_batches(dataset: Any, indices: Sequence[int], batch_size: int) -> list[Batch]:
    """Materialise the subset as host batches of identical shape.

    ``dataset`` is an array (rows are samples), or anything indexable whose
    items are arrays or tuples of arrays (e.g. ``(features, label)``).
    """
    rows = [_as_tuple(dataset[int(i)]) for i in indices]
    batches = []
    for start in range(0, len(rows), batch_size):
        chunk = rows[start:start + batch_size]
        real = len(chunk)
        chunk = chunk + [chunk[0]] * (batch_size - real)
        arrays = tuple(np.stack([np.asarray(row[j]) for row in chunk]) for j in range(len(chunk[0])))
        weights = np.zeros(batch_size, dtype=np.float64)
        weights[:real] = 1.0
        batches.append(Batch(arrays, weights))
    return batches


def _as_tuple(item: Any) -> tuple:
    if isinstance(item, tuple):
        return item
    if isinstance(item, dict):
        return tuple(item.values())
    return (item,)
