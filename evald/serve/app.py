"""The Starlette app: OpenAI's routes over the job queue, a bearer token, bounded bodies, 4xx with reasons.

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions`` (when the tokenizer has a chat
template), ``GET /v1/models``, and the tokenizer routes lm-eval's ``tokenizer_backend=remote`` uses
(``GET /tokenizer_info``, ``POST /tokenize``, ``POST /detokenize``), so lm-eval tokenizes exactly as
evald does, offline. ``GET /health`` says whether a checkpoint is in the network.

A handler reads the body (at most ``serve.max_body_bytes``, within ``serve.header_timeout_s``),
validates and tokenizes it (evald.serve.requests), queues a job (429 with ``Retry-After`` when the
queue is full) and awaits its answer (503 after ``serve.request_timeout_s``). It never touches
MindSpore. Every error is a JSON ``{"error": {...}}`` with a 4xx/5xx status saying what to change.

May import: serve.jobs, serve.requests, serve.responses, serve.schedule, pipeline (tokenizer).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import math
from dataclasses import dataclass
from typing import Any, Callable

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from evald.config import ServeOptions
from evald.pipeline.suites.tokenizer import Tokenizer
from evald.serve import responses
from evald.serve.jobs import JobQueue, QueueFull, ServeStats
from evald.serve.requests import BadRequest, Completion, parse_completion, parse_json
from evald.serve.schedule import Answer, Runner

log = logging.getLogger("evald.serve")
MAX_MESSAGES = 256
ROLES = ("system", "user", "assistant", "developer")


@dataclass
class Context:
    """What the handlers need; ``window`` (the model's longest input) is set once the scorer is built."""

    options: ServeOptions
    tokenizer: Tokenizer
    queue: JobQueue
    stats: ServeStats
    runner: Runner
    token: str | None = None
    window: int | None = None


def chat_template(tokenizer: Tokenizer) -> Callable[[list[dict]], str] | None:
    """The tokenizer's chat template as messages -> prompt text, or None when it has none."""
    inner = getattr(tokenizer, "inner", tokenizer)
    apply = getattr(inner, "apply_chat_template", None)
    if not callable(apply):
        return None
    return lambda messages: str(apply(messages, tokenize=False, add_generation_prompt=True))


def _error(exc: BadRequest) -> JSONResponse:
    return JSONResponse(responses.error_body(exc.status, exc.message, exc.param), exc.status, headers=exc.headers)


def build_app(ctx: Context) -> Starlette:
    options = ctx.options
    template = chat_template(ctx.tokenizer)

    def authorized(request: Request) -> None:
        if ctx.token is None:
            return
        given = request.headers.get("authorization", "")
        scheme, _, value = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(value.strip().encode(), ctx.token.encode()):
            raise BadRequest(401, "missing or wrong bearer token: send 'Authorization: Bearer TOKEN' with the token "
                                  "in serve.token_file")

    async def body_of(request: Request) -> dict[str, Any]:
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > options.max_body_bytes):
            raise BadRequest(413, f"the body is larger than {options.max_body_bytes} bytes (serve.max_body_bytes)")
        chunks: list[bytes] = []

        async def collect() -> None:
            size = 0
            async for chunk in request.stream():
                size += len(chunk)
                if size > options.max_body_bytes:
                    raise BadRequest(413, f"the body is larger than {options.max_body_bytes} bytes "
                                          f"(serve.max_body_bytes)")
                chunks.append(chunk)

        try:
            await asyncio.wait_for(collect(), options.header_timeout_s)
        except asyncio.TimeoutError:
            raise BadRequest(408, f"the body did not arrive within {options.header_timeout_s:g}s") from None
        return parse_json(b"".join(chunks))

    async def answer(completion: Completion) -> Answer:
        try:
            job = ctx.queue.submit(completion)
        except QueueFull:
            snap = ctx.stats.snapshot(ctx.queue.depth())
            retry = max(1, math.ceil(snap["wait_s_mean"] or 1.0))
            raise BadRequest(429, f"{ctx.queue.size} requests are waiting for the network (serve.queue_size); "
                                  f"retry in {retry}s", headers={"Retry-After": str(retry)}, outcome="busy") from None
        try:
            return await asyncio.wait_for(asyncio.wrap_future(job.future), options.request_timeout_s)
        except asyncio.TimeoutError:
            raise BadRequest(503, f"not answered within {options.request_timeout_s:g}s "
                                  f"(serve.request_timeout_s): the network was busy, or the requested step "
                                  f"could not be put in it", outcome="timed_out") from None

    def window() -> int:
        if ctx.window is None:
            raise BadRequest(503, "the evaluation network is not built yet (evald learns the model from "
                                  "--model-factory or the trainer's announcement); try again")
        return ctx.window

    def handler(fn: Callable) -> Callable:
        async def wrapped(request: Request) -> JSONResponse:
            try:
                authorized(request)
                return await fn(request)
            except BadRequest as exc:   # counted here only, whoever raised it (the runner sets it on the job)
                ctx.stats.count(exc.outcome)
                return _error(exc)
        return wrapped

    @handler
    async def completions(request: Request) -> JSONResponse:
        body = await body_of(request)
        completion = parse_completion(body, tokenizer=ctx.tokenizer, limits=options, window=window(),
                                      run_name=ctx.runner.run_name)
        done = await answer(completion)
        return JSONResponse(responses.completion(done.request, done.choices, done.served, ctx.tokenizer),
                            headers=done.served.headers())

    @handler
    async def chat(request: Request) -> JSONResponse:
        if template is None:
            raise BadRequest(400, "this model's tokenizer has no chat template (the tokenizer factory's tokenizer "
                                  "has no apply_chat_template): use /v1/completions")
        body = await body_of(request)
        messages = body.get("messages")
        if (not isinstance(messages, list) or not messages or len(messages) > MAX_MESSAGES
                or not all(isinstance(m, dict) and m.get("role") in ROLES and isinstance(m.get("content"), str)
                           for m in messages)):
            raise BadRequest(400, f"messages must be a list of 1 to {MAX_MESSAGES} objects with a role "
                                  f"({', '.join(ROLES)}) and a string content", "messages")
        try:
            prompt = template([{"role": m["role"], "content": m["content"]} for m in messages])
        except Exception as exc:  # noqa: BLE001 - the user's template raising is a bad request, not a crash
            raise BadRequest(400, f"the chat template could not render these messages: {exc}", "messages") from None
        completion = parse_completion(body, tokenizer=ctx.tokenizer, limits=options, window=window(),
                                      run_name=ctx.runner.run_name, prompt=prompt, chat=True)
        done = await answer(completion)
        return JSONResponse(responses.chat_completion(done.request, done.choices, done.served),
                            headers=done.served.headers())

    @handler
    async def models(request: Request) -> JSONResponse:
        catalog = ctx.runner.catalog
        data = [{"id": f"{catalog.run}@latest", "object": "model", "owned_by": "evald",
                 "evald": catalog.held.body() if catalog.held else None}]
        data += [{"id": f"{catalog.run}@{step}", "object": "model", "owned_by": "evald"} for step in catalog.steps]
        return JSONResponse({"object": "list", "data": data})

    @handler
    async def health(request: Request) -> JSONResponse:
        catalog = ctx.runner.catalog
        return JSONResponse({"ok": catalog.held is not None, "run": catalog.run,
                             "evald": catalog.held.body() if catalog.held else None,
                             "queue_depth": ctx.queue.depth()})

    @handler
    async def tokenizer_info(request: Request) -> JSONResponse:
        eos = ctx.tokenizer.decode([ctx.tokenizer.eos_id])
        info: dict[str, Any] = {"eos_token": eos, "bos_token": None, "pad_token": None,
                                "model_max_length": window() + 1}
        inner = getattr(ctx.tokenizer, "inner", ctx.tokenizer)
        if isinstance(getattr(inner, "chat_template", None), str):
            info["chat_template"] = inner.chat_template
        return JSONResponse(info)

    @handler
    async def tokenize(request: Request) -> JSONResponse:
        body = await body_of(request)
        prompt = body.get("prompt")
        if not isinstance(prompt, str) or len(prompt) > options.max_body_bytes:
            raise BadRequest(400, "prompt must be a string", "prompt")
        tokens = [int(t) for t in ctx.tokenizer.encode(prompt)]
        return JSONResponse({"tokens": tokens, "count": len(tokens), "max_model_len": window() + 1})

    @handler
    async def detokenize(request: Request) -> JSONResponse:
        body = await body_of(request)
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                                   for t in tokens):
            raise BadRequest(400, "tokens must be a list of token ids", "tokens")
        return JSONResponse({"prompt": ctx.tokenizer.decode(tokens)})

    routes = [Route("/v1/completions", completions, methods=["POST"]),
              Route("/v1/chat/completions", chat, methods=["POST"]),
              Route("/v1/models", models, methods=["GET"]), Route("/health", health, methods=["GET"]),
              Route("/tokenizer_info", tokenizer_info, methods=["GET"]),
              Route("/tokenize", tokenize, methods=["POST"]), Route("/detokenize", detokenize, methods=["POST"])]
    return Starlette(routes=routes)
