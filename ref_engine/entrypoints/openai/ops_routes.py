"""The operations routes, for load balancers, dashboards and operators rather than OpenAI clients:
`router` (GET /health, GET /metrics, POST /reset_prefix_cache) and `trace_router` (GET
/debug/trace/<X-Request-Id>, included only with --trace-requests).

/health and /metrics are probes: no API key. /health is 200 once the model is loaded and 503 while it loads,
drains or after the engine died, so a load balancer waits on it and sends traffic elsewhere.

Lesson: lessons/06-architecture-map.md (the API server).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ref_engine.entrypoints.openai.server_state import State
from ref_engine.entrypoints.openai.serving import OpenAIError

router = APIRouter()
trace_router = APIRouter()


@router.get("/health")
async def health(state: State) -> Response:
    state.check_ready()
    return Response(status_code=200)


@router.post("/reset_prefix_cache")
async def reset_prefix_cache(request: Request, state: State, tenant: str | None = None) -> Response:
    """Under load too: blocks in use leave the cache index now and are freed when their requests end.
    With keys a tenant resets its own entries (naming another is a 403); an admin key resets every
    tenant's, or the one `tenant` names. Without keys (one tenant) it resets everything."""
    state.check_ready()
    key = state.api_key_of(request)
    if key is None:
        if tenant is not None:
            raise OpenAIError(400, "this server has no API keys, so no tenants: reset without ?tenant=", "tenant")
    elif not key.admin:
        if tenant not in (None, key.tenant):
            raise OpenAIError(403, f"this key may reset only its own tenant's cache ({key.tenant!r}); "
                                   "resetting another tenant's needs an admin key", "tenant")
        tenant = key.tenant
    await state.engine.reset_prefix_cache(tenant)
    return Response(status_code=200)


@router.get("/metrics")
async def metrics(state: State) -> Response:
    state.check_ready()
    return Response(generate_latest(state.engine.stat_logger.registry), media_type=CONTENT_TYPE_LATEST)


@trace_router.get("/debug/trace/{request_id}")
async def trace(request_id: str, request: Request, state: State) -> dict[str, Any]:
    """One request's timeline (tracing.py); `now` relates it to the caller's perf_counter. Behind the API
    keys, like every route that is not a probe."""
    state.tenant_of(request)
    events = state.engine.tracer.timeline(request_id)
    if not events:
        raise OpenAIError(404, f"no trace of request {request_id!r} (too old, or never seen)", "request_id")
    return {"request_id": request_id, "now": time.perf_counter(), "events": [dataclasses.asdict(e) for e in events]}
