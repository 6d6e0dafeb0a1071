"""Run the rows of validated Completions on the compiled network through a TokenScorer; the main thread calls this.

A request is ``rows_of`` it: one row per prompt and choice (``n``), in OpenAI's order. ``run_rows`` runs
a set of rows to their end. On a network that implements cached decoding (``scorer.decoding`` is
``cached``) each row's last ``window`` tokens are prefilled into a static cache (``TokenScorer.prefill_top``)
and then each step feeds one token per row (``decode_top``), both returning the next token's top-k (the
scorer's ``top_k``) computed on the device. Otherwise (the fallback) each step of generation is one
``TokenScorer.score`` call over all rows still running: a row's tokens so far plus a placeholder target,
so that the last position's top-k is the next token's distribution. Either way the first pass is a
``score`` call that gives, at every position, the prompt tokens' log-probabilities (``echo``) and the
first token of an echo row, so lm-eval's ``echo, max_tokens=1`` request is one forward pass. The scheduler (evald.serve.schedule) runs a big request's rows in slices of
``serve.batch_size`` rows; no row's result depends on which rows share its forward passes (the
scorer's padding invariance) nor on the slice it ran in (each row has its own generator).

* ``temperature == 0``: the most likely token (greedy);
* ``temperature > 0``: sampled among the scorer's top-k tokens, rescaled by the temperature, cut to the
  ``top_p`` nucleus, with ``numpy.random.default_rng((seed, prompt, choice))`` (the same seed gives the
  same tokens);
* a row ends at the tokenizer's EOS (not included), at a stop string (cut from the text), at
  ``max_tokens``, or when it fills the model's window (finish_reason ``length``). A prompt of window + 1
  tokens (echo only: its last token is scored, never fed) still gets one token, predicted from its last
  ``window`` tokens: lm-eval's ``max_tokens=1`` log-likelihood requests read the prompt's values only.

A log-probability that is not finite (weights holding NaN or Inf) is ``NonFinite``: never a number
in an answer (JSON has none for it), never a sampled token.

May import: pipeline (the engine, the tokenizer), serve.requests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from evald.pipeline.engine import ScoreRequest, TokenScorer, TokenScores
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


class NonFinite(ArithmeticError):
    """The network gave a log-probability that is NaN or infinite: its weights are broken."""


@dataclass
class Row:
    choice: Choice
    rng: np.random.Generator
    tokens: list[int]
    request: Completion
    done: bool = False


def _top(scores: TokenScores, i: int, k: int) -> list[tuple[int, float]]:
    assert scores.top_ids is not None and scores.top_logprobs is not None
    return [(int(t), float(v)) for t, v in zip(scores.top_ids[i][:k], _finite(scores.top_logprobs[i][:k]))]


def _finite(values: np.ndarray) -> np.ndarray:
    if not np.all(np.isfinite(values)):
        raise NonFinite("the network gave log-probabilities that are not finite (NaN or Inf)")
    return values


def _pick(ids: np.ndarray, values: np.ndarray, request: Completion, rng: np.random.Generator) -> tuple[int, float]:
    """The next token and its log-probability, from the top-k ``ids`` and their log-probabilities ``values``."""
    values = _finite(values)
    if request.temperature == 0.0:
        return int(ids[0]), float(values[0])
    scaled = values.astype(np.float64) / request.temperature   # finite: temperature >= requests.MIN_TEMPERATURE
    probs = np.exp(scaled - scaled.max())
    probs /= probs.sum()
    keep = int(np.searchsorted(np.cumsum(probs), request.top_p, side="left")) + 1  # the smallest nucleus
    probs = probs[:max(1, min(keep, len(probs)))]
    index = int(rng.choice(len(probs), p=probs / probs.sum()))
    return int(ids[index]), float(values[index])


def rows_of(request: Completion) -> list[Row]:
    """The rows of ``request`` in OpenAI's order (prompt by prompt, ``n`` each), none run yet."""
    rows = []
    for p, prompt in enumerate(request.prompts):
        for j in range(request.n):
            seed = None if request.seed is None else (request.seed, p, j)
            row = Row(Choice(p, prompt), np.random.default_rng(seed), list(prompt), request)
            if request.echo:
                row.choice.prompt_logprobs, row.choice.prompt_top = [None], [None]
            rows.append(row)
    return rows


def run(scorer: TokenScorer, tokenizer: Tokenizer, request: Completion) -> list[Choice]:
    """The choices of ``request``, in OpenAI's order, all rows at once."""
    return run_many(scorer, tokenizer, [request])[0]


def run_many(scorer: TokenScorer, tokenizer: Tokenizer, requests: Sequence[Completion]) -> list[list[Choice]]:
    """Several requests in the same forward passes (each row's result does not depend on the others')."""
    rows = [rows_of(request) for request in requests]
    run_rows(scorer, tokenizer, [row for owned in rows for row in owned])
    return [[row.choice for row in owned] for owned in rows]


def _generating(row: Row, window: int) -> bool:
    """Whether ``row`` asks for another token: below max_tokens, and its tokens still within the window
    (a prompt of window + 1 tokens gets its first token all the same)."""
    made = len(row.choice.tokens)
    return made < row.request.max_tokens and (len(row.tokens) <= window or made == 0)


def run_rows(scorer: TokenScorer, tokenizer: Tokenizer, rows: Sequence[Row]) -> None:
    """Run ``rows`` (none run before) to their end: echo values on the first pass, then generation, cached
    when the network is a CachedDecoder (``scorer.decoding``), else a full forward per token."""
    window = scorer.max_length
    if scorer.cached and scorer.top_k > 0:
        _finish(rows, window)
        _score_pass(scorer, tokenizer, rows, [r for r in rows if not r.done and r.request.echo], first=True)
        _finish(rows, window)
        _decode_cached(scorer, tokenizer, [r for r in rows if not r.done])
        return
    first = True
    while True:
        _finish(rows, window)
        if not _score_pass(scorer, tokenizer, rows, [r for r in rows if not r.done], first):
            break
        first = False


def _finish(rows: Sequence[Row], window: int) -> None:
    for r in rows:
        if not r.done and not _generating(r, window):
            r.done = True   # finish_reason stays "length"


def _score_pass(scorer: TokenScorer, tokenizer: Tokenizer, rows: Sequence[Row], generating: Sequence[Row],
                first: bool) -> bool:
    """One ``scorer.score`` call: the next token of each of ``generating``, and on the ``first`` pass the
    echo values of ``rows``. False when there was nothing to ask."""
    window = scorer.max_length
    asked: list[tuple[Row, ScoreRequest, str]] = []
    for r in generating:   # the last `window` tokens are the inputs; the placeholder's top-k is read
        fed = r.tokens[-window:]
        asked.append((r, ScoreRequest(fed[:1], fed[1:] + [PLACEHOLDER]), "next"))
    if first:   # echo: the prompt's values, from the generation pass when the whole prompt is in it
        asked += [(r, ScoreRequest(r.tokens[:1], r.tokens[1:]), "echo") for r in rows
                  if r.request.echo and len(r.choice.prompt) > 1
                  and (r.done or len(r.choice.prompt) > window)]
    if not asked:
        return False
    for (r, _, kind), scores in zip(asked, scorer.score([q for _, q, _ in asked])):
        k = r.request.logprobs or 0
        if first and r.request.echo and (kind == "echo" or len(r.choice.prompt) <= window):
            positions = len(r.choice.prompt) - 1
            r.choice.prompt_logprobs += [float(v) for v in _finite(scores.logprobs[:positions])]
            r.choice.prompt_top += [_top(scores, i, max(k, 1)) for i in range(positions)]
        if kind == "next":
            assert scores.top_ids is not None and scores.top_logprobs is not None
            _advance(r, scores.top_ids[-1], scores.top_logprobs[-1], tokenizer)
    return True


def _decode_cached(scorer: TokenScorer, tokenizer: Tokenizer, rows: Sequence[Row]) -> None:
    """Run ``rows`` (each asking for a token) to their end on the cached decoder: each row's last ``window``
    tokens prefilled into a cache of the shortest bucket that holds what it will feed, then one token per
    row per step, ``batch_size`` rows at a time (a row's tokens depend on its own prompt only)."""
    window = scorer.max_length
    groups: dict[int, list[Row]] = {}
    for r in rows:   # what a row feeds: its window, then each new token but the last, never past the window
        fed = min(window, len(r.tokens[-window:]) + r.request.max_tokens - len(r.choice.tokens) - 1)
        groups.setdefault(scorer.bucket_for(fed), []).append(r)
    for capacity, members in sorted(groups.items()):
        members.sort(key=lambda r: len(r.tokens))   # similar lengths share prefill chunks
        for begin in range(0, len(members), scorer.batch_size):
            batch = members[begin:begin + scorer.batch_size]
            contexts = [r.tokens[-window:] for r in batch]
            ends = [len(c) for c in contexts]          # the position each row's next fed token takes
            ids, values, cache = scorer.prefill_top(contexts, capacity)
            while True:
                for i, r in enumerate(batch):
                    if not r.done:
                        _advance(r, ids[i], values[i], tokenizer)
                _finish(batch, window)
                live = {i for i, r in enumerate(batch) if not r.done}
                if not live:
                    break
                tokens = [batch[i].tokens[-1] if i in live else 0 for i in range(len(batch))]
                positions = [ends[i] if i in live else 0 for i in range(len(batch))]
                ids, values, cache = scorer.decode_top(tokens, positions, cache)
                for i in live:
                    ends[i] += 1


def _advance(row: Row, ids: np.ndarray, values: np.ndarray, tokenizer: Tokenizer) -> None:
    """Take ``row``'s next token from the top-k ``ids`` and their log-probabilities ``values``."""
    request = row.request
    token, logprob = _pick(ids, values, request, row.rng)
    choice = row.choice
    if token == tokenizer.eos_id:
        choice.finish_reason, row.done = "stop", True
        return
    choice.tokens.append(token)
    choice.logprobs.append(logprob)
    k = max(request.logprobs or 0, 1)
    choice.top.append([(int(t), float(v)) for t, v in zip(ids[:k], _finite(values[:k]))])
    row.tokens.append(token)
    choice.text = tokenizer.decode(choice.tokens)
    for stop in request.stop:
        at = choice.text.find(stop)
        if at >= 0:
            choice.text, choice.finish_reason, row.done = choice.text[:at], "stop", True
            return


def tokens_out(choices: Sequence[Choice]) -> int:
    return sum(len(c.tokens) for c in choices)
