"""A running server's dashboard frames (core/dashboard_frames.py): the steps from its `StepFeed`, the numbers from /metrics'.

Each connected page gets its own loop: every `FRAME_INTERVAL_S` it looks whether the feed has new steps
and sends them (the newest few after a burst), at least every `KEEPALIVE_S` in any case. The six metrics
and the TTFT and ITL histograms are read from the same Prometheus registry GET /metrics serves, so the page
and a scraper agree. All of it runs in the API server's process, on what the engine core already sent:
a page connected or not, the core does the same work.

Lesson: lessons/06-architecture-map.md (what an operator sees of the loop).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry

from core.dashboard_frames import (
    FRAME_INTERVAL_S,
    KEEPALIVE_S,
    RATE_WINDOW_S,
    STEP_FIELDS,
    histogram_json,
    metrics_json,
    pool_json,
    steps_json,
    tenants_json,
)
from ref_engine.async_engine.step_feed import StepFeed


async def live_frames(feed: StepFeed, registry: CollectorRegistry, title: str,
                      tenant_weights: Mapping[str, float] | None,
                      stopping: Callable[[], bool]) -> AsyncIterator[dict[str, Any]]:
    """Frames until `stopping()` (the server drains) or the page goes away (the caller stops iterating)."""
    sent_steps = sent_pools = 0
    last_sent = -KEEPALIVE_S
    generated: deque[tuple[float, float]] = deque()  # (time, vllm:generation_tokens_total), RATE_WINDOW_S of them
    while not stopping():
        now = time.monotonic()
        if feed.num_steps != sent_steps or now - last_sent >= KEEPALIVE_S:
            values, histograms = read_registry(registry)
            generated.append((now, values["vllm:generation_tokens_total"]))
            while now - generated[0][0] > RATE_WINDOW_S:
                generated.popleft()
            steps = feed.steps_after(sent_steps)
            newest = feed.steps[-1] if feed.steps else None
            yield {
                "source": "server", "title": title, "done": False,
                "time": newest.start + newest.duration if newest else 0.0,
                "num_steps": feed.num_steps, "step_fields": STEP_FIELDS, "steps": steps_json(steps),
                "kv_pool": pool_json(feed.kv_pool) if feed.num_kv_pools != sent_pools else None,
                "tenants": tenants_json(feed.tenant_service, tenant_weights),
                "metrics": _metrics(values, generated),
                "histograms": {"ttft": histograms["vllm:time_to_first_token_seconds"],
                               "itl": histograms["vllm:inter_token_latency_seconds"]},
            }
            sent_steps, sent_pools, last_sent = feed.num_steps, feed.num_kv_pools, now
        await asyncio.sleep(FRAME_INTERVAL_S)


def _metrics(values: dict[str, float], generated: deque[tuple[float, float]]) -> dict[str, Any]:
    (t0, first), (t1, last) = generated[0], generated[-1]
    return metrics_json(
        ttft=_sum_count(values, "vllm:time_to_first_token_seconds"),
        itl=_sum_count(values, "vllm:inter_token_latency_seconds"),
        tpot=_sum_count(values, "vllm:request_time_per_output_token_seconds"),
        generation_tokens=last, output_rate=(last - first) / (t1 - t0) if t1 > t0 else None,
        num_preemptions=values["vllm:num_preemptions_total"],
        num_preempted_requests=values["serving_lab:preempted_requests_total"],
        kv_usage=values["vllm:kv_cache_usage_perc"])


def _sum_count(values: dict[str, float], histogram: str) -> tuple[float, int]:
    return values[f"{histogram}_sum"], int(values[f"{histogram}_count"])


def read_registry(registry: CollectorRegistry) -> tuple[dict[str, float], dict[str, dict[str, Any]]]:
    """One pass over the registry: {sample name: value} for samples with no label but the model's, and
    {histogram name: `histogram_json`} for each histogram (its cumulative buckets taken apart)."""
    values: dict[str, float] = {}
    histograms: dict[str, dict[str, Any]] = {}
    for metric in registry.collect():
        bounds: list[float] = []
        cumulative: list[float] = []
        for sample in metric.samples:
            if sample.name.endswith("_bucket"):
                le = float(sample.labels["le"])
                if le != float("inf"):
                    bounds.append(le)
                cumulative.append(sample.value)
            elif set(sample.labels) == {"model_name"}:
                values[sample.name] = sample.value
        if metric.type == "histogram":
            counts = [int(b - a) for a, b in zip([0.0, *cumulative], cumulative)]
            histograms[metric.name] = histogram_json(bounds, counts)
    return values, histograms
