"""Reference solutions of lesson 7's exercises (E07.1, E07.2, E07.3). Try them yourself first.

E07.1 is the sweep's own `pareto_front` (serving_lab/sweep.py). It turns every axis into "larger is better"
by negating the columns to minimize, and it keeps a row unless some *different* key is >= on every axis.
E07.2 is arithmetic on top of a sweep. The hard part is the inputs, and the rubric below grades them.
E07.3 reads each replica's queue as a real router reads its replicas' metrics, and `min` breaks the ties.

Rubric for E07.2 (design; 10 points). A written capacity plan for "serve Q requests/s of this workload at
this SLO" gets:
- 2: capacity per replica is goodput at the SLO on the target workload, meaning the highest arrival rate with
  at least 90% of requests within both TTFT and TPOT (a rate ladder or binary search). It is not peak
  throughput, and not a rate measured past the knee;
- 2: replicas = ceil(Q / (goodput × utilisation)), with the headroom justified (bursts, a replica lost or
  being redeployed: N + 1), and the rounding done up, not to the nearest integer;
- 1: cost per million output tokens from the GPUs paid for over the tokens served, with the price stated as
  an assumption; noting that the prompt tokens are in the same dollars;
- 2: configurations compared at the same SLO (dtype, `max_num_seqs`, token budget, tensor parallelism against
  replicas), with tensor parallelism chosen only when the model does not fit one GPU, the KV room is
  needed, or a per-token latency target demands it;
- 1: a quality gate before counting a saving from numerics (FP8 or INT4): the eval set's greedy agreement and
  KL against the reference, then task accuracy;
- 1: validation: the chosen configuration measured on real hardware at the planned per-replica rate, and the
  simulator's rank agreement and absolute error on a few points;
- 1: sensitivity: what the plan becomes if prompts double, the SLO tightens or the traffic becomes burstier.

Lesson: lessons/07-tuning-knobs.md#exercises
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from core.request import Request
from serving_lab import sweep
from sim.executor import SimulatedExecutor
from sim.router import Fleet

__all__ = ["LeastPendingPrefillRouter", "cheapest_deployment", "cost_per_million_tokens", "pareto_front",
           "replicas_needed"]

# a ratio within this of an integer is that integer (0.3 / 0.1 = 2.9999999999999996 must not need 3 replicas
# one day and 4 replicas the next)
_ROUNDING = 1e-9


def pareto_front(rows: Sequence[Mapping[str, Any]], maximize: Sequence[str] = ("output_throughput",),
                 minimize: Sequence[str] = ("p99_itl_ms", "p99_ttft_ms")) -> list[int]:
    """E07.1: the sweep's own front."""
    return sweep.pareto_front(rows, maximize, minimize)


def replicas_needed(qps: float, goodput_per_replica: float, max_utilization: float = 1.0) -> int:
    """E07.2a: ceil(qps / (goodput × utilisation)), with a little slack for floating-point ratios."""
    if not goodput_per_replica > 0:
        raise ValueError(f"a replica with goodput {goodput_per_replica} req/s serves nothing")
    if not 0 < max_utilization <= 1:
        raise ValueError(f"max_utilization must be in (0, 1], got {max_utilization}")
    if qps <= 0:
        return 0
    return math.ceil(qps / (goodput_per_replica * max_utilization) - _ROUNDING)


def cost_per_million_tokens(gpu_hour_usd: float, gpus: int, output_tokens_per_s: float) -> float:
    """E07.2b: dollars per hour over millions of tokens per hour."""
    if not output_tokens_per_s > 0:
        raise ValueError(f"no tokens are produced ({output_tokens_per_s} tokens/s): the cost per token is unbounded")
    return gpu_hour_usd * gpus / (output_tokens_per_s * 3600) * 1e6


def cheapest_deployment(configs: Sequence[Mapping[str, Any]], qps: float, gpu_hour_usd: float,
                        max_utilization: float = 1.0) -> dict[str, Any]:
    """E07.2c: each config priced as replicas × GPUs × price; the lowest price wins, then the most spare
    capacity, then the first listed (`min` keeps the first of equal keys)."""
    plans = []
    for config in configs:
        goodput = config["goodput"]
        if not goodput > 0:  # also NaN: a config that never met the SLO
            continue
        replicas = replicas_needed(qps, goodput, max_utilization)
        gpus = replicas * config["gpus"]
        usd_per_hour = gpus * config.get("gpu_hour_usd", gpu_hour_usd)
        plans.append(({"name": config["name"], "replicas": replicas, "gpus": gpus, "usd_per_hour": usd_per_hour},
                      replicas * goodput))
    if not plans:
        raise ValueError("no configuration meets the SLO at any rate (every goodput is 0 or NaN)")
    plan, _ = min(plans, key=lambda p: (p[0]["usd_per_hour"], -p[1]))
    return plan


class LeastPendingPrefillRouter:
    """E07.3: the fewest prompt tokens left to prefill, then the fewest outstanding requests, then the first."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet

    def route(self, request: Request, replicas: Sequence[SimulatedExecutor]) -> SimulatedExecutor:
        return min(replicas, key=lambda replica: (_pending_prefill(replica), replica.num_unfinished))


def _pending_prefill(replica: SimulatedExecutor) -> int:
    """Prompt tokens not yet computed over the replica's waiting and running requests."""
    scheduler = replica.scheduler
    requests = (scheduler.get_request(request_id) for request_id in scheduler.unfinished_request_ids())
    return sum(max(0, r.num_prompt_tokens - r.num_computed_tokens) for r in requests)
