"""`serving-lab simulate ... --dashboard`: a simulated run replayed on the dashboard's page
(serving_lab/dashboard_replay.py), played to the end in headless Chromium, ending on the run's own numbers."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
import uvicorn
from browser import launch, require_browser
from live_server import free_port

from serving_lab import cli
from serving_lab.dashboard_replay import replay_app
from serving_lab.manifest import EXAMPLE_MANIFEST, load_manifest, naming_keys
from serving_lab.workload_spec import parse_workload
from sim.dashboard_replay import Replay, record_simulation
from sim.simulator import Simulator

SPEED = 3.0  # the run below lasts about 3.6 simulated seconds: a replay of about 1.2 s


@pytest.fixture(scope="module")
def recording():
    manifest = load_manifest(EXAMPLE_MANIFEST, {})
    with naming_keys():
        deployment = manifest.simulator_kwargs(False)
    simulator = Simulator(hardware="local-cpu", **{**deployment, "num_kv_blocks": 200})  # small: it preempts
    workload = parse_workload("synthetic:48:128:64:40,tenants=a:3,b:1")
    return record_simulation(simulator, workload, SPEED, "a test run")


def test_the_replay_plays_to_the_end_on_the_runs_numbers(recording):
    from playwright.sync_api import sync_playwright

    chromium = require_browser()
    run = recording.run
    assert run.num_preemptions > 0 and len(recording.summaries) > 100
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(replay_app(Replay(recording, SPEED)), host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    errors: list[str] = []
    try:
        wait_for_page(f"http://127.0.0.1:{port}")
        with sync_playwright() as pw:
            browser = launch(pw, chromium)
            try:
                page = browser.new_page()
                page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
                page.on("pageerror", lambda e: errors.append(f"uncaught {e}"))
                page.goto(f"http://127.0.0.1:{port}/")  # redirected to /dashboard
                page.wait_for_function("window.dashboard.done", timeout=20_000)
                seen = page.evaluate("""() => {
                  const m = name => document.querySelector(`[data-metric="${name}"]`).dataset;
                  return {state: window.dashboard, status: document.getElementById("status").textContent,
                          tokens: +m("output_tokens_per_second").total, ttft: +m("time_to_first_token").count,
                          preemptions: +m("preempted_sequences").value,
                          service: Array.from(document.querySelectorAll("#tenants tbody tr"),
                                              tr => +tr.lastChild.textContent)};
                }""")
            finally:
                browser.close()
    finally:
        server.should_exit = True
        thread.join(10)
    state = seen["state"]
    assert seen["status"] == "replay finished" and state["numSteps"] == len(recording.summaries)
    assert state["maxBatchTokens"] > 0 and state["maxInUseBlocks"] > 0 and state["preemptionsSeen"] > 0
    assert (seen["tokens"], seen["ttft"], seen["preemptions"]) == (run.total_output_tokens, run.completed,
                                                                   run.num_preemptions)
    assert len(seen["service"]) == 2 and sum(seen["service"]) == run.total_input_tokens + run.total_output_tokens
    assert not errors, errors


def wait_for_page(url: str, timeout_s: float = 10.0) -> None:
    """The replay's server has no /health: wait until its page answers."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(f"{url}/dashboard").status_code == 200:
                return
        except httpx.ConnectError:
            pass
        assert time.monotonic() < deadline, f"{url}/dashboard did not answer in {timeout_s:g} s"
        time.sleep(0.05)


def test_speed_goes_with_the_dashboard_and_must_be_positive(recording, capsys):
    with pytest.raises(SystemExit):
        cli.main(["simulate", "--config", str(EXAMPLE_MANIFEST), "--workload", "synthetic:4:16:4", "--speed", "2"])
    assert "--speed sets the pace of the dashboard's replay: give --dashboard too" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--speed must be > 0"):
        Replay(recording, 0.0)
