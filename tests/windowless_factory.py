"""A model factory whose network says nothing of its window: the demo GPT with its ``max_length`` attribute
taken away, as a model built outside MindFormers may be (no max_length, seq_length, seq_len or
max_position_embeddings). tests/e2e/test_serve_window.py serves it."""

from __future__ import annotations

from examples.tiny_lm.model import TinyGPT, build_model as _demo


def build_model(**kwargs) -> TinyGPT:
    network = _demo(**kwargs)
    network.max_length = None   # evald.pipeline.suites.scoring.model_max_length finds nothing now
    return network
