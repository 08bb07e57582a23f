"""`serving-lab serve` as a process, as a new user meets it: what it prints while the model loads and once
it can answer, and that it exits non-zero with the reason on one line when it cannot serve: the engine
fails to start, or the engine core dies later (`kill -9`), after the open streams got an error; never a
server answering 503 forever. It also starts with `--api-key-file` under the default fcfs policy, which
used to stop its engine (tenant weights are a "fair"-only knob).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from live_server import free_port, wait_healthy

STARTUP_S = 120


def serve(*argv: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "serving_lab.cli", "serve", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def engine_core_pid(pid: int) -> int:
    """The server's spawned engine-core process (not multiprocessing's resource tracker)."""
    (core,) = [int(c) for task in Path(f"/proc/{pid}/task").iterdir() for c in (task / "children").read_text().split()
               if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]
    return core


@pytest.fixture(scope="module")
def tiny(make_tiny_hf_model):
    return make_tiny_hf_model("llama", name="lifecycle-llama")


def test_an_engine_that_cannot_start_exits_1_with_one_line(tiny):
    process = serve(str(tiny), "--max-model-len", "100000", "--port", str(free_port()))
    try:
        out, err = process.communicate(timeout=STARTUP_S)
    finally:
        process.kill()
    assert process.returncode == 1, (out, err)
    assert "loading the model ..." in out and "ready" not in out
    last = err.strip().splitlines()[-1]
    assert last.startswith("serving-lab serve: error: the engine failed to start") and "max_model_len" in last, err


def test_keys_under_fcfs_start_say_ready_and_a_dead_core_ends_streams_then_the_server(tiny, tmp_path):
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"key-a": {"tenant": "acme", "weight": 2}, "key-b": {"tenant": "beta"}}))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = serve(str(tiny), "--api-key-file", str(keys), "--port", str(port))
    try:
        wait_healthy(url, STARTUP_S, alive=lambda: process.poll() is None)
        headers = {"Authorization": "Bearer key-a"}
        body = {"prompt": "long", "max_tokens": 240, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{url}/v1/completions", json=body, headers=headers, timeout=60) as stream:
            lines = stream.iter_lines()
            assert next(line for line in lines if line.startswith("data:"))
            os.kill(engine_core_pid(process.pid), signal.SIGKILL)
            rest = [line for line in lines if line.startswith("data:")]
        assert rest and '"error"' in rest[-2] and rest[-1] == "data: [DONE]", rest[-3:]
        out, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert out.index("loading the model ...") < out.index("ready: ") < out.index(f"at {url}"), out
    assert process.returncode == 1
    assert err.strip().splitlines()[-1].startswith("serving-lab serve: error: the engine core exited"), err[-500:]
