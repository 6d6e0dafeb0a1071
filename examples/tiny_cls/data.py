"""Data factory for the classification example: seeded Gaussian blobs, one per class."""

from __future__ import annotations

import numpy as np


def validation_set(n: int = 300, features: int = 8, classes: int = 3, seed: int = 42
                   ) -> list[tuple[np.ndarray, np.int32]]:
    rng = np.random.default_rng(seed)
    centres = rng.normal(0, 2.0, size=(classes, features))
    labels = rng.integers(0, classes, size=n)
    points = centres[labels] + rng.normal(0, 1.5, size=(n, features))
    return [(points[i].astype(np.float32), np.int32(labels[i])) for i in range(n)]
