"""The live dashboard on a running server (`serve --dashboard`), and the Grafana dashboard against its /metrics.

One server (tiny model, two keyed tenants, a KV pool small enough that the load below preempts) serves the
module. In headless Chromium the page follows it under a short load: its batch and KV panels fill within
seconds, it logs no error, and once the load is over its numbers are /metrics' numbers.
"""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import httpx
import pytest
import uvicorn
from browser import launch, require_browser
from live_server import free_port, wait_healthy
from prometheus_client.parser import text_string_to_metric_families

from core.dashboard_frames import METRIC_SERIES
from ref_engine.async_engine.async_llm import AsyncLLM
from ref_engine.engine_core.core import EngineCoreArgs
from ref_engine.entrypoints.openai.api_server import build_app
from ref_engine.entrypoints.openai.tenants import ApiKey
from serving_lab.manifest import MANIFEST_METRICS

KEYS = {"key-acme": ApiKey("acme"), "key-globex": ApiKey("globex")}
GRAFANA = Path(__file__).resolve().parents[2] / "serving_lab" / "grafana" / "serving-lab.json"


@pytest.fixture(scope="module")
def url(make_tiny_hf_model, device):
    tiny = make_tiny_hf_model("llama", name="dashboard-llama")
    port = free_port()
    engine = AsyncLLM(EngineCoreArgs(str(tiny), device=device, num_threads=1, engine_kwargs={"num_kv_blocks": 64},
                                     dashboard=True),
                      "tiny")
    uv = uvicorn.Server(uvicorn.Config(build_app(engine, api_keys=KEYS), host="127.0.0.1", port=port,
                                       log_level="warning"))
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url)
    yield url
    uv.should_exit = True
    thread.join(30)


def metrics(url: str) -> dict[str, float]:
    """/metrics' samples without labels but the model's, and request_success_total summed over reasons."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text):
        for s in family.samples:
            if set(s.labels) == {"model_name"} or s.name == "vllm:request_success_total":
                values[s.name] = values.get(s.name, 0.0) + s.value
    return values


def load(url: str, key: str, prefix: str) -> None:
    """8 requests of one tenant at once, sharing a 3-block prefix: with another tenant's 8, more than the
    64-block pool holds once they decode, so the scheduler preempts."""
    prompts = [prefix * 48 + f" request {i}" for i in range(8)]
    response = httpx.post(f"{url}/v1/completions", timeout=60, headers={"Authorization": f"Bearer {key}"},
                          json={"model": "tiny", "prompt": prompts, "max_tokens": 100, "ignore_eos": True})
    assert response.status_code == 200, response.text


def test_the_page_follows_the_server_and_ends_on_its_metrics(url):
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright

    chromium = require_browser()
    errors: list[str] = []
    with sync_playwright() as pw:
        browser = launch(pw, chromium)
        try:
            page = browser.new_page()
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(f"uncaught {e}"))
            page.on("requestfailed", lambda r: errors.append(f"failed {r.url}"))
            page.goto(f"{url}/dashboard")
            page.wait_for_function("window.dashboard.frames > 0", timeout=10_000)
            senders = [threading.Thread(target=load, args=(url, key, prefix))
                       for key, prefix in (("key-acme", "a"), ("key-globex", "g"))]
            for sender in senders:
                sender.start()
            # within a few seconds of the load: steps on the timeline, blocks in use in the pool
            page.wait_for_function("window.dashboard.maxBatchTokens > 0 && window.dashboard.maxInUseBlocks > 0",
                                   timeout=5_000)
            for sender in senders:
                sender.join()
            # the page draws the pool from the frames it has been sent: wait (a busy machine delays them) for
            # the load's preemptions and its prefix blocks, cached or shared, to reach it
            try:
                page.wait_for_function("window.dashboard.preemptionsSeen > 0 && window.dashboard.pool !== null"
                                       " && window.dashboard.pool.cached + window.dashboard.pool.shared > 0",
                                       timeout=10_000)
            except PlaywrightTimeout:
                pass  # the assertion below shows what the page holds
            seen = page.evaluate("window.dashboard")
            assert seen["preemptionsSeen"] > 0 and seen["pool"]["cached"] + seen["pool"]["shared"] > 0, seen
            # the numbers the page ends on are /metrics' (it refreshes them at least once a second)
            deadline = time.monotonic() + 10
            while True:
                expected, shown = metrics(url), _shown(page)
                wanted = _expected(expected)
                if shown == wanted or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert shown == wanted
            assert wanted["preemptions"] > 0 and wanted["ttft_count"] == 16 and wanted["generation_tokens"] == 1600
        finally:
            browser.close()
    assert not errors, errors


def _expected(m: dict[str, float]) -> dict[str, float]:
    return {"generation_tokens": m["vllm:generation_tokens_total"],
            "ttft_count": m["vllm:time_to_first_token_seconds_count"],
            "itl_count": m["vllm:inter_token_latency_seconds_count"],
            "preemptions": m["vllm:num_preemptions_total"],
            "kv_usage": m["vllm:kv_cache_usage_perc"],
            "running": m["vllm:num_requests_running"], "waiting": m["vllm:num_requests_waiting"],
            # each tenant's service is its prompts (once prefilled) and its outputs
            "service": m["vllm:prompt_tokens_total"] + m["vllm:generation_tokens_total"]}


def _shown(page) -> dict[str, float]:
    shown = page.evaluate("""() => {
      const m = name => document.querySelector(`[data-metric="${name}"]`).dataset;
      const rows = Array.from(document.querySelectorAll("#tenants tbody tr"), tr => +tr.lastChild.textContent);
      return {generation_tokens: +m("output_tokens_per_second").total, ttft_count: +m("time_to_first_token").count,
              itl_count: +m("inter_token_latency").count, preemptions: +m("preempted_sequences").value,
              kv_usage: +m("kv_cache_utilization").value, running: window.dashboard.queue.running,
              waiting: window.dashboard.queue.waiting, service: rows.reduce((a, b) => a + b, 0),
              tenants: rows.length};
    }""")
    assert shown.pop("tenants") == 2
    return shown


def test_the_page_shows_the_manifests_six_metrics_under_their_vllm_series():
    assert {name: metric.vllm_series for name, metric in MANIFEST_METRICS.items()} == METRIC_SERIES


def test_every_series_the_grafana_dashboard_queries_is_exported(url):
    dashboard = json.loads(GRAFANA.read_text(encoding="utf-8"))
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    exprs += [var["definition"] for var in dashboard["templating"]["list"] if "definition" in var]
    queried = {name for expr in exprs for name in re.findall(r"[a-z_]+:[a-z0-9_:]+", expr)}
    assert queried and all(name.startswith("vllm:") for name in queried), queried  # so a vLLM server has them
    # the server's request or two, so every histogram and counter has a sample
    load(url, "key-acme", "z")
    exported = {s.name for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text)
                for s in family.samples}
    assert sorted(queried - exported) == []
    six = {series.removeprefix("rate(").removesuffix(")") for series in METRIC_SERIES.values()}
    assert all(any(series in expr for expr in exprs) for series in six)
