"""A worker process that dies under a live server (issue 27): the engine core's executor raises
`ExecutorDeadError`, the core says why (`EngineCoreDead`) and exits with code 1, the open stream ends with a
503 naming the dead worker, a new request gets a 503 at once (no hang), and no process is left behind.

The engine runs its model in one worker process (`distributed_executor_backend="mp"` at TP 1: the cheapest
engine with a worker tier; tests/engine/test_tensor_parallel.py kills a rank of TP 2).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest
import uvicorn
from live_server import free_port, wait_healthy

from ref_engine.async_engine.async_llm import AsyncLLM
from ref_engine.engine_core.core import EngineCoreArgs
from ref_engine.entrypoints.openai.api_server import build_app


def children(pid: int) -> list[int]:
    return [int(c) for task in Path(f"/proc/{pid}/task").iterdir() for c in (task / "children").read_text().split()]


def worker_pids(core_pid: int) -> list[int]:
    """The engine core's worker processes (spawned ones; not multiprocessing's resource tracker)."""
    return [c for c in children(core_pid)
            if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]


def descendants(pid: int) -> list[int]:
    return [d for c in children(pid) for d in (c, *descendants(c))]


def running(pid: int) -> bool:
    """Whether `pid` still runs (an exited process its new parent has not reaped yet runs no more)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture()
def server(make_tiny_hf_model, device):
    """(base URL, the AsyncLLM) of a server whose engine runs its model in one worker process."""
    tiny = make_tiny_hf_model("llama", name="worker-death-llama")
    engine = AsyncLLM(EngineCoreArgs(str(tiny), device=device, num_threads=1,
                                     engine_kwargs={"num_kv_blocks": 64, "distributed_executor_backend": "mp"}))
    app = build_app(engine)
    port = free_port()
    uv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url)
        yield url, engine
    finally:
        uv.should_exit = True
        thread.join(30)


def test_a_killed_worker_gives_503s_and_the_engine_core_exits_leaving_no_process(server):
    url, engine = server
    core = engine.client.process
    (worker,) = worker_pids(core.pid)
    processes = descendants(core.pid)  # the worker, and whatever helper the core started
    body = {"prompt": "a long one", "max_tokens": 200, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=30) as stream:
        lines = stream.iter_lines()
        assert next(line for line in lines if line.startswith("data:"))
        os.kill(worker, signal.SIGKILL)
        rest = [line for line in lines if line.startswith("data:")]
    assert rest[-1] == "data: [DONE]"
    error = json.loads(rest[-2].removeprefix("data: "))["error"]
    assert error["code"] == 503 and "worker 0" in error["message"] and "signal 9" in error["message"], error

    start = time.monotonic()
    late = httpx.post(f"{url}/v1/completions", json={"prompt": "after", "max_tokens": 4}, timeout=30)
    assert late.status_code == 503 and "worker 0" in late.json()["error"]["message"], late.text
    assert time.monotonic() - start < 5  # refused, not queued behind a dead engine
    core.join(10)
    assert core.exitcode == 1  # the core reported the death and exited
    deadline = time.monotonic() + 5
    while any(map(running, processes)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in processes if running(pid)]  # no orphan
