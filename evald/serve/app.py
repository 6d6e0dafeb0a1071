"""The Starlette app: OpenAI's routes over the job queue, a bearer token, bounded bodies, 4xx with reasons.

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions`` (when the tokenizer has a chat
template), ``GET /v1/models``, and the tokenizer routes lm-eval's ``tokenizer_backend=remote`` uses
(``GET /tokenizer_info``, ``POST /tokenize``, ``POST /detokenize``), so lm-eval tokenizes exactly as
evald does, offline. ``GET /health`` is ``ok`` whenever a request can be answered: the window is known
and a step is servable (held now, or evaluated and on disk); else 503 saying why not.

With a token configured (``serve.token_file``), ``BearerToken`` checks every request before routing, whatever
its route or method (an unknown route or a wrong method too: nothing about the endpoint shows without it):
exactly one ``Authorization`` header, ``Bearer`` (any case), one space, and exactly the token's bytes,
compared in constant time (their sha256 digests, so not even the length shows); else a JSON 401 with
``WWW-Authenticate: Bearer``. ``/health`` needs it too (it names the run, the steps and their snapshots).

A handler reads the body (at most ``serve.max_body_bytes``, within ``serve.header_timeout_s``),
validates and tokenizes it (evald.serve.requests), queues a job (429 with ``Retry-After`` when the
queue is full) and awaits its answer (503 after ``serve.request_timeout_s``). It never touches
MindSpore. Every error is a JSON ``{"error": {...}}`` with a 4xx/5xx status saying what to change, an
unforeseen one too (a JSON 500, logged with its traceback).

May import: serve.jobs, serve.requests, serve.responses, serve.schedule, pipeline (tokenizer).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import math
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, MutableMapping

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from evald.config import ServeOptions
from evald.pipeline.suites.tokenizer import Tokenizer, bos_id
from evald.serve import responses
from evald.serve.jobs import JobQueue, QueueFull, ServeStats
from evald.serve.requests import (BadRequest, Completion, check_ids, lm_eval_max_length, parse_completion,
                                  parse_json, vocab_size)
from evald.serve.schedule import Answer, Runner

log = logging.getLogger("evald.serve")
MAX_MESSAGES = 256
ROLES = ("system", "user", "assistant", "developer")


@dataclass
class Context:
    """What the handlers need; ``window`` (the model's longest input) is set once the scorer is built, and
    ``unavailable`` says why nothing can be served when evald knows it never will be (no window)."""

    options: ServeOptions
    tokenizer: Tokenizer
    queue: JobQueue
    stats: ServeStats
    runner: Runner
    token: str | None = None
    window: int | None = None
    unavailable: str | None = None


def chat_template(tokenizer: Tokenizer) -> Callable[[list[dict]], str] | None:
    """The tokenizer's chat template as messages -> prompt text, or None when it has none."""
    inner = getattr(tokenizer, "inner", tokenizer)
    apply = getattr(inner, "apply_chat_template", None)
    if not callable(apply):
        return None
    return lambda messages: str(apply(messages, tokenize=False, add_generation_prompt=True))


def _error(exc: BadRequest) -> JSONResponse:
    return JSONResponse(responses.error_body(exc.status, exc.message, exc.param), exc.status, headers=exc.headers)


Scope = MutableMapping[str, Any]
ASGI = Callable[[Scope, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]
SCHEME = b"bearer "


class BearerToken:
    """ASGI middleware: every HTTP request carries the token (see the module's docstring), or gets a 401."""

    def __init__(self, app: ASGI, context: "Context") -> None:
        self.app, self.context = app, context

    @staticmethod
    def authorized(headers: list[tuple[bytes, bytes]], token: str) -> bool:
        given = [value for name, value in headers if name.lower() == b"authorization"]
        if len(given) != 1 or given[0][:len(SCHEME)].lower() != SCHEME:
            return False   # none, two (which one would a proxy have checked?), or another scheme
        return hmac.compare_digest(hashlib.sha256(given[0][len(SCHEME):]).digest(),
                                   hashlib.sha256(token.encode("utf-8")).digest())

    async def __call__(self, scope: Scope, receive: Callable[[], Awaitable[Any]],
                       send: Callable[[Any], Awaitable[None]]) -> None:
        token = self.context.token
        if scope["type"] != "http" or token is None or self.authorized(list(scope.get("headers") or []), token):
            await self.app(scope, receive, send)
            return
        self.context.stats.count("refused")
        message = ("missing or wrong bearer token: send one header 'Authorization: Bearer TOKEN' with the token in "
                   "serve.token_file")
        response = JSONResponse(responses.error_body(401, message), 401,
                                headers={"WWW-Authenticate": 'Bearer realm="evald"'})
        await response(scope, receive, send)


def build_app(ctx: Context) -> Starlette:
    options = ctx.options
    template = chat_template(ctx.tokenizer)

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

    def not_ready() -> str | None:
        if ctx.unavailable is not None:
            return ctx.unavailable
        if ctx.window is None:
            return ("the evaluation network is not built yet (evald learns the model from --model-factory or "
                    "the trainer's announcement), or serving's graphs are still compiling; try again")
        return None

    def window() -> int:
        why = not_ready()
        if why is not None or ctx.window is None:
            raise BadRequest(503, why or "no window")
        return ctx.window

    def handler(fn: Callable) -> Callable:
        async def wrapped(request: Request) -> JSONResponse:
            try:
                return await fn(request)
            except BadRequest as exc:   # counted here only, whoever raised it (the runner sets it on the job)
                ctx.stats.count(exc.outcome)
                return _error(exc)
            except Exception as exc:  # noqa: BLE001 - a bug answers a JSON 500 and is logged, never plain text
                log.error("the HTTP endpoint failed on %s %s", request.method, request.url.path, exc_info=exc)
                ctx.stats.count("failed")
                return _error(BadRequest(500, f"the request failed in evald: {type(exc).__name__}"))
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
        why = not_ready()
        if why is None and catalog.held is None and not catalog.steps:
            why = "no step is servable yet: none is evaluated and on disk"
        body = {"ok": why is None, "run": catalog.run, "evald": catalog.held.body() if catalog.held else None,
                "servable": list(catalog.steps[-100:]), "queue_depth": ctx.queue.depth()}
        if why is not None:
            body["error"] = why
        return JSONResponse(body, 200 if why is None else 503)   # 503: a readiness probe (curl -f) waits

    @handler
    async def tokenizer_info(request: Request) -> JSONResponse:
        eos = ctx.tokenizer.decode([ctx.tokenizer.eos_id])
        bos = bos_id(ctx.tokenizer)
        size = window()
        info: dict[str, Any] = {"eos_token": eos, "bos_token": None if bos is None else ctx.tokenizer.decode([bos]),
                                "pad_token": None, "model_max_length": size + 1,
                                "evald": {"window": size, "eos_id": ctx.tokenizer.eos_id, "bos_id": bos,
                                          "lm_eval_max_length": lm_eval_max_length(size)}}
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
        return JSONResponse({"tokens": tokens, "count": len(tokens), "max_model_len": window() + 1})   # echo: +1

    @handler
    async def detokenize(request: Request) -> JSONResponse:
        body = await body_of(request)
        tokens = body.get("tokens")
        if not isinstance(tokens, list):
            raise BadRequest(400, "tokens must be a list of token ids", "tokens")
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
            raise BadRequest(400, "tokens must be a list of token ids (integers)", "tokens")
        check_ids(tokens, vocab_size(ctx.tokenizer), "tokens", "tokens")   # as /v1/completions refuses them
        return JSONResponse({"prompt": ctx.tokenizer.decode(tokens)})

    routes = [Route("/v1/completions", completions, methods=["POST"]),
              Route("/v1/chat/completions", chat, methods=["POST"]),
              Route("/v1/models", models, methods=["GET"]), Route("/health", health, methods=["GET"]),
              Route("/tokenizer_info", tokenizer_info, methods=["GET"]),
              Route("/tokenize", tokenize, methods=["POST"]), Route("/detokenize", detokenize, methods=["POST"])]

    async def http_error(request: Request, exc: Exception) -> JSONResponse:
        # Starlette's own 404 (no such route) and 405 (another method): JSON like every other error
        assert isinstance(exc, HTTPException)
        message = f"{request.method} {request.url.path[:80]}: {exc.detail}"
        return JSONResponse(responses.error_body(exc.status_code, message), status_code=exc.status_code,
                            headers=exc.headers)

    return Starlette(routes=routes, exception_handlers={HTTPException: http_error},
                     middleware=[Middleware(BearerToken, context=ctx)])
