"""The served window (issue 26 item 4): serve.max_length, else the network's max_length-like attribute, else the
suites' max_length; without any, one ERROR, nothing served, evald goes on. A prompt of window + 1 tokens with
echo is scored exactly as the in-process suite scores a rolling window (lm-eval's echo + max_tokens=1)."""

from __future__ import annotations

import logging
import queue

import pytest

ms = pytest.importorskip("mindspore")
httpx = pytest.importorskip("httpx")

from evald.cli.main import parse_config  # noqa: E402
from evald.config import ServeOptions  # noqa: E402
from evald.daemon.serving import Serving  # noqa: E402
from evald.pipeline.suites.scoring import ScoreRequest  # noqa: E402
from tests.unit.serve.rig import Loop, Pipeline, Rig, snapshot, until_ready  # noqa: E402

NETWORK_SEED = 6   # the network fixture's (tests/unit/conftest.py)


class Bare(ms.nn.Cell):
    """The demo network behind a Cell that has no max_length, seq_length, ... attribute (nor a config)."""

    def __init__(self, inner: ms.nn.Cell) -> None:
        super().__init__()
        self.inner = inner

    def construct(self, tokens):
        return self.inner(tokens)


def _serving(network, *argv: str) -> Serving:
    config = parse_config(list(argv), {}).config
    serving = Serving(config, Pipeline(Bare(network)), queue.Queue())
    serving.start()
    return serving


@pytest.mark.parametrize("argv, window", [
    (["--serve", '{"listen": "127.0.0.1:0", "max_length": 48, "batch_size": 2}'], 48),
    (["--serve", '{"listen": "127.0.0.1:0", "batch_size": 2}', "--suites",
      '{"a": {"tasks": ["x"], "max_length": 40}, "b": {"tasks": ["y"], "max_length": 32}}'], 32),
])
def test_serve_max_length_or_the_suites_give_the_window_of_a_network_without_one(network, argv, window):
    serving = _serving(network, *argv)
    try:
        ticks = until_ready(serving)
        assert serving.scorer is not None and serving.scorer.max_length == window
        assert ticks > serving.scorer.compiled_graphs // 2   # its graphs compiled over several turns
        with httpx.Client(base_url=serving.http.url, timeout=60) as client:
            assert client.get("/tokenizer_info").json()["evald"]["window"] == window
            assert client.get("/health").json()["ok"] is True
    finally:
        serving.close()


def test_without_any_window_one_error_nothing_served_and_evald_goes_on(network, caplog):
    serving = _serving(network, "--serve", '{"listen": "127.0.0.1:0", "batch_size": 2}')
    try:
        with caplog.at_level(logging.INFO, logger="evald.serve"):
            for _ in range(3):
                serving.on_tick()          # on main: ValueError out of evald's loop, exit 1
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(errors) == 1 and "serve.max_length" in errors[0].getMessage(), errors
        with httpx.Client(base_url=serving.http.url, timeout=60) as client:
            health = client.get("/health").json()
            answer = client.post("/v1/completions", json={"prompt": "a", "max_tokens": 1})
        assert health["ok"] is False and "serve.max_length" in health["error"]
        assert answer.status_code == 503 and "serve.max_length" in answer.json()["error"]["message"]
    finally:
        serving.close()


def test_a_prompt_of_window_plus_one_tokens_is_scored_as_a_rolling_window(network):
    """lm-eval's local-completions sends a rolling window as context + continuation (window + 1 tokens) with
    echo and max_tokens=1, and drops the last log-probability (the generated token's)."""
    rig = Rig(network, ServeOptions(listen="127.0.0.1:0", batch_size=4), {10: snapshot(network, 1)})
    rig.swap(10)
    window = rig.scorer.max_length
    tokens = [(7 * i + 3) % 256 for i in range(window + 1)]
    try:
        with Loop(rig), httpx.Client(base_url=rig.url, timeout=60) as client:
            answer = client.post("/v1/completions", json={"model": "unit@10", "prompt": tokens, "max_tokens": 1,
                                                          "echo": True, "logprobs": 1, "temperature": 0})
            plain = client.post("/v1/completions", json={"model": "unit@10", "prompt": tokens, "max_tokens": 1})
        assert answer.status_code == 200, answer.text
        served = answer.json()["choices"][0]["logprobs"]["token_logprobs"]
        [expected] = rig.scorer.score([ScoreRequest(tokens[:1], tokens[1:])])
        assert len(served) == window + 2 and served[0] is None
        assert served[1:window + 1] == [float(v) for v in expected.logprobs]     # bit for bit
        assert plain.status_code == 400 and f"at most {window}" in plain.json()["error"]["message"]
    finally:
        rig.close()
