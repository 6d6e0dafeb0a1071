"""Run one validated Completion on the compiled network through a TokenScorer; the main thread calls this.

Every step of generation is one ``TokenScorer.score`` call over all rows still running (``run_many``: the
rows of several requests for the same weights, which then share forward passes): a row's tokens
so far plus a placeholder target, so that the last position's top-k (the scorer's ``top_k``) is the
next token's distribution. The same call gives, at every earlier position, the prompt tokens'
log-probabilities (``echo``), so lm-eval's ``echo, max_tokens=1`` request is one forward pass.

* ``temperature == 0``: the most likely token (greedy);
* ``temperature > 0``: sampled among the scorer's top-k tokens, rescaled by the temperature, cut to the
  ``top_p`` nucleus, with ``numpy.random.default_rng((seed, prompt, choice))`` (the same seed gives the
  same tokens);
* a row ends at the tokenizer's EOS (not included), at a stop string (cut from the text), at
  ``max_tokens``, or when it fills the model's window (finish_reason ``length``).

No result depends on which other requests share a forward pass (the scorer's padding invariance).

May import: pipeline (scoring, tokenizer), serve.requests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from evald.pipeline.suites.scoring import ScoreRequest, TokenScorer, TokenScores
from evald.pipeline.suites.tokenizer import Tokenizer
from evald.serve.requests import Completion

PLACEHOLDER = 0   # the target of the last position: its top-k is what is read, never its log-probability


@dataclass
class Choice:
    prompt_index: int
    prompt: tuple[int, ...]
    prompt_logprobs: list[float | None] = field(default_factory=list)   # echo: None for the first token
    prompt_top: list[list[tuple[int, float]] | None] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)                     # generated
    logprobs: list[float] = field(default_factory=list)
    top: list[list[tuple[int, float]]] = field(default_factory=list)
    finish_reason: str = "length"
    text: str = ""                                                      # generated text, cut at a stop string


@dataclass
class _Row:
    choice: Choice
    rng: np.random.Generator
    tokens: list[int]
    request: Completion
    owner: int              # which of the requests run together this row belongs to
    done: bool = False


def _top(scores: TokenScores, i: int, k: int) -> list[tuple[int, float]]:
    assert scores.top_ids is not None and scores.top_logprobs is not None
    return [(int(t), float(v)) for t, v in zip(scores.top_ids[i][:k], scores.top_logprobs[i][:k])]


def _pick(scores: TokenScores, request: Completion, rng: np.random.Generator) -> tuple[int, float]:
    ids, values = scores.top_ids[-1], scores.top_logprobs[-1]   # type: ignore[index]
    if request.temperature == 0.0:
        return int(ids[0]), float(values[0])
    scaled = values.astype(np.float64) / request.temperature
    probs = np.exp(scaled - scaled.max())
    probs /= probs.sum()
    keep = int(np.searchsorted(np.cumsum(probs), request.top_p, side="left")) + 1  # the smallest nucleus
    probs = probs[:max(1, min(keep, len(probs)))]
    index = int(rng.choice(len(probs), p=probs / probs.sum()))
    return int(ids[index]), float(values[index])


def run(scorer: TokenScorer, tokenizer: Tokenizer, request: Completion) -> list[Choice]:
    """The choices of ``request``, in OpenAI's order (prompt by prompt, ``n`` each)."""
    return run_many(scorer, tokenizer, [request])[0]


def run_many(scorer: TokenScorer, tokenizer: Tokenizer, requests: Sequence[Completion]) -> list[list[Choice]]:
    """Several requests in the same forward passes (each row's result does not depend on the others')."""
    window = scorer.max_length
    rows: list[_Row] = []
    for owner, request in enumerate(requests):
        for p, prompt in enumerate(request.prompts):
            for j in range(request.n):
                seed = None if request.seed is None else (request.seed, p, j)
                row = _Row(Choice(p, prompt), np.random.default_rng(seed), list(prompt), request, owner)
                if request.echo:
                    row.choice.prompt_logprobs, row.choice.prompt_top = [None], [None]
                rows.append(row)
    first = True
    while True:
        for r in rows:   # a row's inputs are its tokens, which must fit the window
            if not r.done and (len(r.choice.tokens) >= r.request.max_tokens or len(r.tokens) > window):
                r.done = True   # finish_reason stays "length"
        generating = [r for r in rows if not r.done]
        echo_only = [r for r in rows if r.done and first and r.request.echo]
        if not generating and not echo_only:
            break
        asked: list[tuple[_Row, ScoreRequest | None]] = [
            (r, ScoreRequest(r.tokens[:1], r.tokens[1:] + [PLACEHOLDER])) for r in generating]
        asked += [(r, ScoreRequest(r.tokens[:1], r.tokens[1:]) if len(r.tokens) > 1 else None) for r in echo_only]
        results = iter(scorer.score([q for _, q in asked if q is not None]))
        for r, q in asked:
            scores = next(results) if q is not None else None
            k = r.request.logprobs or 0
            if first and r.request.echo and scores is not None:
                positions = len(r.choice.prompt) - 1
                r.choice.prompt_logprobs += [float(v) for v in scores.logprobs[:positions]]
                r.choice.prompt_top += [_top(scores, i, max(k, 1)) for i in range(positions)]
            if not r.done and scores is not None:
                _advance(r, scores, r.request, tokenizer, k)
        first = False
    out: list[list[Choice]] = [[] for _ in requests]
    for r in rows:
        out[r.owner].append(r.choice)
    return out


def _advance(row: _Row, scores: TokenScores, request: Completion, tokenizer: Tokenizer, k: int) -> None:
    token, logprob = _pick(scores, request, row.rng)
    choice = row.choice
    if token == tokenizer.eos_id:
        choice.finish_reason, row.done = "stop", True
        return
    choice.tokens.append(token)
    choice.logprobs.append(logprob)
    choice.top.append(_top(scores, len(scores.logprobs) - 1, max(k, 1)))
    row.tokens.append(token)
    choice.text = tokenizer.decode(choice.tokens)
    for stop in request.stop:
        at = choice.text.find(stop)
        if at >= 0:
            choice.text, choice.finish_reason, row.done = choice.text[:at], "stop", True
            return


def tokens_out(choices: Sequence[Choice]) -> int:
    return sum(len(c.tokens) for c in choices)
