"""Exercises of lesson 7, "Tuning knobs": E07.1, E07.2 and E07.3.

Write the bodies below, then check them from the repository root:

    pytest tests/exercises/test_e07_tuning_knobs.py --impl=learner          # every exercise
    pytest tests/exercises/test_e07_tuning_knobs.py --impl=learner -k e07_1 # one

The tests check E07.1 on hand-built tables and against the sweep's own front (`pareto_front` in
serving_lab/sweep.py) on a simulated sweep, and E07.2 on hand-made numbers and on three configurations of
Llama-3.1-8B on an H100 whose goodput the simulator measures; E07.3 on replicas with hand-placed requests,
then as a plug-in of a simulated fleet against the least-loaded router. Reference solutions:
lessons/exercises/solutions/e07_tuning_knobs.py.

Lesson: lessons/07-tuning-knobs.md#exercises
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from core.request import Request
from sim.executor import SimulatedExecutor
from sim.router import Fleet


def pareto_front(rows: Sequence[Mapping[str, Any]], maximize: Sequence[str] = ("output_throughput",),
                 minimize: Sequence[str] = ("p99_itl_ms", "p99_ttft_ms")) -> list[int]:
    """E07.1 (implement): the indices, in increasing order, of the rows of a sweep table that no other row
    dominates.

    Each row is a mapping from column names to values (a sweep row also has columns that are not numbers, such
    as "point"; only the columns named in `maximize` and `minimize` count). Row a dominates row b when a is at
    least as good as b on every named column (>= on each `maximize` column, <= on each `minimize` column) and
    strictly better on at least one. Rows that are equal on every named column do not dominate each other, so
    they are on the front together. An empty table has an empty front.

    Interview questions: Q-TUNE-01 (lessons/interview-bank.md#q-tune-01).
    """
    raise NotImplementedError("E07.1: the Pareto front of a sweep")


def replicas_needed(qps: float, goodput_per_replica: float, max_utilization: float = 1.0) -> int:
    """E07.2 (design), part a: how many replicas serve `qps` requests/s.

    `goodput_per_replica` is the highest arrival rate, in requests/s, that one replica sustains with its requests
    within the SLO, as a sweep over rates measures it. Each replica may be loaded up to `max_utilization` of
    that rate (0.8 keeps 20% headroom for bursts). Return 0 for no traffic. Raise ValueError when a replica
    serves nothing (goodput_per_replica <= 0) or when max_utilization is not in (0, 1].

    Interview questions: Q-TUNE-02 (lessons/interview-bank.md#q-tune-02).
    """
    raise NotImplementedError("E07.2: how many replicas")


def cost_per_million_tokens(gpu_hour_usd: float, gpus: int, output_tokens_per_s: float) -> float:
    """E07.2 (design), part b: dollars per million output tokens when `gpus` GPUs, at `gpu_hour_usd` each per
    hour, produce `output_tokens_per_s` together. It works for one replica (its GPUs, its tokens/s) and for a
    whole fleet (all the GPUs, the fleet's tokens/s). Raise ValueError when output_tokens_per_s <= 0."""
    raise NotImplementedError("E07.2: the cost per million output tokens")


def cheapest_deployment(configs: Sequence[Mapping[str, Any]], qps: float, gpu_hour_usd: float,
                        max_utilization: float = 1.0) -> dict[str, Any]:
    """E07.2 (design), part c: the cheapest way to serve `qps` requests/s with one of `configs`.

    Each config is a row with "name", "goodput" (requests/s one replica sustains within the SLO) and "gpus"
    (GPUs per replica). A row may also carry "gpu_hour_usd", the price of its own GPU type, which overrides
    the argument. Return {"name", "replicas", "gpus" (all of them), "usd_per_hour"} for the config with the
    lowest usd_per_hour. On a tie, pick the one with the most spare capacity (replicas × goodput), then the
    one listed first. Skip configs with goodput <= 0 or NaN, since they cannot serve; raise ValueError when
    none is left.
    """
    raise NotImplementedError("E07.2: the cheapest deployment")


class LeastPendingPrefillRouter:
    """E07.3 (implement): a router plug-in (sim/router.py) that sends each request to the replica with the
    fewest prompt tokens still to prefill.

    A replica's pending prefill is the sum, over the requests waiting or running there (the ids
    `replica.scheduler.unfinished_request_ids()`, each request `replica.scheduler.get_request(id)`: the
    scheduler's interface, as a router in front of a real engine would ask it), of each one's prompt tokens not
    yet computed: `num_prompt_tokens - num_computed_tokens`, or 0 once that is negative (a decoding request).
    Ties go to the replica with the fewest outstanding requests (`replica.num_unfinished`), then to the first
    in `replicas`. A request count treats a 50-token and an 8,000-token prompt alike; this counts the work that
    delays the next request's first token.

    Interview questions: Q-CAP-04 (lessons/interview-bank.md#q-cap-04).
    """

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet

    def route(self, request: Request, replicas: Sequence[SimulatedExecutor]) -> SimulatedExecutor:
        raise NotImplementedError("E07.3: a router plug-in")
