"""`serving-lab simulate ... --dashboard`: a simulated run (sim/dashboard_replay.py) replayed on the dashboard's
page, served by a small local server of its own, at the wall clock's pace.

Each page that connects gets its own replay from the start, a frame every `FRAME_INTERVAL_S` of wall time.

Lesson: lessons/06-architecture-map.md (the same loop, simulated).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

from core.dashboard_frames import FRAME_INTERVAL_S
from sim.dashboard_replay import Replay


def wall_clock(speed: float) -> Iterator[float]:
    """Simulated seconds since the first read, at `speed` simulated seconds per wall-clock second."""
    started = time.monotonic()
    while True:
        yield (time.monotonic() - started) * speed


async def paced_frames(replay: Replay) -> AsyncIterator[dict[str, Any]]:
    """One page's replay on the wall clock: a frame every `FRAME_INTERVAL_S`, the last one `done`."""
    for frame in replay.frames(wall_clock(replay.speed)):
        yield frame
        if not frame["done"]:
            await asyncio.sleep(FRAME_INTERVAL_S)


def replay_app(replay: Replay) -> Any:
    """A FastAPI app with the dashboard's routes, fed by `replay` (and / redirecting to /dashboard)."""
    from fastapi import FastAPI
    from fastapi.responses import RedirectResponse

    from ref_engine.entrypoints.dashboard.routes import install_dashboard

    app = FastAPI(title="serving-lab simulate --dashboard")
    install_dashboard(app, lambda request: paced_frames(replay))

    @app.get("/", include_in_schema=False)
    async def root() -> RedirectResponse:
        return RedirectResponse("/dashboard")

    return app


def serve_replay(replay: Replay, host: str, port: int) -> None:
    """Serve the replay's page until Ctrl-C."""
    import uvicorn

    print(f"dashboard: http://{host}:{port}/dashboard (each page load replays the run at {replay.speed:g}x; "
          "Ctrl-C stops)", flush=True)
    uvicorn.run(replay_app(replay), host=host, port=port, log_level="warning")
