"""One request body, validated once at the boundary and tokenized: a Completion job, or BadRequest.

Everything a client controls is bounded here (body size is bounded before this, in evald.serve.app):
the number of prompts, their length in tokens, ``max_tokens``, ``n``, ``logprobs``, the stop strings;
numbers must be finite and in range (JSON's non-standard NaN/Infinity are refused when parsing). A
prompt is a string, a list of strings, a list of token ids or a list of lists of token ids (what
lm-eval's ``local-completions`` sends with a remote tokenizer). A prompt may hold the model's window + 1
tokens when ``echo`` is set: its last token is scored, never fed (a rolling window, as lm-eval sends it).
Step names are ASCII digits matched in full; a temperature is 0 (greedy) or at least ``MIN_TEMPERATURE``,
so that dividing log-probabilities by it stays finite.

May import: config (ServeOptions), pipeline (the tokenizer protocol).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from evald.config import ServeOptions
from evald.pipeline.suites.tokenizer import Tokenizer

LATEST = "latest"
MAX_STOP_STRINGS, MAX_STOP_CHARS = 4, 256
MAX_LOGPROBS = 5      # OpenAI's own limit for the completions endpoint
MAX_SEED = 2 ** 63 - 1
MIN_TEMPERATURE, MAX_TEMPERATURE = 1e-5, 2.0   # below 1e-5 sampling is greedy anyway, and 1/T may overflow
_MODEL = re.compile(r"(?P<run>[^@\s]{1,256})@(?P<which>latest|[0-9]{1,19})", re.ASCII)


class BadRequest(Exception):
    """The request cannot be served as sent; ``status`` is the 4xx to answer with, the message says why."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 headers: dict[str, str] | None = None, outcome: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.headers = status, message, param, headers
        self.outcome = outcome or ("refused" if status < 500 else "failed")   # what ServeStats counts


@dataclass(frozen=True)
class ModelRef:
    """``RUN@latest`` (step None) or ``RUN@STEP``."""

    run: str
    step: int | None

    def __str__(self) -> str:
        return f"{self.run}@{LATEST if self.step is None else self.step}"


@dataclass(frozen=True)
class Completion:
    """A validated completions (or chat) request: every prompt already tokenized."""

    model: ModelRef
    prompts: tuple[tuple[int, ...], ...]
    max_tokens: int
    temperature: float
    top_p: float
    n: int
    stop: tuple[str, ...]
    seed: int | None
    logprobs: int | None
    echo: bool
    chat: bool = False

    @property
    def prompt_tokens(self) -> int:
        return sum(len(p) for p in self.prompts)


def parse_json(body: bytes) -> dict[str, Any]:
    def refuse_constant(name: str) -> Any:
        raise BadRequest(400, f"the body is not valid JSON: {name} is not a JSON number")

    try:
        value = json.loads(body, parse_constant=refuse_constant)
    except BadRequest:
        raise
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise BadRequest(400, f"the body is not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise BadRequest(400, f"the body must be a JSON object, got {type(value).__name__}")
    try:   # an escape such as "\\ud800" alone decodes to a lone surrogate, which no tokenizer can encode
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise BadRequest(400, "the body holds a lone surrogate escape (\\ud800 to \\udfff without its pair): "
                              "not Unicode text") from None
    except RecursionError:
        raise BadRequest(400, "the body is nested too deeply") from None
    return value


def parse_model(value: Any, run_name: str) -> ModelRef:
    if value is None:
        return ModelRef(run_name, None)
    if not isinstance(value, str):
        raise BadRequest(400, "model must be a string such as RUN@latest or RUN@STEP", "model")
    match = _MODEL.fullmatch(value)   # fullmatch: no trailing newline; [0-9]: no other script's digits
    if not match:
        raise BadRequest(404, f"model {value[:80]!r} is not RUN@latest or RUN@STEP; GET /v1/models lists them",
                         "model")
    if match["run"] != run_name:
        raise BadRequest(404, f"model {value[:80]!r}: this evald serves run {run_name!r} "
                              f"({run_name}@latest or {run_name}@STEP)", "model")
    return ModelRef(run_name, None if match["which"] == LATEST else int(match["which"]))


def _number(body: dict, name: str, default: float, low: float, high: float, integer: bool = False) -> Any:
    value = body.get(name, default)
    if value is None:
        value = default
    what = "an integer" if integer else "a number"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not isinstance(value, int)):
        if not (integer and isinstance(value, float) and value.is_integer()):
            raise BadRequest(400, f"{name} must be {what}, got {value!r:.60}", name)
        value = int(value)
    if not math.isfinite(value):
        raise BadRequest(400, f"{name} must be finite, got {value!r}", name)
    if not low <= value <= high:
        raise BadRequest(400, f"{name} must be between {low:g} and {high:g}, got {value!r:.60}", name)
    return int(value) if integer else float(value)


def _tokenize(prompt: Any, tokenizer: Tokenizer, limits: ServeOptions, window: int,
              echo: bool) -> tuple[tuple[int, ...], ...]:
    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt)):
        prompt = [prompt]
    if not isinstance(prompt, list) or not prompt:
        raise BadRequest(400, "prompt must be a string, a list of strings, a list of token ids or a list of "
                              "lists of token ids, and not empty", "prompt")
    if len(prompt) > limits.max_prompts:
        raise BadRequest(400, f"{len(prompt)} prompts in one request; at most {limits.max_prompts} "
                              f"(serve.max_prompts)", "prompt")
    # With echo, window + 1: the last token is only scored (lm-eval's rolling windows and log-likelihoods).
    longest = min(limits.max_prompt_tokens, window + 1 if echo else window)
    vocab = vocab_size(tokenizer)
    out = []
    for i, item in enumerate(prompt):
        if isinstance(item, str):
            if len(item) > 8 * longest + 1024:  # refused before paying for tokenizing it (8 chars a token is generous)
                raise BadRequest(400, f"prompt[{i}] is {len(item)} characters; prompts are limited to {longest} "
                                      f"tokens", "prompt")
            ids = tuple(int(t) for t in tokenizer.encode(item))
        elif isinstance(item, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in item):
            if len(item) > longest:
                raise BadRequest(400, f"prompt[{i}] has {len(item)} tokens; at most {longest}", "prompt")
            ids = tuple(check_ids(item, vocab, f"prompt[{i}]", "prompt"))
        else:
            raise BadRequest(400, f"prompt[{i}] must be a string or a list of token ids", "prompt")
        if not ids:
            raise BadRequest(400, f"prompt[{i}] is empty; a prompt needs at least one token", "prompt")
        if len(ids) > longest:
            if longest == limits.max_prompt_tokens:
                why = "serve.max_prompt_tokens"
            elif echo:
                why = "the model's window + 1: the last token is scored, never fed"
            else:
                why = f"the model's window; with echo, {window + 1}"
            raise BadRequest(400, f"prompt[{i}] has {len(ids)} tokens; at most {longest} ({why}). lm-eval: set "
                                  f"max_length={lm_eval_max_length(window)} in model_args", "prompt")
        out.append(ids)
    return tuple(out)


def lm_eval_max_length(window: int) -> int:
    """lm-eval's ``max_length`` model argument that makes ``local-completions`` score as the suites do:
    it keeps one token for generation (max_length - 1 tokens a request) and rolls windows of
    max_length - 2 inputs, where the in-process suite rolls windows of ``window`` inputs."""
    return window + 2


def check_ids(ids: list[Any], vocab: int | None, what: str, param: str) -> list[int]:
    """``ids`` when each is an integer token id of the vocabulary; else BadRequest naming ``what``."""
    if vocab is None:
        raise BadRequest(400, f"{what}: token ids are refused because this tokenizer does not say its "
                              f"vocabulary size; send text", param)
    for t in ids:
        if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab:
            raise BadRequest(400, f"{what} holds token id {t!r:.40}, outside the vocabulary (0 to {vocab - 1})",
                             param)
    return ids


def vocab_size(tokenizer: Tokenizer) -> int | None:
    """How many token ids the tokenizer has (``vocab_size``, else ``len(get_vocab())``), or None."""
    size = getattr(tokenizer, "vocab_size", None)
    if isinstance(size, int) and size > 0:
        return size
    vocab = getattr(getattr(tokenizer, "inner", tokenizer), "get_vocab", None)
    return len(vocab()) if callable(vocab) else None


def _stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise BadRequest(400, "stop must be a string or a list of strings", "stop")
    if len(stops) > MAX_STOP_STRINGS or any(len(s) > MAX_STOP_CHARS for s in stops):
        raise BadRequest(400, f"stop: at most {MAX_STOP_STRINGS} strings of at most {MAX_STOP_CHARS} characters",
                         "stop")
    return tuple(s for s in stops if s)


def parse_completion(body: dict[str, Any], *, tokenizer: Tokenizer, limits: ServeOptions, window: int,
                     run_name: str, prompt: Any = None, chat: bool = False) -> Completion:
    """Validate a /v1/completions body (or a chat body, with its rendered ``prompt``)."""
    model = parse_model(body.get("model"), run_name)
    if chat:
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        body = dict(body, max_tokens=16 if max_tokens is None else max_tokens)
    else:
        prompt = body.get("prompt")
    if body.get("stream") not in (None, False):
        raise BadRequest(400, "stream: evald answers whole responses only; send stream: false", "stream")
    echo = body.get("echo", False)
    if not isinstance(echo, bool):
        raise BadRequest(400, f"echo must be true or false, got {echo!r:.60}", "echo")
    logprobs = body.get("logprobs")
    if chat:
        if logprobs not in (None, False):
            raise BadRequest(400, "logprobs are served on /v1/completions only", "logprobs")
        logprobs = None
    elif logprobs is not None:
        logprobs = _number(body, "logprobs", 0, 0, MAX_LOGPROBS, integer=True)
    seed = body.get("seed")
    if seed is not None:
        seed = _number(body, "seed", 0, 0, MAX_SEED, integer=True)
    temperature = _number(body, "temperature", 1.0, 0.0, MAX_TEMPERATURE)
    if 0.0 < temperature < MIN_TEMPERATURE:
        raise BadRequest(400, f"temperature must be 0 (greedy) or between {MIN_TEMPERATURE:g} and "
                              f"{MAX_TEMPERATURE:g}, got {temperature!r:.40}", "temperature")
    return Completion(
        model=model, prompts=_tokenize(prompt, tokenizer, limits, window, echo),
        max_tokens=_number(body, "max_tokens", 16, 0, limits.max_tokens, integer=True),
        temperature=temperature, top_p=_number(body, "top_p", 1.0, 0.0, 1.0),
        n=_number(body, "n", 1, 1, limits.max_n, integer=True), stop=_stop(body.get("stop")), seed=seed,
        logprobs=logprobs, echo=echo, chat=chat)
