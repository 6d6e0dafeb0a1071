"""A bigram language model for tests whose eval loss is set by its checkpoints' weights.

``build_bigram`` is a model factory evald can call (``tests.noise_models:build_bigram``): logits
are a row of a 256 x 256 table per input byte. ``bigram_table`` is the maximum-likelihood table
of the demo corpus's training part, so the loss on real text has the spread of a real model's.
"""

from __future__ import annotations

import numpy as np
from mindspore import nn


class Bigram(nn.Cell):
    def __init__(self, vocab_size: int = 256) -> None:
        super().__init__()
        self.table = nn.Embedding(vocab_size, vocab_size)

    def construct(self, tokens):
        return self.table(tokens)


def build_bigram(vocab_size: int = 256) -> Bigram:
    return Bigram(vocab_size)


def bigram_table() -> np.ndarray:
    """Log-probabilities of the next byte given this one, add-one smoothed, from the training text."""
    from examples.tiny_lm import data

    train, _ = data.split(data.corpus_bytes())
    counts = np.ones((256, 256))
    np.add.at(counts, (train[:-1], train[1:]), 1)
    return np.log(counts / counts.sum(axis=1, keepdims=True)).astype(np.float32)
