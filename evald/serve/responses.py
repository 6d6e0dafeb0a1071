"""OpenAI's response formats, each naming the weights that produced it.

Every answer carries ``"evald": {"run", "step", "snapshot"}`` in its body, ``model`` = ``RUN@STEP``
(the step actually served, also for a ``RUN@latest`` request), and the headers ``X-Evald-Step``,
``X-Evald-Snapshot`` and ``X-Evald-Model``. ``snapshot`` is the weights' digest from the swap's
provenance (evald.pipeline.swap.swap_check: the sha256 over the manifest's verified file digests), the same
digest the evaluation of that step recorded.

``logprobs`` follows the completions API: ``tokens``, ``token_logprobs`` (null for the first prompt
token with ``echo``), ``top_logprobs`` (one ``{token text: log-probability}`` per token, at least the
most likely one, best first; tokens that decode to the same text keep the best value) and
``text_offset`` (each token's character offset: the lengths of the token texts before it added up, as
vLLM computes it; one decode per token, where decoding every prefix again cost W**2 / 2 tokens a choice).

May import: serve.engine, serve.requests.
"""

from __future__ import annotations

import itertools
import time
import uuid
from dataclasses import dataclass
from typing import Any, Sequence

from evald.pipeline.suites.tokenizer import Tokenizer
from evald.serve.engine import Choice
from evald.serve.requests import Completion


@dataclass(frozen=True)
class Served:
    """Which weights answered: the run, the ledger step and the snapshot digest."""

    run: str
    step: int
    snapshot: str

    @property
    def model(self) -> str:
        return f"{self.run}@{self.step}"

    def headers(self) -> dict[str, str]:
        return {"X-Evald-Step": str(self.step), "X-Evald-Snapshot": self.snapshot, "X-Evald-Model": self.model}

    def body(self) -> dict[str, Any]:
        return {"run": self.run, "step": self.step, "snapshot": self.snapshot}


def error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    kind = {401: "authentication_error", 404: "not_found_error", 409: "conflict_error", 413: "invalid_request_error",
            429: "rate_limit_error", 500: "server_error", 503: "service_unavailable"}.get(status, "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def _top_dict(top: list[tuple[int, float]] | None, tokenizer: Tokenizer) -> dict[str, float] | None:
    if top is None:
        return None
    out: dict[str, float] = {}
    for token, value in top:  # best first: a later token with the same text keeps the better value
        out.setdefault(tokenizer.decode([token]), value)
    return out


def _logprobs(choice: Choice, request: Completion, tokenizer: Tokenizer) -> dict[str, Any]:
    ids = (list(choice.prompt) if request.echo else []) + choice.tokens
    values = (choice.prompt_logprobs if request.echo else []) + choice.logprobs
    tops = (choice.prompt_top if request.echo else []) + choice.top
    texts = [tokenizer.decode([t]) for t in ids]
    offsets = list(itertools.accumulate((len(t) for t in texts[:-1]), initial=0)) if texts else []
    return {"tokens": texts, "token_logprobs": values,
            "top_logprobs": [_top_dict(t, tokenizer) for t in tops], "text_offset": offsets}


def completion(request: Completion, choices: Sequence[Choice], served: Served, tokenizer: Tokenizer) -> dict:
    out = []
    for index, choice in enumerate(choices):
        text = (tokenizer.decode(choice.prompt) if request.echo else "") + choice.text
        out.append({"index": index, "text": text, "finish_reason": choice.finish_reason,
                    "logprobs": _logprobs(choice, request, tokenizer) if request.logprobs is not None else None})
    completion_tokens = sum(len(c.tokens) for c in choices)
    return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": served.model, "choices": out,
            "usage": {"prompt_tokens": request.prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": request.prompt_tokens + completion_tokens},
            "evald": served.body()}


def chat_completion(request: Completion, choices: Sequence[Choice], served: Served) -> dict:
    completion_tokens = sum(len(c.tokens) for c in choices)
    return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": served.model,
            "choices": [{"index": i, "message": {"role": "assistant", "content": c.text},
                         "finish_reason": c.finish_reason} for i, c in enumerate(choices)],
            "usage": {"prompt_tokens": request.prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": request.prompt_tokens + completion_tokens},
            "evald": served.body()}
