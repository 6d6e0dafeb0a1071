"""The fixed validation subset: the same samples, in the same fixed-shape batches, every time.

The subset is drawn with a seeded generator from the validation set's length
alone, so every checkpoint and every restart of evald sees the same samples.
Batches all have ``batch_size`` rows (the last one is padded by repeating
samples with weight 0), so a Graph-mode network compiles once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np


def select_subset(num_samples: int, subset_size: int, seed: int) -> np.ndarray:
    """Sorted indices of ``min(subset_size, num_samples)`` distinct samples, fixed by ``seed``."""
    if num_samples <= 0:
        raise ValueError("the validation set is empty; check the data factory")
    size = min(int(subset_size), num_samples)
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(num_samples, size=size, replace=False))


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
