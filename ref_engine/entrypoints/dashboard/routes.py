"""The dashboard's routes on a FastAPI app: the page, its static files, and its one event stream.

- GET /dashboard: the page (static/index.html), which needs no build step and no network: its one
  library, uPlot, is vendored under static/vendor/uplot/ with its licence;
- GET /dashboard/static/...: the page's script, style and library;
- GET /dashboard/events: Server-Sent Events, one frame (core/dashboard_frames.py) per `data:` line.

The server (`serve --dashboard`, api_server.py) and the simulator's replay (`simulate --dashboard`,
serving_lab/dashboard_replay.py) install the same routes with their own source of frames, so there is one
page. Server-Sent Events rather than a WebSocket: the stream goes one way, and a browser's `EventSource`
reconnects by itself.

Lesson: lessons/06-architecture-map.md (what an operator sees of the loop).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, StreamingResponse
from fastapi.staticfiles import StaticFiles

STATIC = Path(__file__).parent / "static"
RETRY_MS = 2000  # how long a browser waits before reconnecting a dropped stream

Frames = AsyncIterator[dict[str, Any]]


def install_dashboard(app: FastAPI, open_frames: Callable[[Request], Frames]) -> None:
    """Add the routes to `app`; `open_frames(request)` starts one page's frames, or raises to refuse it
    (an `HTTPException`, or an error the app's handlers answer)."""
    app.mount("/dashboard/static", StaticFiles(directory=STATIC), name="dashboard-static")

    @app.get("/dashboard", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})

    @app.get("/dashboard/events", include_in_schema=False)
    async def events(request: Request) -> StreamingResponse:
        return StreamingResponse(_server_sent_events(open_frames(request)), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def _server_sent_events(frames: Frames) -> AsyncIterator[str]:
    yield f"retry: {RETRY_MS}\n\n"
    async for frame in frames:  # allow_nan=False: a NaN would be valid Python but break the page's JSON.parse
        yield f"data: {json.dumps(frame, separators=(',', ':'), allow_nan=False)}\n\n"
