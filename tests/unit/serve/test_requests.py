"""Every request field is validated once, at the boundary: hostile bodies get a 4xx naming the field."""

from __future__ import annotations

import json
import math

import pytest

from evald.config import ServeOptions
from evald.pipeline.suites.tokenizer import ByteTokenizer
from evald.serve.requests import BadRequest, parse_completion, parse_json

LIMITS = ServeOptions(listen="127.0.0.1:0", max_prompt_tokens=100, max_prompts=4, max_tokens=32, max_n=2)


def parse(body: dict | bytes, window: int = 64):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return parse_completion(parse_json(raw), tokenizer=ByteTokenizer(), limits=LIMITS, window=window, run_name="r")


@pytest.mark.parametrize("body, status, says", [
    (b"{", 400, "not valid JSON"),
    (b"[1, 2]", 400, "JSON object"),
    (b'{"prompt": "a", "temperature": NaN}', 400, "NaN is not a JSON number"),
    (b'{"prompt": "a", "top_p": Infinity}', 400, "Infinity"),
    (b"\xff\xfe", 400, "not valid JSON"),
    (b"[" * 100000 + b"]" * 100000, 400, "not valid JSON"),
    ({"prompt": "a", "max_tokens": -1}, 400, "max_tokens must be between 0 and 32"),
    ({"prompt": "a", "max_tokens": 10 ** 12}, 400, "max_tokens"),
    ({"prompt": "a", "max_tokens": "5"}, 400, "max_tokens must be an integer"),
    ({"prompt": "a", "max_tokens": True}, 400, "max_tokens must be an integer"),
    ({"prompt": "a", "temperature": -0.5}, 400, "temperature"),
    (b'{"prompt": "a", "temperature": 1e999}', 400, "temperature must be finite"),   # json reads it as inf
    ({"prompt": "a", "n": 3}, 400, "n must be between 1 and 2"),
    ({"prompt": "a", "logprobs": 6}, 400, "logprobs"),
    ({"prompt": "a", "seed": -1}, 400, "seed"),
    ({"prompt": "a", "echo": "yes"}, 400, "echo"),
    ({"prompt": "a", "stop": ["x"] * 5}, 400, "stop"),
    ({"prompt": "a", "stop": 3}, 400, "stop"),
    ({"prompt": ""}, 400, "empty"),
    ({"prompt": []}, 400, "prompt must be"),
    ({"prompt": None}, 400, "prompt must be"),
    ({"prompt": {"a": 1}}, 400, "prompt must be"),
    ({"prompt": ["a"] * 5}, 400, "at most 4 (serve.max_prompts)"),
    ({"prompt": "x" * 65}, 400, "max_length=66"),
    ({"prompt": "x" * 66, "echo": True}, 400, "window + 1"),
    ({"prompt": "x" * 10 ** 6}, 400, "characters"),
    ({"prompt": [[1, 2], [300]]}, 400, "outside the vocabulary"),
    ({"prompt": [1, -2]}, 400, "outside the vocabulary"),
    ({"prompt": [[1, 2], "a", 3]}, 400, "prompt[2]"),
    ({"prompt": "a", "model": "other@latest"}, 404, "serves run 'r'"),
    ({"prompt": "a", "model": "r@-3"}, 404, "RUN@latest or RUN@STEP"),
    ({"prompt": "a", "model": 7}, 400, "model must be a string"),
    ({"prompt": "a", "stream": True}, 400, "stream"),
])
def test_a_bad_request_is_refused_naming_what_is_wrong(body, status, says):
    with pytest.raises(BadRequest) as caught:
        parse(body)
    assert caught.value.status == status and says in caught.value.message, caught.value.message


def test_the_forms_of_prompt_harnesses_send_are_accepted():
    assert parse({"prompt": "ab"}).prompts == ((97, 98),)
    assert parse({"prompt": ["ab", "c"]}).prompts == ((97, 98), (99,))
    assert parse({"prompt": [5, 6, 7]}).prompts == ((5, 6, 7),)               # one tokenized prompt
    assert parse({"prompt": [[5, 6], [7]]}).prompts == ((5, 6), (7,))        # lm-eval's tokenized batch
    request = parse({"model": "r@20", "prompt": "a", "max_tokens": 0, "echo": True, "logprobs": 1,
                     "temperature": 0, "seed": 1234, "stop": "\n"})
    assert (request.model.step, request.max_tokens, request.echo, request.logprobs, request.stop) == (20, 0, True, 1,
                                                                                                      ("\n",))
    assert parse({"prompt": "a", "model": "r@latest"}).model.step is None
    assert math.isclose(parse({"prompt": "a", "max_tokens": 4.0}).max_tokens, 4)   # 4.0 is an integer
