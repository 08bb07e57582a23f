"""The dashboard's frames: the JSON the page reads, one per Server-Sent Event, whichever side feeds it.

A served run (ref_engine/entrypoints/dashboard/live.py) and a replayed simulation (sim/dashboard_replay.py,
served by `simulate --dashboard` or played in the course site's browser) both make frames of this shape, so
the page draws either one the same way; hence here, in the core both sides share (and torch-free, so that the
browser's Python can run it):

    {"source": "server" | "simulator", "title": str, "time": the run's clock (s), "done": bool,
     "num_steps": steps so far, "step_fields": STEP_FIELDS,
     "steps": [[value per STEP_FIELDS], ...],        # the steps since the last frame (the newest few)
     "kv_pool": {...} | null,                         # the newest pool snapshot, when new
     "tenants": [{"tenant", "tokens", "weight"}],     # service so far
     "metrics": {the six manifest metrics},
     "histograms": {"ttft": {"le": [...], "counts": [...]}, "itl": {...}}}

A step is a list rather than an object (the field names once per frame), and the pool's block states
are base64 bytes: at ten frames a second the stream stays small. The six metrics are the manifest's
(serving_lab/manifest.py, `MANIFEST_METRICS`), under the Prometheus series a vLLM server exports them as.

Lesson: lessons/06-architecture-map.md (what an operator sees of the loop).
"""

from __future__ import annotations

import base64
import bisect
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from core.kv_pool_snapshot import KVPoolSnapshot
from core.step_summary import StepSummary

FRAME_INTERVAL_S = 0.1  # at most ten frames a second per page
KEEPALIVE_S = 1.0  # a frame at least this often, new steps or not: the numbers stay current when idle
MAX_STEPS_PER_FRAME = 256  # a page's timeline draws fewer; a frame after a burst sends the newest ones

STEP_FIELDS = ("step_id", "start", "duration", "token_budget", "max_num_seqs", "num_decode_rows",
               "num_decode_tokens", "num_prefill_rows", "num_prefill_tokens", "num_running", "num_waiting",
               "num_swapped", "num_preempted", "kv_usage")

# the manifest's six metrics -> the series a vLLM server exports each as (serving_lab/manifest.py)
METRIC_SERIES = {
    "time_to_first_token": "vllm:time_to_first_token_seconds",
    "inter_token_latency": "vllm:inter_token_latency_seconds",
    "output_tokens_per_second": "rate(vllm:generation_tokens_total)",
    "time_to_decode_per_output_token": "vllm:request_time_per_output_token_seconds",
    "preempted_sequences": "vllm:num_preemptions_total",
    "kv_cache_utilization": "vllm:kv_cache_usage_perc",
}
RATE_WINDOW_S = 5.0  # output tokens per second: over the last this many seconds of the run's clock


def steps_json(summaries: Sequence[StepSummary]) -> list[list[Any]]:
    """The newest `MAX_STEPS_PER_FRAME` summaries, each as its values in `STEP_FIELDS` order."""
    return [[getattr(s, name) for name in STEP_FIELDS] for s in summaries[-MAX_STEPS_PER_FRAME:]]


def pool_json(pool: KVPoolSnapshot) -> dict[str, Any]:
    states = pool.block_states
    return {"num_blocks": pool.num_blocks, "block_size": pool.block_size, "num_free": pool.num_free,
            "num_cached_free": pool.num_cached_free, "num_used": pool.num_used, "num_shared": pool.num_shared,
            "num_evictions": pool.num_evictions, "tenants": list(pool.tenants),
            "block_states": None if states is None else base64.b64encode(states).decode("ascii")}


def tenants_json(service: Mapping[str, int], weights: Mapping[str, float] | None) -> list[dict[str, Any]]:
    """Each tenant's service; `weights` (the fair policy's, missing tenants weigh 1) None when the
    scheduling policy weighs no one."""
    return [{"tenant": tenant, "tokens": tokens, "weight": None if weights is None else weights.get(tenant, 1.0)}
            for tenant, tokens in sorted(service.items())]


def histogram_json(bounds: Sequence[float], counts: Sequence[int]) -> dict[str, Any]:
    """A histogram as the page draws it: `counts[i]` observations in (bounds[i-1], bounds[i]] seconds, the
    last count above every bound."""
    if len(counts) != len(bounds) + 1:
        raise ValueError(f"{len(bounds)} bounds need {len(bounds) + 1} counts, got {len(counts)}")
    return {"le": list(bounds), "counts": list(counts)}


def bucket_counts(bounds: Sequence[float], values: Iterable[float]) -> list[int]:
    """`histogram_json`'s counts of `values`, as Prometheus buckets them (a value on a bound is in its bucket)."""
    counts = [0] * (len(bounds) + 1)
    for value in values:
        counts[bisect.bisect_left(bounds, value)] += 1
    return counts


def metrics_json(*, ttft: tuple[float, int], itl: tuple[float, int], tpot: tuple[float, int],
                 generation_tokens: float, output_rate: float | None, num_preemptions: float,
                 num_preempted_requests: float, kv_usage: float) -> dict[str, dict[str, Any]]:
    """The six metrics; a latency is (sum in seconds, count) as a Prometheus histogram has them."""
    def latency(name: str, total_and_count: tuple[float, int]) -> dict[str, Any]:
        total, count = total_and_count
        return {"series": METRIC_SERIES[name], "mean_ms": 1000 * total / count if count else None, "count": count}

    return {
        "time_to_first_token": latency("time_to_first_token", ttft),
        "inter_token_latency": latency("inter_token_latency", itl),
        "output_tokens_per_second": {"series": METRIC_SERIES["output_tokens_per_second"], "value": output_rate,
                                     "total": generation_tokens},
        "time_to_decode_per_output_token": latency("time_to_decode_per_output_token", tpot),
        "preempted_sequences": {"series": METRIC_SERIES["preempted_sequences"], "value": num_preemptions,
                                "sequences": num_preempted_requests},
        "kv_cache_utilization": {"series": METRIC_SERIES["kv_cache_utilization"], "value": kv_usage},
    }
