"""Model factory for the classification example: features (B, F) -> logits (B, C)."""

from __future__ import annotations

import mindspore as ms
from mindspore import nn


def build_model(features: int = 8, classes: int = 3, hidden: int = 16, seed: int = 0) -> nn.Cell:
    ms.set_seed(seed)
    return nn.SequentialCell(nn.Dense(features, hidden), nn.ReLU(), nn.Dense(hidden, classes))
