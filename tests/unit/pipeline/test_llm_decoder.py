"""The LLM-shaped example decoder (examples/llm_decoder): its cached decoding gives the full forward's
logits up to float rounding, and evald's cached greedy tokens equal the full-forward fallback's."""

from __future__ import annotations

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")

from evald.pipeline.suites.scoring import GenerateRequest, TokenScorer  # noqa: E402
from tests.networks import without_cached_decoding  # noqa: E402
from evald.pipeline.tasks.generation import ExtendStep  # noqa: E402
from examples.llm_decoder.model import build_model  # noqa: E402


@pytest.fixture(scope="module")
def network(graph_mode):  # tests/unit/conftest.py
    net = build_model(vocab_size=500, d_model=64, n_layers=2, n_heads=4, max_length=64, seed=2)
    net.set_train(False)
    return net


def test_chunked_prefill_and_decode_give_the_full_forward_logits(network):
    tokens = np.random.default_rng(0).integers(1, 500, (2, 40)).astype(np.int32)
    full = network(ms.Tensor(tokens)).asnumpy()
    step = ExtendStep(network)
    step.set_train(False)
    cache = network.init_cache(2, 48)
    logits, cache = step(ms.Tensor(tokens[:, :32]), ms.Tensor(np.zeros(2, np.int32)),
                         ms.Tensor(np.array([31, 20], np.int32)), cache)
    np.testing.assert_allclose(logits.asnumpy(), full[[0, 1], [31, 20]], rtol=0, atol=2e-5)
    for position in range(32, 40):
        logits, cache = step(ms.Tensor(tokens[:, position:position + 1]), ms.Tensor(np.full(2, position, np.int32)),
                             ms.Tensor(np.zeros(2, np.int32)), cache)
        np.testing.assert_allclose(logits.asnumpy(), full[:, position], rtol=0, atol=2e-5)


def test_cached_greedy_tokens_equal_the_fallback(network):
    rng = np.random.default_rng(1)
    requests = [GenerateRequest(rng.integers(1, 500, n).tolist(), m) for n, m in ((3, 9), (20, 12), (45, 18), (70, 6))]
    cached = TokenScorer(network, batch_size=1, lengths=(32, 64))
    fallback = TokenScorer(without_cached_decoding(network), batch_size=1, lengths=(32, 64))
    assert (cached.decoding, fallback.decoding) == ("cached", "full-forward")
    assert cached.generate(requests) == fallback.generate(requests)
