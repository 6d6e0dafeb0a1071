"""Generated request bodies through every HTTP route (issue 27, the property test's HTTP half): whatever the
nesting, numbers and unicode, and on weights that give NaN too (step 30), every answer is JSON with a status evald means (never a plain-text 500), no
traceback is logged, and each comes back within the client's timeout."""

from __future__ import annotations

import json
import logging

import pytest

ms = pytest.importorskip("mindspore")
httpx = pytest.importorskip("httpx")
hypothesis = pytest.importorskip("hypothesis")

from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

from evald.config import ServeOptions  # noqa: E402
from tests.networks import demo_network_in_graph_mode  # noqa: E402
from tests.unit.serve.rig import Loop, Rig, snapshot  # noqa: E402

# Small limits keep every valid request cheap: the property is about the boundary, not throughput.
OPTIONS = ServeOptions(listen="127.0.0.1:0", batch_size=4, max_prompts=4, max_n=2, max_tokens=4,
                       max_body_bytes=16384, request_timeout_s=60)
STATUSES = {200, 400, 401, 404, 405, 408, 410, 413, 429, 500, 503}
FIELDS = ["model", "prompt", "max_tokens", "temperature", "top_p", "n", "stop", "seed", "logprobs", "echo", "stream",
          "messages", "tokens", "max_completion_tokens"]
ROUTES = [("POST", "/v1/completions"), ("POST", "/v1/chat/completions"), ("POST", "/tokenize"),
          ("POST", "/detokenize"), ("GET", "/v1/models"), ("GET", "/health"), ("GET", "/tokenizer_info"),
          ("GET", "/v1/completions"), ("POST", "/v1/embeddings")]   # another method, no such route: JSON too

numbers = st.one_of(st.integers(min_value=-2 ** 70, max_value=2 ** 70), st.floats(allow_nan=False),
                    st.sampled_from([0, 1, -1, 5e-324, 1e-5, 2, 2 ** 63, 10 ** 30, 0.5, 1e308]))
texts = st.text(max_size=40)   # any unicode, surrogates excluded by JSON encoding in json.dumps(ensure_ascii)
scalars = st.one_of(st.none(), st.booleans(), numbers, texts,
                    st.sampled_from(["unit@10", "unit@20", "unit@30", "unit@30", "unit@latest", "unit@\u0662\u0665", "unit@10\n",
                                     "other@1", "user", "assistant"]))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=6),
                                                         st.dictionaries(st.sampled_from(FIELDS) | texts, inner,
                                                                         max_size=5)), max_leaves=30)
models = st.sampled_from(["unit@10", "unit@20", "unit@30", "unit@latest", "unit@\u0662\u0665", "unit@10\n", "x@1"])
completions = st.fixed_dictionaries(   # mostly valid requests, so the network really runs (step 30: NaN weights)
    {"model": models, "prompt": st.one_of(st.text(min_size=1, max_size=30),
                                          st.lists(st.integers(min_value=-1, max_value=300), min_size=1, max_size=66))},
    optional={"max_tokens": st.integers(min_value=0, max_value=4), "echo": st.booleans(),
              "logprobs": st.one_of(st.none(), st.integers(min_value=0, max_value=6)),
              "temperature": st.sampled_from([0, 0.7, 5e-324, 1e-5, 2, 3]), "n": st.integers(min_value=1, max_value=2),
              "seed": st.integers(min_value=-1, max_value=2 ** 64), "stop": st.one_of(texts, st.lists(texts, max_size=5))})
bodies = st.one_of(st.dictionaries(st.sampled_from(FIELDS), values, max_size=8), values, completions)
raw = st.one_of(bodies.map(lambda b: json.dumps(b).encode()), st.binary(max_size=200),
                st.integers(min_value=1, max_value=3000).map(lambda depth: b"[" * depth + b"]" * depth),
                st.sampled_from([b'{"prompt": "a", "temperature": NaN}', b'{"prompt": "a", "n": 1e999}',
                                 b'{"prompt": [[' + b"1," * 3000 + b"1]]}"]))


class Tracebacks(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info:
            self.records.append(record)


@pytest.fixture(scope="module")
def served():
    handler = Tracebacks()
    loggers = [logging.getLogger(name) for name in ("evald", "uvicorn", "uvicorn.error", "uvicorn.asgi")]
    for logger in loggers:
        logger.addHandler(handler)
    with demo_network_in_graph_mode(seed=2) as net:
        broken = snapshot(net, 3)
        broken[next(k for k in broken if "tok" in k)][:] = float("nan")   # step 30: weights that give NaN
        rig = Rig(net, OPTIONS, {10: snapshot(net, 1), 20: snapshot(net, 2), 30: broken})
        rig.swap(10)
        try:
            with Loop(rig), httpx.Client(base_url=rig.url, timeout=120) as client:
                yield client, handler
        finally:
            rig.close()
            for logger in loggers:
                logger.removeHandler(handler)


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(route=st.sampled_from(ROUTES), body=raw)
def test_any_body_on_any_route_gets_json_and_a_status_evald_means(served, route, body):
    client, tracebacks = served
    method, path = route
    answer = client.request(method, path, content=body if method == "POST" else None)   # timeout: bounded time
    assert answer.status_code in STATUSES, (path, body[:200], answer.status_code, answer.text[:300])
    assert answer.headers["content-type"] == "application/json", (path, body[:200], answer.text[:300])
    parsed = answer.json()
    if answer.status_code >= 400 and path != "/health":
        assert isinstance(parsed["error"]["message"], str) and parsed["error"]["message"]
    assert not tracebacks.records, [r.getMessage() for r in tracebacks.records]


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=completions)
def test_completion_bodies_get_json_whatever_the_weights_give(served, body):
    """Mostly valid completions, on healthy weights and on weights that give NaN (step 30)."""
    client, tracebacks = served
    answer = client.post("/v1/completions", json=body)
    assert answer.status_code in STATUSES, (body, answer.status_code, answer.text[:300])
    assert answer.headers["content-type"] == "application/json", (body, answer.text[:300])
    if answer.status_code == 500:
        assert "step 30" in answer.json()["error"]["message"]
    assert not tracebacks.records, [r.getMessage() for r in tracebacks.records]
