"""`router`: the OpenAI API's routes (/v1/models, /v1/completions, /v1/chat/completions) and vLLM's
/tokenize and /detokenize. Each route checks that the server is ready, then who the caller is (a 401
without a valid key, when the server has keys), and hands the checked body to `OpenAIServingCompletion`
or `OpenAIServingChat` (serving*.py) with the caller's tenant.

A request whose client leaves before its response is whole is cancelled (`with_cancellation`), which
aborts its engine requests and frees their blocks.

Lesson: lessons/06-architecture-map.md (the API server).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ref_engine.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from ref_engine.entrypoints.openai.server_state import ServerState, State
from ref_engine.entrypoints.openai.serving import OpenAIError, check_text, created

router = APIRouter()


async def with_cancellation(request: Request, work: Awaitable[dict[str, Any] | AsyncIterator[str]]) -> Response:
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


def start_generation(state: ServerState, request: Request) -> str | None:
    """What a generating route does before its work, in this order: a 503 unless the server is ready; with
    --trace-requests, the request's arrival (when its first bytes reached the middleware); the caller's
    tenant, returned (a 401 without a valid key)."""
    state.check_ready()
    if state.engine.tracer is not None:
        state.engine.tracer.record(request.state.request_id, "arrived", at=request.state.arrival_time)
    return state.tenant_of(request)


@router.get("/v1/models")
async def models(request: Request, state: State) -> dict[str, Any]:
    state.check_ready()
    state.tenant_of(request)
    model_config = state.engine.model_config
    return {"object": "list", "data": [{"id": state.completion.served_model_name, "object": "model",
                                        "created": created(), "owned_by": "serving-lab",
                                        "root": model_config.model_id, "max_model_len": model_config.max_model_len}]}


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request, state: State) -> Response:
    tenant = start_generation(state, request)
    work = state.completion.create_completion(body, request.state.request_id, tenant, request.state.arrival_time)
    return await with_cancellation(request, work)


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request, state: State) -> Response:
    tenant = start_generation(state, request)
    work = state.chat.create_chat_completion(body, request.state.request_id, tenant, request.state.arrival_time)
    return await with_cancellation(request, work)


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, request: Request, state: State) -> dict[str, Any]:
    state.check_ready()
    state.tenant_of(request)
    state.completion.check_model(body.model)
    if (body.prompt is None) == (body.messages is None):
        raise OpenAIError(400, "give exactly one of prompt and messages", "prompt")
    if body.prompt is not None:
        check_text(body.prompt, "prompt")
        tokens = state.engine.tokenizer.encode(body.prompt, add_special_tokens=body.add_special_tokens)
    else:
        tokens = state.chat.render(body.messages)
    return {"tokens": tokens, "count": len(tokens), "max_model_len": state.engine.model_config.max_model_len}


@router.post("/detokenize")
async def detokenize(body: DetokenizeRequest, request: Request, state: State) -> dict[str, Any]:
    state.check_ready()
    state.tenant_of(request)
    state.completion.check_model(body.model)
    vocab_size = state.engine.model_config.vocab_size
    bad = [t for t in body.tokens if not 0 <= t < vocab_size]
    if bad:
        raise OpenAIError(400, f"token ids outside the vocabulary [0, {vocab_size}): {bad[:5]}", "tokens")
    return {"prompt": state.engine.tokenizer.decode(body.tokens)}
