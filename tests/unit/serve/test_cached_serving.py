"""/v1/completions through the cached decoder (issue 28 item 3): a network that implements CachedDecoder
prefills each row's prompt into a static cache and decodes one token per row per step, and its answers equal
the full-forward fallback's: greedy tokens exactly, seeded samples exactly, echo values bit for bit (both
from the same scoring pass), generated tokens' log-probabilities and top-k within float rounding, stop
strings, EOS, max_tokens and the window rule alike. A network without the interface runs the fallback; the
cached graphs are compiled at start and a hot swap compiles nothing; the log says once which path serves."""

from __future__ import annotations

import logging
import queue
from types import SimpleNamespace

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")

from evald.cli.main import parse_config  # noqa: E402
from evald.config import ServeOptions  # noqa: E402
from evald.daemon.serving import Serving  # noqa: E402
from evald.pipeline.group.scoring import GroupScorer  # noqa: E402
from evald.pipeline.suites.scoring import TokenScorer  # noqa: E402
from evald.pipeline.suites.tokenizer import ByteTokenizer  # noqa: E402
from evald.serve import engine  # noqa: E402
from evald.serve.requests import parse_completion  # noqa: E402
from tests.networks import without_cached_decoding  # noqa: E402
from tests.unit.serve.rig import Pipeline, Rig, snapshot, until_ready  # noqa: E402

NETWORK_SEED = 5   # the network fixture's (tests/unit/conftest.py)
OPTIONS = ServeOptions(listen="127.0.0.1:0", batch_size=4, max_prompts=8, max_n=4)
ATOL = 2e-5   # cached vs full-forward logits (tests/unit/pipeline/test_llm_decoder.py): float rounding only


@pytest.fixture(scope="module")
def scorers(network):
    """The same weights behind the cached decoder and behind the full-forward fallback."""
    cached = TokenScorer(network, batch_size=OPTIONS.batch_size, top_k=OPTIONS.sample_top_k, fork_contexts=False)
    full = TokenScorer(without_cached_decoding(network), batch_size=OPTIONS.batch_size, top_k=OPTIONS.sample_top_k)
    assert (cached.decoding, full.decoding) == ("cached", "full-forward")
    return cached, full


def _request(body: dict, window: int = 64):
    return parse_completion(body, tokenizer=ByteTokenizer(), limits=OPTIONS, window=window, run_name="unit")


def _both(scorers, bodies: list[dict], tokenizer=None):
    """Each body's choices on the cached scorer and on the fallback; the cached run's scorer.score calls."""
    cached, full = scorers
    tokenizer = tokenizer or ByteTokenizer()
    requests = [_request(b) for b in bodies]
    calls = []
    score = cached.score

    def counting(asked):
        calls.append(len(asked))
        return score(asked)

    cached.score = counting
    try:
        got = engine.run_many(cached, tokenizer, requests)
    finally:
        del cached.score
    return got, engine.run_many(full, tokenizer, requests), calls


def _assert_same(got: list[list[engine.Choice]], want: list[list[engine.Choice]]) -> None:
    assert [len(c) for c in got] == [len(c) for c in want]
    for a, b in zip((c for cs in got for c in cs), (c for cs in want for c in cs)):
        assert (a.tokens, a.text, a.finish_reason) == (b.tokens, b.text, b.finish_reason)
        assert a.prompt_logprobs == b.prompt_logprobs and a.prompt_top == b.prompt_top   # the same scoring pass
        np.testing.assert_allclose(a.logprobs, b.logprobs, rtol=0, atol=ATOL)
        assert [[t for t, _ in top] for top in a.top] == [[t for t, _ in top] for top in b.top]
        np.testing.assert_allclose([[v for _, v in top] for top in a.top], [[v for _, v in top] for top in b.top],
                                   rtol=0, atol=ATOL)


def test_greedy_serving_equals_the_full_forward_with_echo_stop_eos_and_the_window(scorers):
    window = scorers[0].max_length
    edge = [(5 * i + 1) % 256 for i in range(window + 1)]
    bodies = [
        {"prompt": ["def f(x):", "for i in range(", "x" * 40], "max_tokens": 30, "temperature": 0, "echo": True,
         "logprobs": 3, "n": 2},
        {"prompt": "class A:\n    def", "max_tokens": 200 if window > 200 else 60, "temperature": 0},  # fills the window
        {"prompt": edge, "max_tokens": 1, "echo": True, "logprobs": 1, "temperature": 0},   # lm-eval's rolling window
        {"prompt": edge, "max_tokens": 5, "echo": True, "temperature": 0},                  # still one token
        {"prompt": edge[:window], "max_tokens": 4, "temperature": 0},                       # a full window: one token
        {"prompt": ["ab", "abc"], "max_tokens": 0, "echo": True, "logprobs": 2},            # echo only
    ]
    got, want, calls = _both(scorers, bodies)
    _assert_same(got, want)
    assert len(calls) == 1, calls     # one scoring pass (the echo values); every token after it is cached
    assert want[1][0].finish_reason == "length" and len(want[1][0].tokens) == window - len("class A:\n    def") + 1
    assert [len(c.tokens) for c in want[2] + want[3] + want[4]] == [1, 1, 1]
    prompt, tokens = max(zip(bodies[0]["prompt"], (c.tokens for c in want[0][::2])), key=lambda p: len(set(p[1])))
    new = next(j for j in range(1, len(tokens)) if tokens[j] not in tokens[:j])   # a token not made before
    text = ByteTokenizer().decode(tokens)
    cut = next(j for j in range(1, len(text)) if text[j] not in text[:j])
    stop = {"prompt": prompt, "max_tokens": 30, "temperature": 0, "stop": ["\x01\x02", text[cut]], "logprobs": 1}
    got, want, _ = _both(scorers, [stop])
    _assert_same(got, want)
    assert want[0][0].finish_reason == "stop" and want[0][0].text == text[:cut]
    eos = ByteTokenizer(eos_id=tokens[new])   # the row ends before it
    got, want, _ = _both(scorers, [dict(stop, stop=None)], eos)
    _assert_same(got, want)
    assert want[0][0].finish_reason == "stop" and want[0][0].tokens == tokens[:new]


def test_seeded_sampling_equals_the_full_forward_with_n_echo_logprobs_and_stop(scorers):
    bodies = [{"prompt": ["import numpy as np\n", "while True:"], "max_tokens": 40, "temperature": 0.8,
               "top_p": 0.9, "seed": 11, "n": 3, "echo": True, "logprobs": 2, "stop": ["\n\n", "qq"]},
              {"prompt": "x = ", "max_tokens": 25, "temperature": 1.3, "seed": 4, "n": 2}]
    got, want, calls = _both(scorers, bodies)
    _assert_same(got, want)
    assert len(calls) == 1, calls
    texts = {c.text for cs in want for c in cs}
    assert len(texts) > 3     # really sampled


def test_a_network_without_the_interface_serves_with_a_full_forward_per_token(scorers):
    _, full = scorers
    request = _request({"prompt": "def g(", "max_tokens": 7, "temperature": 0})
    calls = []
    score = full.score
    full.score = lambda asked: calls.append(len(asked)) or score(asked)
    try:
        [choice] = engine.run(full, ByteTokenizer(), request)
    finally:
        del full.score
    assert len(choice.tokens) == 7 and len(calls) == 7
    assert not any(shape[0].startswith("top") for shape in full._shapes)
    group = GroupScorer(SimpleNamespace(size=2), scorers[0], tensor_parallel=True)   # a cache cannot span commands
    assert (group.cached, group.decoding) == (False, "full-forward")


def test_cached_graphs_are_compiled_at_start_and_a_hot_swap_compiles_nothing(network):
    rig = Rig(network, OPTIONS, {10: snapshot(network, 1), 20: snapshot(network, 2)})
    try:
        scorer = rig.scorer
        compiled = scorer.compiled_graphs
        assert compiled == 3 * len(scorer.lengths)   # per bucket: scoring, a prefill chunk, a decode step
        body = {"prompt": ["a", "def h(x, y):\n    return", "z" * 50], "max_tokens": 12, "temperature": 0.7,
                "seed": 1, "n": 2, "echo": True, "logprobs": 1}
        answers = []
        for step in (10, 20, 10):
            rig.swap(step)
            answers.append(engine.run(rig.scorer, rig.tokenizer, _request(body)))
        assert scorer.compiled_graphs == compiled
        assert [c.tokens for c in answers[0]] == [c.tokens for c in answers[2]]
        assert [c.prompt_logprobs for c in answers[0]] != [c.prompt_logprobs for c in answers[1]]
    finally:
        rig.close()


@pytest.mark.parametrize("forward_only, path", [(False, "cached"), (True, "full-forward")])
def test_the_log_says_once_which_path_serves(network, caplog, forward_only, path):
    config = parse_config(["--serve", '{"listen": "127.0.0.1:0", "batch_size": 2}'], {}).config
    net = without_cached_decoding(network) if forward_only else network
    serving = Serving(config, Pipeline(net), queue.Queue())
    serving.start()
    try:
        with caplog.at_level(logging.INFO, logger="evald.serve"):
            until_ready(serving)
            for _ in range(3):
                serving.on_tick()
        said = [r.getMessage() for r in caplog.records if r.name == "evald.serve" and "completions" in r.getMessage()]
        assert len(said) == 1 and f"completions: {path}" in said[0], said
    finally:
        serving.close()
