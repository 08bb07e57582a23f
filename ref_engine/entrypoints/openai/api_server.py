"""The OpenAI-compatible HTTP server (FastAPI + uvicorn, as vLLM's `api_server.py`): routes, API keys,
errors in OpenAI's schema, X-Request-Id, the body-size cap, startup and shutdown.

The server listens at once and starts the engine core in the background: until the model is loaded every
route but /health's liveness answers 503, so a load balancer can wait on GET /health; `serving-lab serve`
prints "loading the model ..." and then "ready" with the URL. A server that cannot do its job exits
non-zero with the reason on one line, as vLLM's does, so a supervisor restarts it: when the engine core
fails to start, and when it dies later (its open streams get an error first). On SIGINT/SIGTERM it
drains (`DrainingServer`): it keeps listening but answers every new request 503, so a load balancer sends
them elsewhere instead of seeing refused connections, while the open requests run for up to
`--graceful-timeout` seconds; then the ones left are aborted (their blocks freed), uvicorn stops and the
engine core exits. A second signal stops at once.

Tenants (tenants.py): with `--api-key-file` every request needs `Authorization: Bearer <key>` and runs
as that key's tenant, which isolates its prefix-cache entries, has its pending cap and token budget here
(admission.py) and its weight and running cap in the engine. Without keys the server is ONE tenant, as
vLLM: every client shares the prefix cache (`cache_salt` splits it), and `user` only groups requests for
the "fair" policy. POST /reset_prefix_cache resets the caller's tenant (`?tenant=` may name only it); a
key marked `"admin": true` resets every tenant, or the one `?tenant=` names.

Every refused or failed request is counted in `serving_lab:request_failures_total{reason,status}`.

Lesson: lessons/06-architecture-map.md (the API server).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
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
from ref_engine.entrypoints.openai.admission import Admission
from ref_engine.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from ref_engine.entrypoints.openai.serving import DEFAULT_MAX_LOGPROBS, OpenAIError, check_text, created
from ref_engine.entrypoints.openai.serving_chat import OpenAIServingChat
from ref_engine.entrypoints.openai.serving_completion import OpenAIServingCompletion
from ref_engine.entrypoints.openai.tenants import (
    ApiKey,
    TenantPolicy,
    load_api_keys,
    tenant_knobs,
    tenant_policies,
)

logger = logging.getLogger(__name__)

UNAUTHENTICATED_PATHS = frozenset({"/health", "/metrics"})
PASSED_THROUGH = (400, 401, 403, 404, 405, 413, 429, 503)  # HTTP errors kept as they are; others become 400


class RequestIdMiddleware:
    """Every response carries X-Request-Id (the client's, or a new one), and a body over the cap is a 413
    before any route reads it: at once when Content-Length says so, else (a chunked body) once the chunks
    read so far pass the cap. Plain ASGI rather than BaseHTTPMiddleware, which would get between a
    streaming response and the client's disconnect. `on_error` counts the 413s it answers itself."""

    def __init__(self, app: ASGIApp, max_request_bytes: int,
                 on_error: Callable[[OpenAIError], JSONResponse]) -> None:
        self.app = app
        self.max_request_bytes = max_request_bytes
        self.on_error = on_error

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

        too_large = OpenAIError(413, f"the request body exceeds {self.max_request_bytes} bytes")
        length = headers.get(b"content-length")
        if length is not None:
            if length.isdigit() and int(length) > self.max_request_bytes:
                await self.on_error(too_large)(scope, receive, send_with_id)
                return
        elif scope["method"] in ("POST", "PUT", "PATCH"):  # chunked: read it here, up to the cap
            body = await self._read_capped(receive)
            if body is None:
                await self.on_error(too_large)(scope, receive, send_with_id)
                return
            receive = _replay(body, receive)
        await self.app(scope, receive, send_with_id)

    async def _read_capped(self, receive: Receive) -> bytes | None:
        """The whole body, or None as soon as it passes the cap (or the client leaves)."""
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_request_bytes:
                return None
            more = message.get("more_body", False)
        return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that gives the body read already, then the connection's own messages (a disconnect)."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replayed


def _error_response(error: OpenAIError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


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
              api_keys: dict[str, ApiKey] | None = None, tenants: dict[str, TenantPolicy] | None = None,
              max_pending_requests: int = 256, max_request_bytes: int = 1 << 20, chat_template: str | None = None,
              allow_streaming: bool = True, max_logprobs: int = DEFAULT_MAX_LOGPROBS) -> RequestIdMiddleware:
    """The app around an `AsyncLLM` that is not started yet: the app's lifespan starts and stops it.
    `tenants`: the policies of the keys' tenants (admission here; the engine's knobs are set by whoever
    built `engine`). `allow_streaming=False` answers `stream=true` with a 400 (a manifest's `api.stream:
    false`). The app's `state.serving["fatal"]` says why the server cannot serve any more (the engine did
    not start, or died), for `DrainingServer` to exit on."""
    state: dict[str, Any] = {"ready": False, "stopping": False, "start_error": None, "fatal": None}
    admission = Admission(max_pending_requests, tenants)

    async def start_engine() -> None:
        try:
            await engine.start()
        except Exception as error:
            logger.debug("the engine failed to start", exc_info=True)
            state["start_error"] = state["fatal"] = f"the engine failed to start: {error}"
            return
        if chat_template is not None:
            engine.tokenizer.chat_template = chat_template
        name = served_model_name or engine.model_name
        state["completion"] = OpenAIServingCompletion(engine, name, admission, allow_streaming, max_logprobs)
        state["chat"] = OpenAIServingChat(engine, name, admission, allow_streaming, max_logprobs)
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
    app.state.admission = admission

    def refuse(error: OpenAIError) -> JSONResponse:
        """The error response, counted by reason (once the engine, and so its metrics, is up)."""
        if engine.stat_logger is not None:
            engine.stat_logger.record_failure(error.reason, error.status)
        return _error_response(error)

    def check_ready() -> None:
        if state["stopping"]:
            raise OpenAIError(503, "the server is shutting down")
        if state["start_error"] is not None:
            raise OpenAIError(503, state["start_error"])
        if not state["ready"]:
            raise OpenAIError(503, "the server is starting: the model is loading")
        if engine.dead_error is not None:
            raise OpenAIError(503, engine.dead_error)

    def api_key_of(request: Request) -> ApiKey | None:
        """The caller's key (401 without a valid one, when keys are configured); None on a keyless server."""
        if not api_keys:
            return None
        scheme, _, key = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or key not in api_keys:
            raise OpenAIError(401, "a valid API key is required (Authorization: Bearer <key>)")
        return api_keys[key]

    def tenant_of(request: Request) -> str | None:
        """The authenticated tenant; None on a keyless server (one tenant: the `user` field never names one)."""
        key = api_key_of(request)
        return key.tenant if key else None

    @app.exception_handler(OpenAIError)
    async def openai_error(request: Request, error: OpenAIError) -> JSONResponse:
        if error.status == 500:
            logger.error("request %s: %s", request.state.request_id, error.message)
        return refuse(error)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, error: RequestValidationError) -> JSONResponse:
        first = error.errors()[0]
        loc = [str(part) for part in first.get("loc", ()) if part != "body"]
        if first.get("type") == "json_invalid":
            return refuse(OpenAIError(400, f"invalid JSON: {first.get('msg')}"))
        message = f"{'.'.join(loc) or 'body'}: {first.get('msg')}"
        return refuse(OpenAIError(400, message, loc[0] if loc else None))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        status = error.status_code if error.status_code in PASSED_THROUGH else 400
        return refuse(OpenAIError(status, str(error.detail), headers=dict(error.headers or {})))

    @app.exception_handler(Exception)
    async def unexpected_error(request: Request, error: Exception) -> JSONResponse:
        logger.exception("request %s failed", request.state.request_id)
        return refuse(OpenAIError(500, f"internal error ({type(error).__name__}); request id "
                                       f"{request.state.request_id}", reason="internal_error"))

    @app.get("/health")
    async def health() -> Response:
        check_ready()
        return Response(status_code=200)

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        check_ready()
        tenant_of(request)
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
        work = state["completion"].create_completion(body, request.state.request_id, tenant_of(request),
                                                     request.state.arrival_time)
        return await _with_cancellation(request, work)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        check_ready()
        trace_arrival(request)
        work = state["chat"].create_chat_completion(body, request.state.request_id, tenant_of(request),
                                                    request.state.arrival_time)
        return await _with_cancellation(request, work)

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest, request: Request) -> dict[str, Any]:
        check_ready()
        tenant_of(request)
        state["completion"].check_model(body.model)
        if (body.prompt is None) == (body.messages is None):
            raise OpenAIError(400, "give exactly one of prompt and messages", "prompt")
        if body.prompt is not None:
            check_text(body.prompt, "prompt")
            tokens = engine.tokenizer.encode(body.prompt, add_special_tokens=body.add_special_tokens)
        else:
            tokens = state["chat"].render(body.messages)
        return {"tokens": tokens, "count": len(tokens), "max_model_len": engine.model_config.max_model_len}

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest, request: Request) -> dict[str, Any]:
        check_ready()
        tenant_of(request)
        state["completion"].check_model(body.model)
        vocab_size = engine.model_config.vocab_size
        bad = [t for t in body.tokens if not 0 <= t < vocab_size]
        if bad:
            raise OpenAIError(400, f"token ids outside the vocabulary [0, {vocab_size}): {bad[:5]}", "tokens")
        return {"prompt": engine.tokenizer.decode(body.tokens)}

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache(request: Request, tenant: str | None = None) -> Response:
        """Under load too: blocks in use leave the cache index now and are freed when their requests end.
        With keys a tenant resets its own entries (naming another is a 403); an admin key resets every
        tenant's, or the one `tenant` names. Without keys (one tenant) it resets everything."""
        check_ready()
        key = api_key_of(request)
        if key is None:
            if tenant is not None:
                raise OpenAIError(400, "this server has no API keys, so no tenants: reset without ?tenant=",
                                  "tenant")
        elif not key.admin:
            if tenant not in (None, key.tenant):
                raise OpenAIError(403, f"this key may reset only its own tenant's cache ({key.tenant!r}); "
                                       "resetting another tenant's needs an admin key", "tenant")
            tenant = key.tenant
        await engine.reset_prefix_cache(tenant)
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
            tenant_of(request)
            events = engine.tracer.timeline(request_id)
            if not events:
                raise OpenAIError(404, f"no trace of request {request_id!r} (too old, or never seen)", "request_id")
            return {"request_id": request_id, "now": time.perf_counter(),
                    "events": [dataclasses.asdict(e) for e in events]}

    return RequestIdMiddleware(app, max_request_bytes, refuse)


class DrainingServer(uvicorn.Server):
    """uvicorn with a drain and a watchdog. The first SIGINT/SIGTERM marks the app as stopping (503 for new
    requests, /health included) and lets open requests run for up to `graceful_timeout` seconds; once none
    is left, or the time is up and the rest are aborted, uvicorn shuts down as usual. A second signal is
    uvicorn's own. When the app cannot serve any more (the engine did not start, or its core died),
    uvicorn shuts down and `exit_reason` says why, for `run_server` to exit non-zero with."""

    def __init__(self, config: uvicorn.Config, engine: AsyncLLM, serving_state: dict[str, Any],
                 graceful_timeout: float) -> None:
        super().__init__(config)
        self.engine = engine
        self.serving_state = serving_state
        self.graceful_timeout = graceful_timeout
        self.drain_deadline: float | None = None
        self.exit_reason: str | None = None
        self._announced_ready = False

    def handle_exit(self, sig: int, frame: Any) -> None:
        if self.drain_deadline is not None:
            super().handle_exit(sig, frame)
            return
        logger.info("draining: new requests get 503; %d open request(s) have %.0f s to finish",
                    self.engine.num_open_streams, self.graceful_timeout)
        self.serving_state["stopping"] = True
        self.drain_deadline = time.monotonic() + self.graceful_timeout

    async def on_tick(self, counter: int) -> bool:
        """Every 0.1 s on uvicorn's loop: say "ready" once; exit when the server cannot serve; end the drain
        when nothing is open or the time is up."""
        state = self.serving_state
        if state["ready"] and not self._announced_ready:
            self._announced_ready = True
            config = self.config
            print(f"ready: {self.engine.model_name} at http://{config.host}:{config.port}", flush=True)
        fatal = state["fatal"] or (self.engine.dead_error if state["ready"] and not state["stopping"] else None)
        if fatal is not None and self.exit_reason is None:
            self.exit_reason = fatal
            state["stopping"] = True
            self.should_exit = True
        if self.drain_deadline is not None and not self.should_exit:
            if self.engine.num_open_streams and time.monotonic() >= self.drain_deadline:
                logger.warning("graceful timeout: aborting %d open request(s)", self.engine.num_open_streams)
                self.engine.abort_all("the server shut down before this request finished")
            if not self.engine.num_open_streams:
                self.should_exit = True
        return await super().on_tick(counter)


# ---- the command line: serving-lab serve ----


def run_server(args: argparse.Namespace, config: EngineConfig | None = None) -> None:
    """`serving-lab serve`: serve until a signal (and a drain); exit non-zero with the reason on one line
    when the engine cannot start or its core dies, so a supervisor restarts the server."""
    server = build_server(args, config)
    print("loading the model ...", flush=True)
    server.run()
    if server.exit_reason is not None:
        print(f"serving-lab serve: error: {server.exit_reason}", file=sys.stderr, flush=True)
        sys.exit(1)


def build_server(args: argparse.Namespace, config: EngineConfig | None = None) -> DrainingServer:
    """The server `serving-lab serve` runs, not started. `config`: a deployment's whole engine config (a
    manifest's); without one the flags set the knobs they name. `args.tenants` (a manifest's `tenants:`
    section, None without) and `--api-key-file` give the tenants' policies, the key file's fields winning.
    `args.allow_streaming` (a manifest's `api.stream`, default True): False answers `stream=true` with a 400."""
    key_file = load_api_keys(args.api_key_file) if args.api_key_file else None
    manifest_tenants = getattr(args, "tenants", None)
    policies = tenant_policies(manifest_tenants, key_file)
    knobs: dict[str, Any] = {"config": config} if config is not None else {
        name: getattr(args, name) for name in ("max_model_len", "max_num_seqs", "scheduling_policy")
        if getattr(args, name, None) is not None}
    if key_file is not None:
        scheduling_policy = config.scheduling_policy if config is not None else knobs.get("scheduling_policy", "fcfs")
        knobs |= tenant_knobs(policies, scheduling_policy)
        print(f"tenants from {args.api_key_file}: {', '.join(sorted(policies))} (each isolated in the prefix cache)",
              flush=True)
    else:
        if manifest_tenants:
            print("warning: the manifest's tenants are not applied: tenants come from API keys only "
                  "(--api-key-file)", file=sys.stderr, flush=True)
        print("no --api-key-file: every client is one tenant and shares the prefix cache (cache_salt splits "
              "it; `user` only groups requests for the fair policy)", flush=True)
    chat_template = Path(args.chat_template).read_text(encoding="utf-8") if args.chat_template else None
    served_model_name = getattr(args, "served_model_name", None)
    engine = AsyncLLM(EngineArgs(getattr(args, "model", None), dtype=getattr(args, "dtype", "float32"),
                                 quantization=getattr(args, "quantization", None),
                                 kv_cache_dtype=getattr(args, "kv_cache_dtype", "auto"),
                                 enforce_eager=getattr(args, "enforce_eager", True), engine_kwargs=knobs,
                                 trace_requests=args.trace_requests), served_model_name)
    app = build_app(engine, served_model_name=served_model_name, api_keys=key_file.keys if key_file else None,
                    tenants=policies if key_file else None, max_pending_requests=args.max_pending_requests,
                    max_request_bytes=args.max_request_bytes, chat_template=chat_template,
                    allow_streaming=getattr(args, "allow_streaming", True),
                    max_logprobs=getattr(args, "max_logprobs", DEFAULT_MAX_LOGPROBS))
    # the drain has already waited for open requests; uvicorn's own wait only covers stragglers
    uv_config = uvicorn.Config(app, host=args.host, port=args.port, timeout_graceful_shutdown=5, log_level="info")
    # app.app: the FastAPI app inside RequestIdMiddleware, whose state says "stopping" to every route
    return DrainingServer(uv_config, engine, app.app.state.serving, args.graceful_timeout)
