"""`RequestIdMiddleware`: the ASGI layer outside the whole app. Every response carries X-Request-Id (the
client's, or a new one), and a body over `--max-request-bytes` is a 413 before any route reads it.

It wraps the FastAPI app from outside (rather than `app.add_middleware`) so that even the 500 that
Starlette's outermost error middleware answers carries the id.

Lesson: lessons/06-architecture-map.md (the API server).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ref_engine.entrypoints.openai.serving import OpenAIError


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
