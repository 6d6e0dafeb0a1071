"""The endpoint over real HTTP on loopback, with the real scorer on the demo model: answers name their
weights, log-probabilities equal an independent computation, A/B/A is bit-identical, and what must be
refused is refused (bad bodies, oversize, slowloris, a full queue, no token)."""

from __future__ import annotations

import socket
import threading

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")
httpx = pytest.importorskip("httpx")

from evald.config import ServeOptions  # noqa: E402
from tests.harness import wait_for  # noqa: E402
from tests.unit.serve.rig import Loop, Rig, snapshot  # noqa: E402

NETWORK_SEED = 3   # the network fixture's (tests/unit/conftest.py)
OPTIONS = ServeOptions(listen="127.0.0.1:0", batch_size=4, queue_size=8, max_body_bytes=4096,
                       header_timeout_s=1.0, request_timeout_s=30.0)


@pytest.fixture(scope="module")
def rig(network):
    r = Rig(network, OPTIONS, {10: snapshot(network, 1), 20: snapshot(network, 2)})
    r.swap(10)
    yield r
    r.close()


def _reference(network, tokens: list[int]) -> np.ndarray:
    """Independent: PyNative, the exact unpadded sequence, batch of one, MindSpore float32 log_softmax."""
    ms.set_context(mode=ms.PYNATIVE_MODE)
    try:
        logits = network(ms.Tensor(np.asarray([tokens[:-1]], np.int32)))
        logp = ms.ops.log_softmax(logits.astype(ms.float32), -1).asnumpy()[0]
    finally:
        ms.set_context(mode=ms.GRAPH_MODE)
    return logp[np.arange(len(tokens) - 1), np.asarray(tokens[1:])]


def _echo(client, model: str, prompt, **extra) -> httpx.Response:
    return client.post("/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": 0, "echo": True,
                                                "logprobs": 1, "temperature": 0, **extra})


def test_echo_logprobs_name_their_weights_and_equal_an_independent_computation(rig, network):
    with Loop(rig), httpx.Client(base_url=rig.url, timeout=60) as client:
        response = _echo(client, "unit@10", "def fib(n):\n    return n")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model"] == "unit@10" and body["evald"] == {"run": "unit", "step": 10, "snapshot": rig.digests[10]}
    assert response.headers["x-evald-step"] == "10" and response.headers["x-evald-snapshot"] == rig.digests[10]
    logprobs = body["choices"][0]["logprobs"]
    tokens = list(b"def fib(n):\n    return n")
    assert logprobs["token_logprobs"][0] is None and len(logprobs["token_logprobs"]) == len(tokens)
    assert logprobs["tokens"] == [chr(t) for t in tokens] and logprobs["text_offset"] == list(range(len(tokens)))
    assert body["choices"][0]["text"] == "def fib(n):\n    return n"
    rig.swap(10)
    expected = _reference(network, tokens)
    np.testing.assert_allclose(logprobs["token_logprobs"][1:], expected, rtol=0, atol=2e-6)
    for value, top in zip(logprobs["token_logprobs"][1:], logprobs["top_logprobs"][1:]):
        assert max(top.values()) >= value   # lm-eval's greedy test reads exactly this


def test_a_b_a_gives_bit_identical_logprobs(rig):
    prompts = ["import os\nimport sys", "class A:\n    pass", "x = [i * i for i in range(10)]"]
    with Loop(rig), httpx.Client(base_url=rig.url, timeout=60) as client:
        seen = [(model, _echo(client, model, prompts).json()) for model in ("unit@10", "unit@20", "unit@10")]
    first, second, third = ([c["logprobs"]["token_logprobs"] for c in body["choices"]] for _, body in seen)
    assert [body["evald"]["step"] for _, body in seen] == [10, 20, 10]
    assert first == third            # bit for bit: JSON floats round-trip a float32 exactly
    assert first != second           # B really is other weights


def test_generation_is_greedy_or_seeded_and_stops_where_asked(rig):
    with Loop(rig), httpx.Client(base_url=rig.url, timeout=60) as client:
        greedy = [client.post("/v1/completions", json={"model": "unit@20", "prompt": "for i in ", "max_tokens": 6,
                                                       "temperature": 0, "logprobs": 2}).json() for _ in range(2)]
        sampled = [client.post("/v1/completions", json={"model": "unit@20", "prompt": "for i in ", "max_tokens": 6,
                                                        "temperature": 0.9, "top_p": 0.9, "seed": s, "n": 2}).json()
                   for s in (5, 5, 6)]
        stopped = client.post("/v1/completions", json={"model": "unit@20", "prompt": "for i in ", "max_tokens": 6,
                                                       "temperature": 0, "stop": greedy[0]["choices"][0]["text"][2:4]})
    assert greedy[0]["choices"] == greedy[1]["choices"]
    choice = greedy[0]["choices"][0]
    assert len(choice["logprobs"]["tokens"]) == 6 and choice["finish_reason"] == "length"
    assert all(len(top) <= 2 for top in choice["logprobs"]["top_logprobs"])
    assert sampled[0]["choices"] == sampled[1]["choices"]     # same seed, same tokens
    texts = {c["text"] for body in sampled for c in body["choices"]}
    assert len(texts) > 1
    cut = stopped.json()["choices"][0]
    assert cut["finish_reason"] == "stop" and cut["text"] == choice["text"][:2]
    assert greedy[0]["usage"] == {"prompt_tokens": 9, "completion_tokens": 6, "total_tokens": 15}


def test_models_lists_the_servable_steps_and_latest_is_the_newest(rig):
    with Loop(rig), httpx.Client(base_url=rig.url, timeout=60) as client:
        rig.swap(10)
        ids = [m["id"] for m in client.get("/v1/models").json()["data"]]
        latest = _echo(client, "unit@latest", "abc").json()
        unknown = _echo(client, "unit@30", "abc")
    assert ids == ["unit@latest", "unit@10", "unit@20"]
    assert latest["model"] == "unit@20"     # the network held 10: the newest evaluated step was swapped in
    assert unknown.status_code == 404 and "servable steps" in unknown.json()["error"]["message"]


def test_a_full_queue_answers_429_with_retry_after(rig):
    """No main loop runs: the queue fills, the next request is refused at once."""
    with httpx.Client(base_url=rig.url, timeout=60) as client:
        results: list[httpx.Response] = []
        threads = [threading.Thread(target=lambda: results.append(_echo(client, "unit@10", "a b c")))
                   for _ in range(OPTIONS.queue_size)]
        for t in threads:
            t.start()
        wait_for(lambda: rig.queue.depth() == OPTIONS.queue_size, 30, "the queue to fill")
        refused = _echo(client, "unit@10", "a b c")
        assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1
        assert "serve.queue_size" in refused.json()["error"]["message"]
        with Loop(rig):
            for t in threads:
                t.join(60)
    assert [r.status_code for r in results] == [200] * OPTIONS.queue_size


def test_oversize_and_hostile_bodies_get_4xx_and_the_endpoint_keeps_serving(rig):
    with Loop(rig), httpx.Client(base_url=rig.url, timeout=60) as client:
        big = client.post("/v1/completions", content=b'{"prompt": "' + b"x" * 10000 + b'"}')
        cases = [client.post("/v1/completions", content=b"{not json"),
                 client.post("/v1/completions", content=b'{"prompt": "a", "temperature": NaN}'),
                 client.post("/v1/completions", json={"prompt": "a", "max_tokens": -1}),
                 client.post("/v1/completions", json={"prompt": "x" * 200, "max_tokens": 1}),
                 client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]}),
                 client.post("/detokenize", json={"tokens": ["a"]})]
        healthy = _echo(client, "unit@10", "still here")
    assert big.status_code == 413 and "serve.max_body_bytes" in big.json()["error"]["message"]
    assert [r.status_code for r in cases] == [400] * 6
    assert "chat template" in cases[4].json()["error"]["message"]
    assert healthy.status_code == 200


def test_a_slowloris_connection_is_closed_and_others_are_served(rig):
    with Loop(rig):
        slow = socket.create_connection(("127.0.0.1", rig.http.port))
        slow.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")   # headers never finish
        body_slow = socket.create_connection(("127.0.0.1", rig.http.port))
        body_slow.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        with httpx.Client(base_url=rig.url, timeout=60) as client:
            assert _echo(client, "unit@10", "meanwhile").status_code == 200
        slow.settimeout(10)
        assert slow.recv(1024) == b""          # closed by the header deadline
        body_slow.settimeout(10)
        assert b" 408 " in body_slow.recv(4096).split(b"\r\n")[0] + b" "
        slow.close()
        body_slow.close()


def test_many_concurrent_connections_are_bounded_and_answered(rig):
    with Loop(rig):
        idle = [socket.create_connection(("127.0.0.1", rig.http.port)) for _ in range(300)]
        try:
            with httpx.Client(base_url=rig.url, timeout=60) as client:
                answers = [_echo(client, "unit@10", "x").status_code for _ in range(3)]
        finally:
            for s in idle:
                s.close()
    assert set(answers) <= {200, 503}   # beyond limit_concurrency uvicorn says 503, never hangs or crashes
    with Loop(rig), httpx.Client(base_url=rig.url, timeout=60) as client:
        wait_for(lambda: _echo(client, "unit@10", "x").status_code == 200, 30, "the endpoint after the flood")


def test_a_token_is_required_when_configured(network):
    options = ServeOptions(listen="127.0.0.1:0", batch_size=4)
    rig = Rig(network, options, {10: snapshot(network, 1)})
    rig.context.token = "a-long-enough-token-1234"
    rig.swap(10)
    try:
        with Loop(rig), httpx.Client(base_url=rig.url, timeout=60) as client:
            assert _echo(client, "unit@10", "x").status_code == 401
            assert client.get("/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
            ok = client.get("/v1/models", headers={"Authorization": "Bearer a-long-enough-token-1234"})
            assert ok.status_code == 200
    finally:
        rig.close()


class ChatBytes:
    """A byte tokenizer with a chat template, as a tokenizer factory may return."""

    eos_id, vocab_size = 0, 256

    def encode(self, text):
        return list(text.encode())

    def decode(self, ids):
        return bytes(ids).decode("utf-8", "replace")

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
        return "".join(f"<{m['role']}>{m['content']}\n" for m in messages) + ("<assistant>" if add_generation_prompt
                                                                               else "")


def test_chat_completions_use_the_tokenizers_template_and_the_openai_client_works(network):
    openai = pytest.importorskip("openai")
    rig = Rig(network, ServeOptions(listen="127.0.0.1:0", batch_size=4), {10: snapshot(network, 1)})
    rig.close()
    rig.tokenizer = ChatBytes()
    from evald.serve.app import Context, build_app
    from evald.serve.http_thread import HttpThread

    rig.runner.tokenizer = rig.tokenizer
    rig.context = Context(rig.options, rig.tokenizer, rig.queue, rig.stats, rig.runner, window=64)
    rig.http = HttpThread(build_app(rig.context), "127.0.0.1", 0, keep_alive_s=5, limit_concurrency=64,
                          header_timeout_s=5)
    rig.http.start()
    rig.swap(10)
    try:
        with Loop(rig):
            client = openai.OpenAI(base_url=f"{rig.url}/v1", api_key="unused")
            chat = client.chat.completions.create(model="unit@latest", max_tokens=4, temperature=0,
                                                  messages=[{"role": "user", "content": "hi"}])
            text = client.completions.create(model="unit@10", prompt="<user>hi\n<assistant>", max_tokens=4,
                                             temperature=0)
    finally:
        rig.close()
    assert chat.model == "unit@10" and chat.choices[0].message.content == text.choices[0].text
    assert chat.model_extra["evald"]["snapshot"] == rig.digests[10]


def test_each_outcome_is_counted_once(rig):
    before = rig.stats.snapshot(0)
    with Loop(rig), httpx.Client(base_url=rig.url, timeout=60) as client:
        assert _echo(client, "unit@10", "ok").status_code == 200
        assert _echo(client, "unit@30", "not servable").status_code == 404      # refused by the runner
        assert client.post("/v1/completions", content=b"{").status_code == 400   # refused by the handler
    after = rig.stats.snapshot(0)
    assert (after["served"] - before["served"], after["refused"] - before["refused"]) == (1, 2)
    assert after["requests"] - before["requests"] == 3
