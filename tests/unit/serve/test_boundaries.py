"""The HTTP boundary, third round (issue 27 items 7, 12, 13, 14, 15; issue 26 item 4's /health): step names
are ASCII digits matched in full, temperatures are bounded away from underflow, /detokenize refuses what
/v1/completions refuses, non-finite weights give a JSON error, and /health is ok whenever a step is servable."""

from __future__ import annotations

import json

import numpy as np
import pytest

from evald.config import ServeOptions
from evald.pipeline.suites.tokenizer import ByteTokenizer
from evald.serve.requests import BadRequest, parse_completion, parse_json, parse_model

LIMITS = ServeOptions(listen="127.0.0.1:0")


def parse(body: dict):
    return parse_completion(parse_json(json.dumps(body).encode()), tokenizer=ByteTokenizer(), limits=LIMITS,
                            window=64, run_name="RUN")


@pytest.mark.parametrize("name", ["RUN@\u0662\u0665", "RUN@\uff12\uff15", "RUN@\u0968\u096b", "RUN@25\n",
                                  "RUN@25 ", "RUN@latest\n", "RUN@\u00b2"])
def test_a_step_name_is_ascii_digits_matched_in_full(name):
    with pytest.raises(BadRequest) as caught:
        parse_model(name, "RUN")
    assert caught.value.status == 404 and "RUN@latest or RUN@STEP" in caught.value.message
    assert parse_model("RUN@25", "RUN").step == 25 and parse_model("RUN@latest", "RUN").step is None


@pytest.mark.parametrize("temperature", [5e-324, 1e-300, 1e-9, 9.9e-6])
def test_a_temperature_that_underflows_is_refused_with_its_bound(temperature):
    with pytest.raises(BadRequest) as caught:
        parse({"prompt": "a", "temperature": temperature})
    assert caught.value.status == 400 and caught.value.param == "temperature"
    assert "0 (greedy) or between 1e-05 and 2" in caught.value.message, caught.value.message
    assert parse({"prompt": "a", "temperature": 1e-5}).temperature == 1e-5
    assert parse({"prompt": "a", "temperature": 0}).temperature == 0.0


@pytest.mark.parametrize("body", [b'{"prompt": "a\\ud800b"}', b'{"prompt": ["ab", "\\udc00"]}',
                                  b'{"\\ud800": 1, "prompt": "ab"}', b'{"prompt": "ab", "stop": ["\\udfff"]}',
                                  b'{"messages": [{"role": "user", "content": "\\ud83d"}]}'])
def test_a_lone_surrogate_escape_is_a_bad_request(body):
    """Issue 35: "\\ud800" alone is valid JSON syntax but not Unicode; the tokenizer's encode raised, and the
    endpoint answered 500 (a bug, logged with a traceback) for a bad request."""
    with pytest.raises(BadRequest) as caught:
        parse_json(body)
    assert caught.value.status == 400 and "lone surrogate" in caught.value.message
    assert parse_json(b'{"prompt": "\\ud83d\\ude00"}') == {"prompt": "\U0001F600"}   # a pair is one character


# -- over real HTTP, on the demo model -------------------------------------------------------------
ms = pytest.importorskip("mindspore")
httpx = pytest.importorskip("httpx")

from tests.networks import demo_network_in_graph_mode  # noqa: E402
from tests.unit.serve.rig import Loop, Rig, snapshot  # noqa: E402


@pytest.fixture(scope="module")
def rig():
    with demo_network_in_graph_mode(seed=3) as net:
        nan = snapshot(net, 9)
        nan[next(k for k in nan if "tok" in k)][:] = np.nan     # every embedding row NaN: NaN logits
        r = Rig(net, ServeOptions(listen="127.0.0.1:0", batch_size=4, request_timeout_s=60),
                {10: snapshot(net, 1), 20: snapshot(net, 2), 30: nan})
        try:
            yield r
        finally:
            r.close()


def test_detokenize_refuses_ids_completions_refuse(rig):
    with Loop(rig), httpx.Client(base_url=rig.url, timeout=60) as client:
        for ids in ([10 ** 30], [256], [-1], [97, 300]):
            answer = client.post("/detokenize", json={"tokens": ids})
            assert answer.status_code == 400, (ids, answer.text)
            assert "outside the vocabulary" in answer.json()["error"]["message"]
            assert client.post("/v1/completions", json={"prompt": ids, "max_tokens": 0}).status_code == 400
        assert client.post("/detokenize", json={"tokens": [97, 98]}).json() == {"prompt": "ab"}


@pytest.mark.parametrize("extra", [{"max_tokens": 0, "echo": True, "logprobs": 1},
                                   {"max_tokens": 2, "echo": True, "logprobs": 2, "temperature": 0},
                                   {"max_tokens": 2, "temperature": 0.8, "seed": 1}])
def test_non_finite_weights_give_a_json_error_naming_the_step(rig, extra):
    with Loop(rig), httpx.Client(base_url=rig.url, timeout=60) as client:
        answer = client.post("/v1/completions", json={"model": "unit@30", "prompt": "import os", **extra})
        healthy = client.post("/v1/completions", json={"model": "unit@10", "prompt": "import os", "max_tokens": 0,
                                                       "echo": True, "logprobs": 1})
    assert answer.status_code == 500 and answer.headers["content-type"] == "application/json", answer.text
    message = answer.json()["error"]["message"]
    assert "step 30" in message and "not finite" in message, message
    assert healthy.status_code == 200


def test_a_lone_surrogate_gets_a_400_on_every_route_that_reads_text(rig):
    with Loop(rig), httpx.Client(base_url=rig.url, timeout=60) as client:
        for path in ("/v1/completions", "/tokenize"):
            answer = client.post(path, content=b'{"model": "unit@10", "prompt": "a\\ud800"}',
                                 headers={"content-type": "application/json"})
            assert answer.status_code == 400 and "lone surrogate" in answer.json()["error"]["message"], answer.text


def test_health_is_ok_whenever_a_step_is_servable(rig):
    with httpx.Client(base_url=rig.url, timeout=60) as client:
        rig.drop()   # nothing in the network: before the first request, or after a failed evaluation
        rig.runner.publish()
        health = client.get("/health").json()
        assert health["ok"] is True and health["evald"] is None and health["servable"] == [10, 20, 30], health
        rig.servable_override = ()
        rig.runner.publish()
        assert client.get("/health").json()["ok"] is False
        rig.servable_override = None
        rig.swap(10)
        rig.runner.publish()
        assert client.get("/health").json()["evald"]["step"] == 10


def test_an_unknown_route_or_method_gets_a_json_error(rig):
    """Starlette's own 404 and 405 (no such route, a route that takes another method) are JSON errors too, as
    docs/serving.md says every error is, not its plain-text "Not Found"."""
    with httpx.Client(base_url=rig.url, timeout=60) as client:
        answers = {404: client.post("/v1/embeddings", json={"input": "a"}), 405: client.get("/v1/completions")}
    for status, answer in answers.items():
        assert answer.status_code == status and answer.headers["content-type"] == "application/json", answer.text
        assert answer.json()["error"]["code"] == status and answer.json()["error"]["message"], answer.text
    assert answers[405].headers["allow"] == "POST"
