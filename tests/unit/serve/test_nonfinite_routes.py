"""Weights that give non-finite log-probabilities on every route (issue 35, still open from the third round):
completions and chat, with and without echo and logprobs, greedy and sampled, on the cached decoder and on
the full-forward path, with every weight NaN, with one token's embedding NaN (only prompts that hold it
break) and with Inf weights. Every answer is a strict JSON error naming the step (500), never a number, never
plain text; a prompt the broken token is not in is answered; streaming is refused (400)."""

from __future__ import annotations

import json

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")
httpx = pytest.importorskip("httpx")

from evald.config import ServeOptions  # noqa: E402
from evald.pipeline.suites.tokenizer import ByteTokenizer  # noqa: E402
from evald.serve.app import Context, build_app  # noqa: E402
from evald.serve.http_thread import HttpThread  # noqa: E402
from tests.networks import demo_network_in_graph_mode, without_cached_decoding  # noqa: E402
from tests.unit.serve.rig import Loop, Rig, snapshot  # noqa: E402

OPTIONS = ServeOptions(listen="127.0.0.1:0", batch_size=4, request_timeout_s=60, max_tokens=4)
Z = ord("z")


class ChatBytes(ByteTokenizer):
    """Bytes, with a chat template: the chat route on the demo model."""

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
        return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"


def _broken(net) -> dict[int, dict[str, np.ndarray]]:
    healthy = snapshot(net, 1)
    table = next(k for k in healthy if "tok" in k)
    every_nan, one_token, inf = (snapshot(net, s) for s in (2, 3, 4))
    every_nan[table][:] = np.nan
    one_token[table][Z] = np.nan
    inf[table][:, 0] = np.inf
    return {10: healthy, 30: every_nan, 40: one_token, 50: inf}


@pytest.fixture(scope="module", params=["cached", "full-forward"])
def served(request):
    with demo_network_in_graph_mode(seed=3) as net:
        network = net if request.param == "cached" else without_cached_decoding(net)
        rig = Rig(network, OPTIONS, _broken(network))
        context = Context(OPTIONS, ChatBytes(), rig.queue, rig.stats, rig.runner, window=rig.scorer.max_length)
        http = HttpThread(build_app(context), "127.0.0.1", 0, keep_alive_s=5, limit_concurrency=64,
                          header_timeout_s=10)
        http.start()
        try:
            with Loop(rig), httpx.Client(base_url=http.url, timeout=60) as client:
                yield client
        finally:
            http.stop()
            rig.close()


def _strict(text: str):
    def refuse(constant):
        raise AssertionError(f"{constant} in a JSON answer")

    return json.loads(text, parse_constant=refuse)


VARIANTS = [{"max_tokens": 0, "echo": True, "logprobs": 1}, {"max_tokens": 0, "echo": True},
            {"max_tokens": 1, "echo": True, "logprobs": 5, "temperature": 0},
            {"max_tokens": 3, "logprobs": 2, "temperature": 0}, {"max_tokens": 3, "temperature": 0.8, "seed": 1},
            {"max_tokens": 2, "n": 2, "echo": True, "logprobs": 1, "temperature": 0.5, "seed": 2}]


@pytest.mark.parametrize("step", [30, 40, 50])
@pytest.mark.parametrize("extra", VARIANTS, ids=lambda v: ",".join(f"{k}={v[k]}" for k in sorted(v)))
def test_completions_on_broken_weights_are_a_json_error_naming_the_step(served, step, extra):
    answer = served.post("/v1/completions", json={"model": f"unit@{step}", "prompt": "a z b", **extra})
    assert answer.status_code == 500 and answer.headers["content-type"] == "application/json", answer.text
    error = _strict(answer.text)["error"]
    assert f"step {step}" in error["message"] and "not finite" in error["message"], error
    assert error["type"] == "server_error" and error["code"] == 500, error


def test_a_prompt_without_the_broken_token_is_answered_with_finite_numbers(served):
    answer = served.post("/v1/completions", json={"model": "unit@40", "prompt": "abc", "max_tokens": 0,
                                                  "echo": True, "logprobs": 3})
    assert answer.status_code == 200, answer.text
    values = _strict(answer.text)["choices"][0]["logprobs"]["token_logprobs"]
    assert values[0] is None and all(np.isfinite(v) for v in values[1:])


@pytest.mark.parametrize("step", [30, 50])
@pytest.mark.parametrize("temperature", [0, 0.7])
def test_chat_on_broken_weights_is_a_json_error_naming_the_step(served, step, temperature):
    answer = served.post("/v1/chat/completions", json={"model": f"unit@{step}", "max_tokens": 2, "seed": 1,
                                                       "temperature": temperature,
                                                       "messages": [{"role": "user", "content": "hi"}]})
    assert answer.status_code == 500 and answer.headers["content-type"] == "application/json", answer.text
    assert f"step {step}" in _strict(answer.text)["error"]["message"]
    healthy = served.post("/v1/chat/completions", json={"model": "unit@10", "max_tokens": 2, "temperature": 0,
                                                        "messages": [{"role": "user", "content": "hi"}]})
    assert healthy.status_code == 200 and _strict(healthy.text)["model"] == "unit@10", healthy.text


def test_streaming_is_refused_on_every_completion_route(served):
    for path, body in (("/v1/completions", {"prompt": "a"}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}]})):
        answer = served.post(path, json={"model": "unit@30", "stream": True, **body})
        assert answer.status_code == 400 and _strict(answer.text)["error"]["param"] == "stream", answer.text
