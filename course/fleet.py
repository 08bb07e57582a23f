"""Lesson 7, from one replica to a fleet: routers compared on shared prefixes, and an autoscaler under a spike.

- `router_comparison`: one workload on four replicas behind each router: prefix-cache hit rate, TTFT,
  throughput and how evenly the replicas were loaded; on `shared_prefix_tenants` (documents asked by two
  tenants) and on `chat_sessions` (multi-turn conversations behind one system prompt);
- `spike_workload` and `autoscaling`: a quiet stream with a one-minute spike and a late request after a long
  lull, served by fixed fleets and by autoscaled ones (with and without scale to zero): TTFT tail, the late
  requests' wait, cold starts, GPU-hours and cost per million output tokens;
- `COLD_START`: the cold start the lesson assumes for a GPU replica (its parts are stated, not measured).

Simulated only: one CPU cannot run a fleet, and the simulator prices what it cannot run. Every replica is
the shared core's scheduler and KV manager, so counts (hits, cold starts) are exact and seeded.

Lesson: lessons/07-tuning-knobs.md#from-one-replica-to-a-fleet
"""

from __future__ import annotations

from typing import Any

from core.config import EngineConfig
from core.workload import Exponential, Workload
from sim.autoscaler import Autoscaler, ColdStart
from sim.cluster import Cluster, ClusterRun

MODEL = "llama-3.1-8b"
ROUTERS = ("round_robin", "least_loaded", "least_kv", "prefix_aware", "tenant_aware")
CHAT_ROUTERS = ("round_robin", "least_loaded", "prefix_aware", "session_affinity")
# Assumed, and stated in the lesson: a process that starts and imports its framework in 15 s, weights read
# from a local NVMe disk at 2 GB/s, an eager engine (nothing to compile).
COLD_START = ColdStart(process_start_s=15.0, load_bandwidth=2.0e9, compile_s=0.0)


def shared_prefix_tenants(rate: float = 60.0, seed: int = 0) -> Workload:
    """13 documents of 2,048 tokens, each the start of 12 questions (32-256 tokens, 128-token answers),
    interleaved at `rate` requests/s and sent by two tenants in turn, so each document is asked by both."""
    return Workload.shared_prefix(13, 12, prefix_len=2048, suffix_len=(32, 256), output_len=128, arrival=rate,
                                  seed=seed).with_tenant_mix({"a": 1, "b": 1})


def chat_sessions(rate: float = 20.0, seed: int = 0) -> Workload:
    """50 conversations of 4 turns behind one 256-token system prompt (256-token messages, 128-token replies),
    turn by turn at `rate` requests/s, each request labelled with its conversation (`with_sessions`)."""
    return Workload.chat(50, 4, system_len=256, user_len=256, output_len=128, arrival=rate, seed=seed).with_sessions()


def router_comparison(workload: Workload, hardware: str = "h100-sxm", num_replicas: int = 4,
                      routers: tuple[str, ...] = ROUTERS) -> list[dict[str, Any]]:
    """One row per router: hit rate, mean and p99 TTFT, output tokens/s, and the busiest and idlest replica's
    request counts."""
    config = EngineConfig(max_num_seqs=128, max_num_batched_tokens=2048)
    rows = []
    for router in routers:
        run = Cluster(MODEL, hardware, config, num_replicas=num_replicas, router=router).simulate(workload)
        served = [m.completed for m in run.replicas.values()]
        rows.append({"router": router, "hit_rate_%": round(100 * run.metrics.prefix_cache_hit_rate, 1),
                     "mean_ttft_ms": round(run.metrics.mean_ttft_ms, 1), "p99_ttft_ms": round(run.metrics.p99_ttft_ms, 1),
                     "output_tok_s": round(run.metrics.output_throughput), "requests_per_replica":
                     f"{min(served)}-{max(served)}"})
    return rows


def spike_workload(spike_rate: float = 15.0, seed: int = 1) -> Workload:
    """A quiet stream (0.5 requests/s for five minutes), a spike of `spike_rate` requests/s for a minute
    from t = 60 s, and five requests after a lull, from t = 900 s. Prompts 128-1,024 tokens, replies
    exponential with mean 128."""
    def stream(n: int, rate: float, part_seed: int, name: str) -> Workload:
        return Workload.synthetic(n, (128, 1024), Exponential(128, 512), arrival=rate, seed=part_seed, name=name)
    return (stream(150, 0.5, seed, "quiet") + stream(round(60 * spike_rate), spike_rate, seed + 1, "spike").delayed(60.0)
            + stream(5, 1.0, seed + 2, "late").delayed(900.0))


FLEETS: dict[str, dict[str, Any]] = {
    "fixed, 4 replicas": {"num_replicas": 4},
    "fixed, 1 replica": {"num_replicas": 1},
    "autoscaled, 1-6": {"autoscaler": Autoscaler(target_concurrency=16, min_replicas=1, max_replicas=6,
                                                 scale_down_delay_s=60.0, cold_start=COLD_START)},
    "autoscaled, 0-6": {"autoscaler": Autoscaler(target_concurrency=16, min_replicas=0, max_replicas=6,
                                                 scale_down_delay_s=60.0, cold_start=COLD_START)},
    # Knative's own defaults: a 60 s stable window, a 6 s panic window, panic at 200%, no scale-down delay
    "0-6, Knative windows": {"autoscaler": Autoscaler(target_concurrency=16, min_replicas=0, max_replicas=6,
                                                      scale_down_delay_s=0.0, stable_window_s=60.0,
                                                      cold_start=COLD_START)},
}


def autoscaling(workload: Workload, hardware: str = "l40s", dollars_per_gpu_hour: float = 1.0,
                late_after_s: float = 900.0) -> tuple[list[dict[str, Any]], dict[str, ClusterRun]]:
    """Each fleet of `FLEETS` on `workload` (32 sequences per replica, least-loaded routing): a row of numbers
    each, and the runs themselves (their timelines draw the replicas over time)."""
    config = EngineConfig(max_num_seqs=32, max_num_batched_tokens=2048)
    rows, runs = [], {}
    for label, fleet in FLEETS.items():
        run = runs[label] = Cluster(MODEL, hardware, config, router="least_loaded", **fleet).simulate(workload)
        late = [r.ttft for r in run.metrics.requests if r.arrival_time >= late_after_s]
        timeline = run.timeline
        rows.append({"fleet": label, "p99_ttft_s": round(run.metrics.p99_ttft_ms / 1000, 2),
                     "late_ttft_s": round(max(late), 2),
                     "cold_starts": timeline.num_cold_starts if timeline else 0,
                     "max_replicas": timeline.max_serving if timeline else fleet["num_replicas"],
                     "gpu_hours": round(run.gpu_seconds / 3600, 3),
                     "usd_per_M_tokens": round(run.cost_per_million_tokens(dollars_per_gpu_hour), 2)})
    return rows, runs
