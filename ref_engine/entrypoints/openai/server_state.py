"""`ServerState`: what every route of the API server reads, typed, on `app.state.server` (vLLM keeps its
engine client and serving objects on `app.state` the same way), and `server_state`, the FastAPI dependency
that hands it to a route.

It owns the server's life as the routes see it: starting (the engine core loads in the background, every
route but /health's liveness answers 503 meanwhile), ready, stopping (the drain, or a dead engine), and
`fatal`, the reason the server cannot serve any more, for `DrainingServer` (api_server.py) to exit on. It
also owns who the caller is (`api_key_of`, `tenant_of`: tenants come from API keys only, tenants.py) and
`refuse`, the one way an error becomes a response, counted by reason in the failure counter.

Lesson: lessons/06-architecture-map.md (the API server).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.responses import JSONResponse

from ref_engine.async_engine.async_llm import AsyncLLM
from ref_engine.entrypoints.openai.admission import Admission
from ref_engine.entrypoints.openai.serving import DEFAULT_MAX_LOGPROBS, OpenAIError
from ref_engine.entrypoints.openai.serving_chat import OpenAIServingChat
from ref_engine.entrypoints.openai.serving_completion import OpenAIServingCompletion
from ref_engine.entrypoints.openai.tenants import ApiKey

logger = logging.getLogger(__name__)


@dataclass
class ServerState:
    """The engine, the admission shared by every endpoint, the API keys (None: a keyless server, one
    tenant) and the serving options; then the life of the server. `completion` and `chat` exist once
    `ready`: they need the engine's tokenizer and model name."""

    engine: AsyncLLM
    admission: Admission
    api_keys: dict[str, ApiKey] | None = None
    served_model_name: str | None = None
    chat_template: str | None = None
    allow_streaming: bool = True  # False: `stream=true` is a 400 (a manifest's `api.stream: false`)
    max_logprobs: int = DEFAULT_MAX_LOGPROBS
    ready: bool = False
    stopping: bool = False
    start_error: str | None = None
    fatal: str | None = None  # why the server cannot serve any more: the engine did not start, or died
    completion: OpenAIServingCompletion | None = None
    chat: OpenAIServingChat | None = None

    async def start_engine(self) -> None:
        """Start the engine core (in the background of the app's lifespan); on failure every route says
        why with a 503 and the server exits with the reason."""
        try:
            await self.engine.start()
        except Exception as error:
            logger.debug("the engine failed to start", exc_info=True)
            self.start_error = self.fatal = f"the engine failed to start: {error}"
            return
        if self.chat_template is not None:
            self.engine.tokenizer.chat_template = self.chat_template
        name = self.served_model_name or self.engine.model_name
        self.completion = OpenAIServingCompletion(self.engine, name, self.admission, self.allow_streaming,
                                                  self.max_logprobs)
        self.chat = OpenAIServingChat(self.engine, name, self.admission, self.allow_streaming, self.max_logprobs)
        self.ready = True

    def check_ready(self) -> None:
        """A 503 unless the server can serve now: not draining, the engine started and alive."""
        if self.stopping:
            raise OpenAIError(503, "the server is shutting down")
        if self.start_error is not None:
            raise OpenAIError(503, self.start_error)
        if not self.ready:
            raise OpenAIError(503, "the server is starting: the model is loading")
        if self.engine.dead_error is not None:
            raise OpenAIError(503, self.engine.dead_error)

    def api_key_of(self, request: Request) -> ApiKey | None:
        """The caller's key (401 without a valid one, when keys are configured); None on a keyless server."""
        if not self.api_keys:
            return None
        scheme, _, key = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or key not in self.api_keys:
            raise OpenAIError(401, "a valid API key is required (Authorization: Bearer <key>)")
        return self.api_keys[key]

    def tenant_of(self, request: Request) -> str | None:
        """The authenticated tenant; None on a keyless server (one tenant: the `user` field never names one)."""
        key = self.api_key_of(request)
        return key.tenant if key else None

    def refuse(self, error: OpenAIError) -> JSONResponse:
        """The error response, counted by reason (once the engine, and so its metrics, is up)."""
        if self.engine.stat_logger is not None:
            self.engine.stat_logger.record_failure(error.reason, error.status)
        return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


def server_state(request: Request) -> ServerState:
    """The dependency: the app's `ServerState`."""
    return request.app.state.server


State = Annotated[ServerState, Depends(server_state)]  # a route's parameter `state: State`
