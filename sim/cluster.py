"""`Cluster`: several simulated replicas behind a router, colocated or prefill/decode disaggregated.

This module owns what sits above one engine: routing requests to replicas, and moving a request's KV
cache from a prefill replica to a decode replica. Every replica is a `SimulatedExecutor` running the same
core scheduler as a single `Simulator`, all on one SimPy clock.

Routers (one per pool of replicas)
- "round_robin": replica 0, 1, 2, ... in turn;
- "least_loaded": the replica with the fewest unfinished (waiting + running) requests, lowest index on ties;
- "prefix_aware": a hash of the prompt's first block of tokens picks the replica, so requests that share
  a prefix land together, on the replica whose prefix cache already holds it (prefix caching is on by
  default): each replica caches only what it computed, so spreading a shared prefix over replicas
  computes it once per replica. It reads only the first block, so on random prompts it spreads load only
  as evenly as the hash does, and requests of different tenants may land together without sharing a hit.

Prefill/decode disaggregation (DistServe, OSDI'24; vLLM's disaggregated prefill), `num_prefill_replicas=x`,
`num_decode_replicas=y`:
1. the router sends the request to a prefill replica as a copy with `max_tokens=1` (`prefill_request`):
   it runs the prompt's prefill (in chunks, as the core schedules it, with prefix-cache hits isolated by
   tenant and cache_salt as on one replica) and its one sampled token is discarded;
2. the prompt's KV cache, prompt_len x kv_bytes_per_token bytes, crosses the prefill replica's network
   link: latency + bytes / bandwidth (`CostModel.kv_transfer_time`). Each prefill replica has one link, a
   SimPy resource, so its transfers queue one after another;
3. a decode replica receives the request (`decode_request`) with `num_computed_tokens = prompt_len - 1`:
   its blocks are allocated on admission, and its first step recomputes only the last prompt token to get
   the logits that sample the first output token, then decodes as usual. This is how vLLM's KV connectors admit a
   remotely prefilled request (the external tokens count as computed; the last token is recomputed).
So the first token the user sees comes from the decode replica: TTFT = prefill queueing + prefill + KV
transfer + decode queueing + one decode step, and TPOT is the decode replica's. (DistServe instead returns
the prefill's token as the first token, which moves the transfer out of TTFT into the first inter-token
gap.) The decode-side request is the end-to-end request: it keeps the arrival time and first-scheduled
time of the original, and counts the prefill side's preemptions and prefix-cache hits too. Both copies
carry every field of the original (tenant, cache_salt, stop conditions, ...) except the serving state,
which starts afresh on each replica (the fields `Request` declares `served`: `SERVING_STATE`).

Simplifications, kept for clarity: the prefill replica frees its blocks when the prefill finishes (vLLM
holds them until the decode side has pulled them), the KV waits in a staging buffer until the decode
replica admits the request (vLLM allocates decode blocks first, then pulls), and the receiving side's link
is not modelled.

Output: `RunMetrics` over the end-to-end requests, with every replica's steps in one log ordered by start
time; `Cluster.simulate` also returns each replica's own metrics.

Lesson: lessons/03-chunked-prefill-and-disaggregation.md#disaggregation (colocated vs xP+yD disaggregated, the KV
link swept); lessons/04-prefix-caching.md#tenant-isolation (why both copies carry tenant and cache_salt);
lessons/capstone.md#capacity-planning (replicas behind a router, checked at a planned rate).
"""

from __future__ import annotations

import itertools
from collections.abc import Generator, Sequence
from dataclasses import MISSING, dataclass, fields, replace
from typing import Any, Literal, Protocol

import simpy

from core.arch_config import ArchConfig
from core.config import EngineConfig
from core.metrics import RunMetrics
from core.request import SERVING_STATE, Request
from core.workload import Workload
from sim.executor import SimulatedExecutor, feed_arrivals
from sim.hardware import HardwareProfile
from sim.simulator import Simulator, resolve_hardware

RouterName = Literal["round_robin", "least_loaded", "prefix_aware"]


# ---- routers ---------------------------------------------------------------------------------------

class Router(Protocol):
    def route(self, request: Request, replicas: Sequence[SimulatedExecutor]) -> SimulatedExecutor: ...


class RoundRobinRouter:
    def __init__(self) -> None:
        self._turn = itertools.count()

    def route(self, request: Request, replicas: Sequence[SimulatedExecutor]) -> SimulatedExecutor:
        return replicas[next(self._turn) % len(replicas)]


class LeastLoadedRouter:
    def route(self, request: Request, replicas: Sequence[SimulatedExecutor]) -> SimulatedExecutor:
        return min(replicas, key=lambda replica: replica.num_unfinished)  # min keeps the first of equals


class PrefixAwareRouter:
    """Same first block of prompt tokens, same replica: the one whose prefix cache holds that block."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size

    def route(self, request: Request, replicas: Sequence[SimulatedExecutor]) -> SimulatedExecutor:
        first_block = tuple(request.prompt_token_ids[: self.block_size])
        return replicas[hash(first_block) % len(replicas)]  # hashes of int tuples are stable across runs


def make_router(name: RouterName, block_size: int) -> Router:
    if name == "round_robin":
        return RoundRobinRouter()
    if name == "least_loaded":
        return LeastLoadedRouter()
    if name == "prefix_aware":
        return PrefixAwareRouter(block_size)
    raise ValueError(f"router must be 'round_robin', 'least_loaded' or 'prefix_aware', got {name!r}")


# ---- disaggregation: one request, two replicas ------------------------------------------------------

def _copy_for_replica(request: Request, **changes: Any) -> Request:
    """`request` with its serving state (the fields `Request` declares `served`: `SERVING_STATE`) reset to
    the defaults (fresh lists), then `changes` applied; every `given` field is carried."""
    fresh = {f.name: f.default if f.default_factory is MISSING else f.default_factory()
             for f in fields(Request) if f.name in SERVING_STATE}
    return replace(request, **{**fresh, **changes})


def prefill_request(request: Request) -> Request:
    """What the prefill replica serves: the request, stopped after one token (that token is discarded)."""
    return _copy_for_replica(request, max_tokens=1)


def decode_request(request: Request, prefill: Request) -> Request:
    """What the decode replica serves once `prefill` is done and its KV has arrived: the end-to-end request,
    with every prompt token but the last computed, and the prefill side's scheduling, preemptions and hits."""
    return _copy_for_replica(request, num_computed_tokens=request.num_prompt_tokens - 1,
                             first_scheduled_time=prefill.first_scheduled_time,
                             num_preemptions=prefill.num_preemptions, num_cached_tokens=prefill.num_cached_tokens)


# ---- the cluster -----------------------------------------------------------------------------------

@dataclass
class ClusterRun:
    """What `Cluster.simulate` returns: end-to-end metrics and each replica's own, by replica name."""

    metrics: RunMetrics
    replicas: dict[str, RunMetrics]


class Cluster:
    """Identical replicas (same model, hardware and `EngineConfig`) behind a router.

    Colocated: `num_replicas` replicas each run whole requests. Disaggregated: give `num_prefill_replicas`
    and `num_decode_replicas` (both >= 1) instead; the KV link defaults to the hardware profile's network
    bandwidth and latency, and `kv_link_bandwidth` (bytes/s) / `kv_link_latency_s` override them.
    """

    def __init__(self, model: ArchConfig | str | None = None, hardware: HardwareProfile | str | None = None,
                 config: EngineConfig | None = None, *, num_replicas: int = 1,
                 num_prefill_replicas: int = 0, num_decode_replicas: int = 0,
                 router: RouterName = "round_robin", kv_link_bandwidth: float | None = None,
                 kv_link_latency_s: float | None = None, dtype: str | None = None,
                 tensor_parallel_size: int = 1, num_kv_blocks: int | None = None) -> None:
        self.disaggregated = num_prefill_replicas > 0 or num_decode_replicas > 0
        if self.disaggregated and (num_prefill_replicas < 1 or num_decode_replicas < 1 or num_replicas != 1):
            raise ValueError("disaggregation needs num_prefill_replicas >= 1 and num_decode_replicas >= 1 "
                             "(and no num_replicas)")
        if num_replicas < 1:
            raise ValueError(f"num_replicas must be >= 1, got {num_replicas}")
        hardware = resolve_hardware(hardware)
        if kv_link_bandwidth is not None:
            hardware = replace(hardware, network_bandwidth=kv_link_bandwidth)
        if kv_link_latency_s is not None:
            hardware = replace(hardware, network_latency_s=kv_link_latency_s)
        if self.disaggregated and hardware.network_bandwidth <= 0:
            raise ValueError(f"profile {hardware.name!r} has no network bandwidth for the KV link; "
                             "give kv_link_bandwidth")
        # Every replica is made from this one Simulator: model, hardware, config, cost model, pool size.
        self.simulator = Simulator(model, hardware, config, dtype=dtype, tensor_parallel_size=tensor_parallel_size,
                                   num_kv_blocks=num_kv_blocks)
        self.num_replicas = num_replicas
        self.num_prefill_replicas = num_prefill_replicas
        self.num_decode_replicas = num_decode_replicas
        self.router = router
        make_router(router, self.simulator.config.block_size)  # fail early on an unknown name

    def run(self, workload: Workload) -> RunMetrics:
        return self.simulate(workload).metrics

    def simulate(self, workload: Workload) -> ClusterRun:
        """Serve `workload` from empty replicas at time 0 until every request has finished or been refused."""
        env = simpy.Environment()
        requests = workload.make_requests(self.simulator.arch.vocab_size)
        if self.disaggregated:
            served, num_failed, replicas = self._run_disaggregated(env, requests)
        else:
            served, num_failed, replicas = self._run_colocated(env, requests)
        # one step log, by start time; sorted() is stable, so simultaneous steps keep replica order
        steps = sorted((s for r in replicas for s in r.steps), key=lambda s: s.start)
        metrics = RunMetrics.from_requests(served, steps, num_failed=num_failed)
        return ClusterRun(metrics, {r.name: r.metrics() for r in replicas})

    def _new_pool(self, env: simpy.Environment, role: str, size: int) -> list[SimulatedExecutor]:
        return [self.simulator.make_executor(env, f"{role}{i}") for i in range(size)]

    def _run_colocated(self, env: simpy.Environment, requests: list[Request]
                       ) -> tuple[list[Request], int, list[SimulatedExecutor]]:
        replicas = self._new_pool(env, "replica", self.num_replicas)
        router = make_router(self.router, self.simulator.config.block_size)
        env.process(feed_arrivals(env, requests,
                                  lambda request: router.route(request, replicas).add_request(request)))
        env.run()
        served = [r for replica in replicas for r in replica.requests]
        return served, sum(replica.num_refused for replica in replicas), replicas

    def _run_disaggregated(self, env: simpy.Environment, requests: list[Request]
                           ) -> tuple[list[Request], int, list[SimulatedExecutor]]:
        block_size = self.simulator.config.block_size
        prefill_pool = self._new_pool(env, "prefill", self.num_prefill_replicas)
        decode_pool = self._new_pool(env, "decode", self.num_decode_replicas)
        prefill_router = make_router(self.router, block_size)
        decode_router = make_router(self.router, block_size)
        links = {replica.name: simpy.Resource(env, capacity=1) for replica in prefill_pool}
        cost_model = self.simulator.cost_model
        served: list[Request] = []
        refused: list[Request] = []

        def serve(request: Request) -> Generator[simpy.Event, None, None]:
            """One request's journey: prefill replica -> KV link -> decode replica."""
            prefill_replica = prefill_router.route(request, prefill_pool)
            prefill = prefill_request(request)
            prefilled = prefill_replica.add_request(prefill)
            if prefilled is None:
                refused.append(request)
                return
            yield prefilled
            with links[prefill_replica.name].request() as link:
                yield link
                yield env.timeout(cost_model.kv_transfer_time(request.num_prompt_tokens))
            decode = decode_request(request, prefill)
            decoded = decode_router.route(decode, decode_pool).add_request(decode)
            if decoded is None:
                refused.append(request)
                return
            yield decoded
            served.append(decode)

        env.process(feed_arrivals(env, requests, lambda request: env.process(serve(request))))
        env.run()
        return served, len(refused), prefill_pool + decode_pool
