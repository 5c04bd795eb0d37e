"""The Starlette app: routes, authentication, bounded bodies, errors, server-sent events.

Routes: GET /health (no key needed; says whether the engine is busy), GET /v1/models,
GET /v1/models/{id}, POST /v1/chat/completions (whole answer, or `stream: true` as SSE:
a role chunk, content chunks, a chunk with finish_reason, with include_usage a chunk with
usage and no choices, then `data: [DONE]`).

Invariants: every error is an OpenAI error object (engine.server.errors) with a 4xx/5xx
status, never a traceback (unexpected exceptions are logged on the server and answered with a
plain 500); a request body is read at most `limits.max_body_bytes` far; with an API key every
/v1 route needs `Authorization: Bearer KEY` (compared in constant time); CORS headers only for
the origins configured. A client that goes away (closing the stream, or dropping a
non-streaming request) sets its job's cancel event, so the engine stops at its next step, and
the job still waiting in line is skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import json
import logging
import threading
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..generate import Finished, PrefillDone, Tokens
from . import responses as R
from .engine_adapter import EngineAdapter
from .errors import ApiError
from .images import ImageResolver
from .queue import GenerationQueue
from .schema import Limits, parse_request

log = logging.getLogger(__name__)


@dataclass
class ServerConfig:
    model_name: str = "merlin"
    api_key: str | None = None
    limits: Limits = field(default_factory=Limits)
    allowed_images: str | None = None  # folder image file paths may point into
    cors_origins: list[str] = field(default_factory=list)
    max_waiting: int = 8  # requests waiting behind the running one
    engine_lock: Any = None  # held while a request computes (a model shared in-process)
    # bound to a loopback address: only requests naming a loopback host are served (a web
    # page that rebinds its own name to 127.0.0.1 is refused: _check_host)
    loopback_only: bool = False


def _error(e: ApiError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


# seconds a request's body may take to arrive (its headers: transport.HEADER_TIMEOUT_S)
BODY_TIMEOUT_S = 60.0
# JSON objects and arrays a body may hold: parsed, each costs ~60-100 bytes of Python objects
# (a 32 MB body of "{}," was ~0.9 GB), while a real request holds a few per message
MAX_JSON_CONTAINERS = 200_000
# what a web page can POST without asking (a CORS "simple request"): refused, so that no page
# drives a server on this machine by a form or a no-cors fetch
_FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data", "text/plain")
_LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")


class ClientGone(Exception):
    """The client closed the connection while sending its request."""


def _check_host(request: Request) -> None:
    """With loopback_only: the Host header names this machine (DNS rebinding: a page whose
    name resolves to 127.0.0.1 would otherwise read the answers)."""
    host = request.headers.get("host")
    if host is None:
        return
    name = host[1 : host.find("]")] if host.startswith("[") else host.rsplit(":", 1)[0]
    if name.lower() in _LOOPBACK_HOSTS:
        return
    with contextlib.suppress(ValueError):  # a name like 127.attacker.example is no address
        if ipaddress.ip_address(name).is_loopback:
            return
    raise ApiError(
        f"this server listens on a loopback address and serves only requests to it (Host: "
        f"{host[:100]!r}); use http://127.0.0.1 or http://localhost.",
        None,
        status=421,
        code="misdirected_request",
    )


def _check_content_type(request: Request) -> None:
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind in _FORM_TYPES:
        raise ApiError(
            f"the request body is sent as {kind}; send JSON with 'Content-Type: "
            "application/json' (curl: -H 'Content-Type: application/json').",
            None,
            status=415,
        )


async def _read_json(request: Request, limit: int):
    _check_content_type(request)
    try:
        raw = await asyncio.wait_for(_read_body(request, limit), BODY_TIMEOUT_S)
    except asyncio.TimeoutError:
        raise ApiError(
            f"the request body did not arrive within {BODY_TIMEOUT_S:.0f} s.", None, status=408
        ) from None
    except ClientDisconnect:
        raise ClientGone() from None
    if not raw.strip():
        raise ApiError("the request body is empty; send a JSON object.", None)
    if raw.count(b"{") + raw.count(b"[") > MAX_JSON_CONTAINERS:
        raise ApiError(
            f"the request body holds over {MAX_JSON_CONTAINERS:,} JSON objects and arrays.", None
        )
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ApiError(f"the request body is not valid JSON ({e}).", None) from None
    except ValueError:  # Python's limit on an int's digits (sys.get_int_max_str_digits)
        msg = "the request body is not valid JSON: a number in it is too long."
        raise ApiError(msg, None) from None
    except RecursionError:
        raise ApiError("the request body is nested too deeply.", None) from None


async def _read_body(request: Request, limit: int) -> bytes:
    size = request.headers.get("content-length")
    if size and size.isdigit() and int(size) > limit:
        raise ApiError(
            f"the request body is {int(size):,} bytes; this server accepts at most {limit:,}.",
            None,
            status=413,
        )
    body, n = [], 0
    async for part in request.stream():
        n += len(part)
        if n > limit:
            raise ApiError(
                f"the request body is over {limit:,} bytes, the most this server accepts.",
                None,
                status=413,
            )
        body.append(part)
    return b"".join(body)


async def _watch_disconnect(request: Request, job) -> None:
    """Cancel the job when the client goes away (the body is read: the next ASGI message is
    http.disconnect, also sent once the response is complete, when cancelling is a no-op)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            job.cancel.set()
            return


# an answer that ended before it was finished while its client still listens: the server
# stopped it (Serve turned off, another model loading) or the engine failed
UNFINISHED = ("cancelled", "error")


def _unfinished(done: Finished) -> ApiError:
    """The error a client gets for an answer cut short (it had been told "stop", so a cut
    answer looked whole)."""
    if done.reason == "cancelled":
        why = "the server stopped it (it is shutting down, or another model is loading)"
    else:
        why = "; ".join(done.totals.get("notices") or []) or "the engine failed"
    return ApiError(f"the answer was not finished: {why}.", None, status=503)


def create_app(model, config: ServerConfig, adapter: EngineAdapter | None = None) -> Starlette:
    """The ASGI app serving `model` (adapter: the engine sessions; default settings if None)."""
    adapter = adapter or EngineAdapter(model)
    resolver = ImageResolver(config.allowed_images, config.limits.max_image_bytes)
    gen_queue = GenerationQueue(config.max_waiting, config.engine_lock)
    created = R.now()

    def check_access(request: Request, key: bool = True) -> None:
        """The Host (with loopback_only) and, with key, the API key (when one is set)."""
        if config.loopback_only:
            _check_host(request)
        if not key or not config.api_key:
            return
        auth = request.headers.get("authorization", "")
        scheme, _, token = auth.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            token.strip().encode(), config.api_key.encode()
        ):
            raise ApiError(
                "a valid API key is required: send 'Authorization: Bearer KEY'.",
                None,
                status=401,
                code="invalid_api_key",
            )

    def model_card() -> dict:
        return {
            "id": config.model_name,
            "object": "model",
            "created": created,
            "owned_by": "merlin",
            "max_model_len": adapter.context_budget,
        }

    async def health(request: Request):
        check_access(request, key=False)  # no key needed
        return JSONResponse(
            {
                "status": "ok",
                "model": config.model_name,
                "busy": gen_queue.busy,
                "waiting": gen_queue.waiting,
                **adapter.counts,
            }
        )

    async def models(request: Request):
        check_access(request)
        return JSONResponse({"object": "list", "data": [model_card()]})

    async def one_model(request: Request):
        check_access(request)
        if request.path_params["model_id"] != config.model_name:
            raise ApiError(
                f"no model {request.path_params['model_id'][:100]!r}; this server has "
                f"{config.model_name!r}.",
                "model",
                status=404,
                code="model_not_found",
            )
        return JSONResponse(model_card())

    async def chat(request: Request):
        t0 = time.perf_counter()
        check_access(request)
        try:
            body = await _read_json(request, config.limits.max_body_bytes)
        except ClientGone:  # nobody to answer, nothing to log
            return Response(status_code=499)
        req = parse_request(body, config.limits, adapter.context_budget)
        del body  # the request holds what it needs; the parsed JSON may be large
        job = gen_queue.submit(lambda cancel: adapter.start(req, resolver, cancel))
        if req.stream:
            job.first_sent = threading.Event()
        watcher = asyncio.create_task(_watch_disconnect(request, job))
        try:
            first = await job.next()
            kind, value = first
            if kind == "error":
                raise value
            if kind == "end":  # the client left while the request waited
                return JSONResponse({}, status_code=499)
            cid, created_at = R.completion_id(), R.now()
            if not req.stream:
                return await _whole(job, first, cid, created_at)
        finally:
            watcher.cancel()  # a stream: StreamingResponse watches for the disconnect itself
        return StreamingResponse(
            _stream(job, first, req, cid, created_at, t0),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    async def _whole(job, item, cid, created_at):
        parts: list[str] = []
        thought: list[str] = []
        try:
            while True:
                kind, value = item
                if kind == "error":
                    raise value
                if kind == "end":
                    break
                if isinstance(value, Tokens):
                    parts.append(value.text)
                    thought.append(value.reasoning)
                elif isinstance(value, Finished):
                    if value.reason in UNFINISHED:
                        raise _unfinished(value)
                    reasoning = "".join(thought) if "reasoning" in value.totals else None
                    return JSONResponse(
                        R.completion(
                            cid, config.model_name, created_at, "".join(parts), value.reason,
                            value.totals, reasoning,
                        )
                    )  # fmt: skip
                item = await job.next()
        finally:
            job.cancel.set()  # a no-op when it finished; else the client is gone
        raise ApiError("the generation ended without an answer.", None, status=500)

    async def _stream(job, item, req, cid, created_at, t0):
        name = config.model_name
        ttft = None
        try:
            role = {"role": "assistant", "content": ""}
            yield R.sse(R.chunk(cid, name, created_at, role, usage=req.include_usage))
            while True:
                kind, value = item
                if kind == "error":
                    yield R.sse(value.body())
                    break
                if kind == "end":
                    break
                if isinstance(value, Tokens) and value.reasoning:  # thinking models
                    delta = {"reasoning_content": value.reasoning}
                    yield R.sse(R.chunk(cid, name, created_at, delta, usage=req.include_usage))
                if isinstance(value, Tokens) and value.text:
                    content = {"content": value.text}
                    yield R.sse(R.chunk(cid, name, created_at, content, usage=req.include_usage))
                    if ttft is None:  # sent: the engine may compute on (engine.server.queue)
                        ttft = (time.perf_counter() - t0) * 1e3
                        job.first_sent.set()
                elif isinstance(value, Finished):
                    if value.reason in UNFINISHED:  # never a finish the client takes as whole
                        yield R.sse(_unfinished(value).body())
                        return
                    finish = R.FINISH.get(value.reason, "stop")
                    yield R.sse(R.chunk(cid, name, created_at, {}, finish, req.include_usage))
                    if req.include_usage:
                        yield R.sse(
                            R.usage_chunk(cid, name, created_at, value.reason, value.totals, ttft)
                        )
                elif isinstance(value, PrefillDone):
                    pass
                item = await job.next()
            yield R.sse("[DONE]")
        finally:
            job.cancel.set()  # the client closed the stream: stop at the next step

    async def not_found(request: Request, exc: HTTPException):
        status = exc.status_code
        msg = {404: f"no route {request.url.path}", 405: f"{request.method} is not allowed here"}
        return _error(ApiError(msg.get(status, str(exc.detail)), None, status=status))

    async def api_error(request: Request, exc: ApiError):
        return _error(exc)

    async def unexpected(request: Request, exc: Exception):
        log.exception("unexpected error serving %s", request.url.path)
        return _error(ApiError("internal server error; see the server log.", None, status=500))

    @asynccontextmanager
    async def lifespan(app):
        try:
            yield
        finally:
            gen_queue.close()
            resolver.close()

    middleware = []
    if config.cors_origins:
        middleware.append(
            Middleware(
                CORSMiddleware,
                allow_origins=list(config.cors_origins),
                allow_methods=["GET", "POST", "OPTIONS"],
                # whatever headers the client's preflight names: the official JavaScript
                # client adds x-stainless-* to every request, and a browser refused them
                allow_headers=["*"],
                expose_headers=["Retry-After"],  # a 429's wait, readable by browser code
            )
        )
    app = Starlette(
        routes=[
            Route("/health", health, methods=["GET"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/v1/models/{model_id:path}", one_model, methods=["GET"]),
            Route("/v1/chat/completions", chat, methods=["POST"]),
        ],
        middleware=middleware,
        exception_handlers={
            ApiError: api_error,
            HTTPException: not_found,
            Exception: unexpected,
        },
        lifespan=lifespan,
    )
    app.router.redirect_slashes = False  # a redirect would name the Host the client sent
    app.state.adapter = adapter
    app.state.queue = gen_queue
    return app
