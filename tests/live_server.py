"""What the tests that start a real server share: a free port to bind, and waiting until it is healthy."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

import httpx


def free_port() -> int:
    """A port nobody listens on now (the OS picks it; another process could still take it first)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, timeout_s: float = 120.0, alive: Callable[[], bool] = lambda: True,
                 ) -> list[httpx.Response]:
    """Poll `url`/health until it answers 200, and return every answer it gave (a loading server answers 503
    first). AssertionError after `timeout_s`, or as soon as `alive()` says the server is gone."""
    answers: list[httpx.Response] = []
    deadline = time.monotonic() + timeout_s
    while alive():
        assert time.monotonic() < deadline, f"{url} did not become healthy in {timeout_s:g} s"
        try:
            answers.append(httpx.get(f"{url}/health"))
        except httpx.ConnectError:
            pass
        else:
            if answers[-1].status_code == 200:
                return answers
        time.sleep(0.1)
    raise AssertionError(f"the server at {url} exited before it became healthy")
