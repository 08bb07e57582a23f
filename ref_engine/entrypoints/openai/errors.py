"""The app's exception handlers: every error, whoever raised it, reaches the client in OpenAI's schema
({"error": {"message", "type", "param", "code"}}) and is counted by reason (`ServerState.refuse`).

`OpenAIError` is ours (serving.py); a body FastAPI cannot validate is a 400 naming the field; Starlette's
own HTTP errors keep their status when a client can act on it (404, 405 with its Allow header, ...) and
are a 400 otherwise; anything else is a 500 that names the request id and is logged with its traceback.

Lesson: lessons/06-architecture-map.md (the API server).
"""

from __future__ import annotations

import logging

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ref_engine.entrypoints.openai.server_state import server_state
from ref_engine.entrypoints.openai.serving import OpenAIError

logger = logging.getLogger(__name__)

PASSED_THROUGH = (400, 401, 403, 404, 405, 413, 429, 503)  # HTTP errors kept as they are; others become 400


async def openai_error(request: Request, error: OpenAIError) -> JSONResponse:
    if error.status == 500:
        logger.error("request %s: %s", request.state.request_id, error.message)
    return server_state(request).refuse(error)


async def validation_error(request: Request, error: RequestValidationError) -> JSONResponse:
    first = error.errors()[0]
    loc = [str(part) for part in first.get("loc", ()) if part != "body"]
    if first.get("type") == "json_invalid":
        return server_state(request).refuse(OpenAIError(400, f"invalid JSON: {first.get('msg')}"))
    message = f"{'.'.join(loc) or 'body'}: {first.get('msg')}"
    return server_state(request).refuse(OpenAIError(400, message, loc[0] if loc else None))


async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
    status = error.status_code if error.status_code in PASSED_THROUGH else 400
    return server_state(request).refuse(OpenAIError(status, str(error.detail), headers=dict(error.headers or {})))


async def unexpected_error(request: Request, error: Exception) -> JSONResponse:
    logger.exception("request %s failed", request.state.request_id)
    return server_state(request).refuse(OpenAIError(500, f"internal error ({type(error).__name__}); request id "
                                                         f"{request.state.request_id}", reason="internal_error"))


# FastAPI(exception_handlers=...): `Exception` goes to Starlette's outermost error middleware
EXCEPTION_HANDLERS = {OpenAIError: openai_error, RequestValidationError: validation_error,
                      StarletteHTTPException: http_error, Exception: unexpected_error}
