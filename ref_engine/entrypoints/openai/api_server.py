"""The OpenAI-compatible HTTP server (FastAPI + uvicorn, as vLLM's `api_server.py`): routes, API keys,
errors in OpenAI's schema, X-Request-Id, the body-size cap, startup and graceful shutdown.

The server listens at once and starts the engine core in the background: until the model is loaded every
route but /health's liveness answers 503, so a load balancer can wait on GET /health. On SIGINT/SIGTERM
it drains (`DrainingServer`): it keeps listening but answers every new request 503, so a load balancer
sends them elsewhere instead of seeing refused connections, while the open requests run for up to
`--graceful-timeout` seconds; then the ones left are aborted (their blocks freed), uvicorn stops and the
engine core exits. A second signal stops at once.

Tenants: with `--api-key-file` (JSON: {"key": {"tenant": ..., "weight": ..., "max_num_seqs": ...}}) every
request needs `Authorization: Bearer <key>` and runs as that key's tenant, whose weight and cap configure
the "fair" scheduling policy; without keys the request's `user` field names the tenant. The tenant goes
into the engine's `Request`, so it isolates prefix-cache entries and is what the fair policy counts.

Lesson: lessons/06-architecture-map.md (the API server).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ref_engine.async_engine.async_llm import AsyncLLM
from ref_engine.async_engine.core import EngineArgs
from ref_engine.core.config import EngineConfig
from ref_engine.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from ref_engine.entrypoints.openai.serving import OpenAIError, created
from ref_engine.entrypoints.openai.serving_chat import OpenAIServingChat
from ref_engine.entrypoints.openai.serving_completion import OpenAIServingCompletion

logger = logging.getLogger(__name__)

UNAUTHENTICATED_PATHS = frozenset({"/health", "/metrics"})


@dataclass(frozen=True)
class ApiKey:
    tenant: str
    weight: float = 1.0  # the "fair" policy's share
    max_num_seqs: int | None = None  # the "fair" policy's cap on this tenant's running requests


def load_api_keys(path: str | Path) -> dict[str, ApiKey]:
    """Read a keys file; a bad entry is a ValueError naming the key's position and the field."""
    raw = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(raw, dict) or not raw:
        raise ValueError(f"{path}: expected a JSON object of key -> {{\"tenant\": ...}}")
    keys = {}
    for i, (key, entry) in enumerate(raw.items()):
        try:
            keys[key] = ApiKey(**entry)
        except TypeError as error:
            raise ValueError(f"{path}: key #{i}: {error}; fields: tenant, weight, max_num_seqs") from None
        if not isinstance(keys[key].tenant, str) or not keys[key].tenant:
            raise ValueError(f"{path}: key #{i}: tenant must be a non-empty string")
    return keys


def tenant_knobs(api_keys: dict[str, ApiKey]) -> dict[str, Any]:
    """The engine knobs of the "fair" policy that the keys file sets."""
    weights = {k.tenant: k.weight for k in api_keys.values()}
    caps = {k.tenant: k.max_num_seqs for k in api_keys.values() if k.max_num_seqs is not None}
    return {"tenant_weights": weights, **({"tenant_max_num_seqs": caps} if caps else {})}


class RequestIdMiddleware:
    """Every response carries X-Request-Id (the client's, or a new one), and a body over the cap is a 413
    before any route reads it. Plain ASGI rather than BaseHTTPMiddleware, which would get between a
    streaming response and the client's disconnect."""

    def __init__(self, app: ASGIApp, max_request_bytes: int) -> None:
        self.app = app
        self.max_request_bytes = max_request_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        request_id = headers.get(b"x-request-id", b"").decode("latin-1") or uuid.uuid4().hex
        scope.setdefault("state", {}).update(request_id=request_id, arrival_time=time.perf_counter())
        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (b"x-request-id", request_id.encode())]
            await send(message)

        received = 0

        async def receive_capped() -> Message:  # a body sent in chunks, without Content-Length
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_request_bytes:
                raise OpenAIError(413, f"the request body exceeds {self.max_request_bytes} bytes")
            return message

        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_request_bytes:
            error = OpenAIError(413, f"the request body exceeds {self.max_request_bytes} bytes")
            await _error_response(error)(scope, receive, send_with_id)
            return
        await self.app(scope, receive_capped, send_with_id)


def _error_response(error: OpenAIError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status)


async def _with_cancellation(request: Request, work: Awaitable[dict[str, Any] | AsyncIterator[str]]) -> Response:
    """Run an endpoint's work unless its client disconnects first; then cancel it, which aborts its engine
    requests (a response that does not stream would otherwise run to the end for nobody). A stream is
    returned at once and watches for the disconnect itself (StreamingResponse)."""
    task = asyncio.ensure_future(work)

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.create_task(disconnected())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if not task.done():
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return Response(status_code=499)  # nginx's "client closed request": nobody reads it
    body = task.result()
    if isinstance(body, dict):
        return JSONResponse(body)
    return StreamingResponse(body, media_type="text/event-stream")


def build_app(engine: AsyncLLM, *, served_model_name: str | None = None,
              api_keys: dict[str, ApiKey] | None = None, max_pending_requests: int = 256,
              max_request_bytes: int = 1 << 20, chat_template: str | None = None,
              allow_streaming: bool = True) -> FastAPI:
    """The app around an `AsyncLLM` that is not started yet: the app's lifespan starts and stops it.
    `allow_streaming=False` answers `stream=true` with a 400 (a manifest's `api.stream: false`)."""
    state: dict[str, Any] = {"ready": False, "stopping": False, "start_error": None}

    async def start_engine() -> None:
        try:
            await engine.start()
        except Exception as error:
            logger.exception("the engine failed to start")
            state["start_error"] = str(error)
            return
        if chat_template is not None:
            engine.tokenizer.chat_template = chat_template
        name = served_model_name or engine.model_name
        state["completion"] = OpenAIServingCompletion(engine, name, max_pending_requests, allow_streaming)
        state["chat"] = OpenAIServingChat(engine, name, max_pending_requests, allow_streaming)
        state["ready"] = True

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        starting = asyncio.create_task(start_engine())
        yield
        state["stopping"] = True
        await starting
        if state["ready"]:
            await engine.shutdown()

    app = FastAPI(title="serving-lab", lifespan=lifespan)
    app.state.serving = state

    def check_ready() -> None:
        if state["stopping"]:
            raise OpenAIError(503, "the server is shutting down")
        if state["start_error"] is not None:
            raise OpenAIError(503, f"the engine failed to start: {state['start_error']}")
        if not state["ready"]:
            raise OpenAIError(503, "the server is starting: the model is loading")
        if engine.dead_error is not None:
            raise OpenAIError(503, engine.dead_error)

    def tenant_of(request: Request, user: str | None) -> str | None:
        """The API key's tenant (401 without a valid key, when keys are configured), else `user`."""
        if not api_keys:
            return user
        scheme, _, key = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or key not in api_keys:
            raise OpenAIError(401, "a valid API key is required (Authorization: Bearer <key>)")
        return api_keys[key].tenant

    @app.exception_handler(OpenAIError)
    async def openai_error(request: Request, error: OpenAIError) -> JSONResponse:
        if error.status == 500:
            logger.error("request %s: %s", request.state.request_id, error.message)
        return _error_response(error)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, error: RequestValidationError) -> JSONResponse:
        first = error.errors()[0]
        loc = [str(part) for part in first.get("loc", ()) if part != "body"]
        if first.get("type") == "json_invalid":
            return _error_response(OpenAIError(400, f"invalid JSON: {first.get('msg')}"))
        message = f"{'.'.join(loc) or 'body'}: {first.get('msg')}"
        return _error_response(OpenAIError(400, message, loc[0] if loc else None))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        status = error.status_code if error.status_code in (400, 401, 404, 413, 429, 503) else 400
        return _error_response(OpenAIError(status, str(error.detail)))

    @app.exception_handler(Exception)
    async def unexpected_error(request: Request, error: Exception) -> JSONResponse:
        logger.exception("request %s failed", request.state.request_id)
        return _error_response(OpenAIError(500, f"internal error ({type(error).__name__}); request id "
                                                f"{request.state.request_id}"))

    @app.get("/health")
    async def health() -> Response:
        check_ready()
        return Response(status_code=200)

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        check_ready()
        tenant_of(request, None)
        name = state["completion"].served_model_name
        return {"object": "list", "data": [{"id": name, "object": "model", "created": created(),
                                            "owned_by": "serving-lab", "root": engine.model_config.model_id,
                                            "max_model_len": engine.model_config.max_model_len}]}

    def trace_arrival(request: Request) -> None:
        """With --trace-requests: when the request's first bytes reached the server (the middleware's time)."""
        if engine.tracer is not None:
            engine.tracer.record(request.state.request_id, "arrived", at=request.state.arrival_time)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        check_ready()
        trace_arrival(request)
        tenant = tenant_of(request, body.user)
        work = state["completion"].create_completion(body, request.state.request_id, tenant)
        return await _with_cancellation(request, work)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        check_ready()
        trace_arrival(request)
        tenant = tenant_of(request, body.user)
        work = state["chat"].create_chat_completion(body, request.state.request_id, tenant)
        return await _with_cancellation(request, work)

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest, request: Request) -> dict[str, Any]:
        check_ready()
        tenant_of(request, None)
        state["completion"].check_model(body.model)
        if (body.prompt is None) == (body.messages is None):
            raise OpenAIError(400, "give exactly one of prompt and messages", "prompt")
        if body.prompt is not None:
            tokens = engine.tokenizer.encode(body.prompt, add_special_tokens=body.add_special_tokens)
        else:
            tokens = state["chat"].render(body.messages)
        return {"tokens": tokens, "count": len(tokens), "max_model_len": engine.model_config.max_model_len}

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest, request: Request) -> dict[str, Any]:
        check_ready()
        tenant_of(request, None)
        state["completion"].check_model(body.model)
        vocab_size = engine.model_config.vocab_size
        bad = [t for t in body.tokens if not 0 <= t < vocab_size]
        if bad:
            raise OpenAIError(400, f"token ids outside the vocabulary [0, {vocab_size}): {bad[:5]}", "tokens")
        return {"prompt": engine.tokenizer.decode(body.tokens)}

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache(request: Request) -> Response:
        check_ready()
        tenant_of(request, None)
        if not await engine.reset_prefix_cache():
            raise OpenAIError(409, "requests hold KV blocks; reset the prefix cache when the server is idle")
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics() -> Response:
        check_ready()
        return Response(generate_latest(engine.stat_logger.registry), media_type=CONTENT_TYPE_LATEST)

    if engine.tracer is not None:
        @app.get("/debug/trace/{request_id}")
        async def trace(request_id: str, request: Request) -> dict[str, Any]:
            """One request's timeline (tracing.py); `now` relates it to the caller's perf_counter. Behind
            the API keys, like every route that is not a probe."""
            tenant_of(request, None)
            events = engine.tracer.timeline(request_id)
            if not events:
                raise OpenAIError(404, f"no trace of request {request_id!r} (too old, or never seen)", "request_id")
            return {"request_id": request_id, "now": time.perf_counter(),
                    "events": [dataclasses.asdict(e) for e in events]}

    return RequestIdMiddleware(app, max_request_bytes)


class DrainingServer(uvicorn.Server):
    """uvicorn with a drain: the first SIGINT/SIGTERM marks the app as stopping (503 for new requests, /health
    included) and lets open requests run for up to `graceful_timeout` seconds; once none is left, or the
    time is up and the rest are aborted, uvicorn shuts down as usual. A second signal is uvicorn's own."""

    def __init__(self, config: uvicorn.Config, engine: AsyncLLM, serving_state: dict[str, Any],
                 graceful_timeout: float) -> None:
        super().__init__(config)
        self.engine = engine
        self.serving_state = serving_state
        self.graceful_timeout = graceful_timeout
        self.drain_deadline: float | None = None

    def handle_exit(self, sig: int, frame: Any) -> None:
        if self.drain_deadline is not None:
            super().handle_exit(sig, frame)
            return
        logger.info("draining: new requests get 503; %d open request(s) have %.0f s to finish",
                    self.engine.num_open_streams, self.graceful_timeout)
        self.serving_state["stopping"] = True
        self.drain_deadline = time.monotonic() + self.graceful_timeout

    async def on_tick(self, counter: int) -> bool:
        """Every 0.1 s on uvicorn's loop: end the drain when nothing is open or the time is up."""
        if self.drain_deadline is not None and not self.should_exit:
            if self.engine.num_open_streams and time.monotonic() >= self.drain_deadline:
                logger.warning("graceful timeout: aborting %d open request(s)", self.engine.num_open_streams)
                self.engine.abort_all("the server shut down before this request finished")
            if not self.engine.num_open_streams:
                self.should_exit = True
        return await super().on_tick(counter)


# ---- the command line: serving-lab serve ----


def run_server(args: argparse.Namespace, config: EngineConfig | None = None) -> None:
    """`serving-lab serve`: serve until a signal (and a drain)."""
    build_server(args, config).run()


def build_server(args: argparse.Namespace, config: EngineConfig | None = None) -> DrainingServer:
    """The server `serving-lab serve` runs, not started. `config`: a deployment's whole engine config (a
    manifest's); without one the flags set the knobs they name. `args.allow_streaming` (a manifest's
    `api.stream`, default True): False answers `stream=true` with a 400."""
    api_keys = load_api_keys(args.api_key_file) if args.api_key_file else None
    knobs: dict[str, Any] = {"config": config} if config is not None else {
        name: getattr(args, name) for name in ("max_model_len", "max_num_seqs", "scheduling_policy")
        if getattr(args, name, None) is not None}
    if api_keys:
        knobs |= tenant_knobs(api_keys)
    chat_template = Path(args.chat_template).read_text(encoding="utf-8") if args.chat_template else None
    served_model_name = getattr(args, "served_model_name", None)
    engine = AsyncLLM(EngineArgs(getattr(args, "model", None), dtype=getattr(args, "dtype", "float32"),
                                 quantization=getattr(args, "quantization", None),
                                 kv_cache_dtype=getattr(args, "kv_cache_dtype", "auto"),
                                 enforce_eager=getattr(args, "enforce_eager", True), engine_kwargs=knobs,
                                 trace_requests=args.trace_requests), served_model_name)
    app = build_app(engine, served_model_name=served_model_name, api_keys=api_keys,
                    max_pending_requests=args.max_pending_requests, max_request_bytes=args.max_request_bytes,
                    chat_template=chat_template, allow_streaming=getattr(args, "allow_streaming", True))
    # the drain has already waited for open requests; uvicorn's own wait only covers stragglers
    uv_config = uvicorn.Config(app, host=args.host, port=args.port, timeout_graceful_shutdown=5, log_level="info")
    # app.app: the FastAPI app inside RequestIdMiddleware, whose state says "stopping" to every route
    return DrainingServer(uv_config, engine, app.app.state.serving, args.graceful_timeout)
