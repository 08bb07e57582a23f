"""The OpenAI-compatible HTTP server (FastAPI + uvicorn, as vLLM's `api_server.py`): `build_app` puts the
routers (openai_routes.py, ops_routes.py) over a typed `ServerState` (server_state.py), with the exception
handlers (errors.py) and the request-id middleware (middleware.py); the lifespan, the drain
(`DrainingServer`) and `serving-lab serve` (`build_server`, `run_server`) are here.

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

With `--dashboard` the app also serves the live dashboard (ref_engine/entrypoints/dashboard/) at
/dashboard: like /metrics it needs no key, and it shows the tenants' names and service.

Lesson: lessons/06-architecture-map.md (the API server).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI, Request

from core.config import EngineConfig
from ref_engine.async_engine.async_llm import AsyncLLM
from ref_engine.engine_core.core import EngineCoreArgs
from ref_engine.entrypoints.dashboard.live import live_frames
from ref_engine.entrypoints.dashboard.routes import Frames, install_dashboard
from ref_engine.entrypoints.openai import openai_routes, ops_routes
from ref_engine.entrypoints.openai.admission import Admission
from ref_engine.entrypoints.openai.errors import EXCEPTION_HANDLERS
from ref_engine.entrypoints.openai.middleware import RequestIdMiddleware
from ref_engine.entrypoints.openai.server_state import ServerState
from ref_engine.entrypoints.openai.serving import DEFAULT_MAX_LOGPROBS
from ref_engine.entrypoints.openai.tenants import (
    ApiKey,
    TenantPolicy,
    load_api_keys,
    tenant_knobs,
    tenant_policies,
)

logger = logging.getLogger(__name__)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Start the engine core in the background, so the server listens (and /health says 503) while the
    model loads; on shutdown stop routing, wait for the start to settle and stop the engine core."""
    state: ServerState = app.state.server
    starting = asyncio.create_task(state.start_engine())
    yield
    state.stopping = True
    await starting
    if state.ready:
        await state.engine.shutdown()


def build_app(engine: AsyncLLM, *, served_model_name: str | None = None,
              api_keys: dict[str, ApiKey] | None = None, tenants: dict[str, TenantPolicy] | None = None,
              max_pending_requests: int = 256, max_request_bytes: int = 1 << 20, chat_template: str | None = None,
              allow_streaming: bool = True, max_logprobs: int = DEFAULT_MAX_LOGPROBS) -> RequestIdMiddleware:
    """The app around an `AsyncLLM` that is not started yet: the app's lifespan starts and stops it.
    `tenants`: the policies of the keys' tenants (admission here; the engine's knobs are set by whoever
    built `engine`). `allow_streaming=False` answers `stream=true` with a 400 (a manifest's `api.stream:
    false`). The routes read a `ServerState` on `app.state.server` (server_state.py), whose `fatal` says
    why the server cannot serve any more, for `DrainingServer` to exit on."""
    state = ServerState(engine, Admission(max_pending_requests, tenants), api_keys=api_keys,
                        served_model_name=served_model_name, chat_template=chat_template,
                        allow_streaming=allow_streaming, max_logprobs=max_logprobs)
    app = FastAPI(title="serving-lab", lifespan=lifespan, exception_handlers=EXCEPTION_HANDLERS)
    app.state.server = state
    app.include_router(ops_routes.router)
    app.include_router(openai_routes.router)
    if engine.tracer is not None:
        app.include_router(ops_routes.trace_router)
    if engine.step_feed is not None:
        install_dashboard(app, dashboard_frames(state))
    return RequestIdMiddleware(app, max_request_bytes, state.refuse)


def dashboard_frames(state: ServerState) -> Callable[[Request], Frames]:
    """What /dashboard/events streams: the engine's live frames once the server is ready (a 503 before),
    until it drains; beside each tenant's service, its weight under the fair policy (None under another)."""
    knobs = state.engine.engine_args.engine_kwargs
    config = knobs.get("config")
    weights = dict(knobs.get("tenant_weights", config.tenant_weights if config is not None else None) or ())

    def open_frames(request: Request) -> Frames:
        state.check_ready()
        engine = state.engine
        fair = engine.model_config.scheduling_policy == "fair"
        return live_frames(engine.step_feed, engine.stat_logger.registry, engine.model_name,
                           weights if fair else None, lambda: state.stopping)

    return open_frames


class DrainingServer(uvicorn.Server):
    """uvicorn with a drain and a watchdog. The first SIGINT/SIGTERM marks the app as stopping (503 for new
    requests, /health included) and lets open requests run for up to `graceful_timeout` seconds; once none
    is left, or the time is up and the rest are aborted, uvicorn shuts down as usual. A second signal is
    uvicorn's own. When the app cannot serve any more (the engine did not start, or its core died),
    uvicorn shuts down and `exit_reason` says why, for `run_server` to exit non-zero with."""

    def __init__(self, config: uvicorn.Config, state: ServerState, graceful_timeout: float) -> None:
        super().__init__(config)
        self.state = state
        self.engine = state.engine
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
        self.state.stopping = True
        self.drain_deadline = time.monotonic() + self.graceful_timeout

    async def on_tick(self, counter: int) -> bool:
        """Every 0.1 s on uvicorn's loop: say "ready" once; exit when the server cannot serve; end the drain
        when nothing is open or the time is up."""
        state = self.state
        if state.ready and not self._announced_ready:
            self._announced_ready = True
            config = self.config
            print(f"ready: {self.engine.model_name} at http://{config.host}:{config.port}", flush=True)
        fatal = state.fatal or (self.engine.dead_error if state.ready and not state.stopping else None)
        if fatal is not None and self.exit_reason is None:
            self.exit_reason = fatal
            state.stopping = True
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
    if getattr(args, "tensor_parallel_size", None) is not None:  # a ParallelConfig knob: the engine takes it too
        knobs["tensor_parallel_size"] = args.tensor_parallel_size
    if getattr(args, "allow_cpu_oversubscription", False):
        knobs["allow_cpu_oversubscription"] = True
    if getattr(args, "quantization_group_size", None) is not None:  # a load-time knob: the engine takes it
        knobs["quantization_group_size"] = args.quantization_group_size
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
    engine = AsyncLLM(EngineCoreArgs(getattr(args, "model", None), dtype=getattr(args, "dtype", "float32"),
                                     quantization=getattr(args, "quantization", None),
                                     kv_cache_dtype=getattr(args, "kv_cache_dtype", "auto"),
                                     enforce_eager=getattr(args, "enforce_eager", True), engine_kwargs=knobs,
                                     trace_requests=args.trace_requests, dashboard=args.dashboard),
                      served_model_name)
    app = build_app(engine, served_model_name=served_model_name, api_keys=key_file.keys if key_file else None,
                    tenants=policies if key_file else None, max_pending_requests=args.max_pending_requests,
                    max_request_bytes=args.max_request_bytes, chat_template=chat_template,
                    allow_streaming=getattr(args, "allow_streaming", True),
                    max_logprobs=getattr(args, "max_logprobs", DEFAULT_MAX_LOGPROBS))
    # the drain has already waited for open requests; uvicorn's own wait only covers stragglers
    uv_config = uvicorn.Config(app, host=args.host, port=args.port, timeout_graceful_shutdown=5, log_level="info")
    # app.app: the FastAPI app inside RequestIdMiddleware; its state says "stopping" to every route
    return DrainingServer(uv_config, app.app.state.server, args.graceful_timeout)
