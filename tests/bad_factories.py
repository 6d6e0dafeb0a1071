"""Data factories of the wrong shape, as a new user writes them (used by tests/unit/daemon/test_bad_configuration_in_process.py)."""

from __future__ import annotations

from examples.tiny_lm.data import validation_windows


def input_label_pairs(seq_len: int = 64):
    """(inputs, labels) pairs: what a training pipeline yields, not the lm task's T+1 windows."""
    return [(w[:-1], w[1:]) for w in validation_windows(seq_len)]
