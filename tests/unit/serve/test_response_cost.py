"""The answer of a big request costs in proportion to its tokens (issue 35, the large request): a 32 x 4
request with echo and logprobs at a window of W tokens was answered with a text offset per token computed by
decoding every prefix of the choice again (W**2 / 2 tokens decoded per choice: 4 s of the HTTP thread at a
window of 512, a minute at 2,048), holding the interpreter's lock and slowing evald's main thread about 2.5x
meanwhile. Counted in decoded tokens, not timed."""

from __future__ import annotations

from evald.config import ServeOptions
from evald.pipeline.suites.tokenizer import ByteTokenizer
from evald.serve import responses
from evald.serve.engine import Choice
from evald.serve.requests import parse_completion
from evald.serve.responses import Served

WINDOW, K = 256, 5


class CountingBytes(ByteTokenizer):
    def __init__(self) -> None:
        self.decoded = 0

    def decode(self, ids):
        self.decoded += len(ids)
        return super().decode(ids)


def test_a_big_echo_answer_decodes_each_token_a_bounded_number_of_times():
    tokenizer = CountingBytes()
    options = ServeOptions(listen="127.0.0.1:0", max_prompts=32, max_n=4)
    body = {"model": "u@1", "prompt": ["é" + "y" * (WINDOW - 4) + f"{i:02d}" for i in range(32)], "n": 4,
            "max_tokens": 0, "echo": True, "logprobs": K}
    request = parse_completion(body, tokenizer=tokenizer, limits=options, window=WINDOW, run_name="u")
    choices = []
    for prompt in request.prompts:
        for _ in range(request.n):
            choice = Choice(0, prompt)
            choice.prompt_logprobs = [None] + [-1.0] * (len(prompt) - 1)
            choice.prompt_top = [None] + [[(97 + j, -1.0 - j) for j in range(K)]] * (len(prompt) - 1)
            choices.append(choice)
    tokenizer.decoded = 0
    answer = responses.completion(request, choices, Served("u", 1, "d" * 64), tokenizer)
    tokens = sum(len(c.prompt) for c in choices)
    assert tokenizer.decoded <= (K + 3) * tokens, f"{tokenizer.decoded} tokens decoded for {tokens} tokens answered"
    logprobs = answer["choices"][0]["logprobs"]
    texts = logprobs["tokens"]
    assert logprobs["text_offset"] == [sum(len(t) for t in texts[:i]) for i in range(len(texts))]
    assert logprobs["text_offset"][:4] == [0, 1, 2, 3]   # "é" is two bytes, each a token text of its own
