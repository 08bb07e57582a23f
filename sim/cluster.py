"""`Cluster`: several simulated replicas behind a router, colocated or prefill/decode disaggregated.

This module owns what sits above one engine: routing requests to replicas, and moving a request's KV
cache from a prefill replica to a decode replica. Every replica is a `SimulatedExecutor` running the same
core scheduler as a single `Simulator`, all on one SimPy clock.

Routers (one per pool of replicas): the policies of sim/router.py, by name (`router=`): round_robin,
least_loaded, least_kv, prefix_aware, tenant_aware, session_affinity, or a plug-in registered there.

Fleets: identical replicas (`num_replicas`), or one per `Simulator` given (`simulators=`: different GPUs,
pool sizes or knobs, one model), or a fleet whose size an `Autoscaler` (sim/autoscaler.py) changes as load
comes and goes, each new replica serving only after its priced cold start.

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
time; `Cluster.simulate` also returns each replica's own metrics and the GPU-seconds the fleet was up (an
autoscaled fleet: its timeline), from which `ClusterRun.cost_per_million_tokens` prices the run. With
`streaming=True` requests are made as they arrive and let go as they finish, and each replica gathers its
metrics as it runs (core/metrics_stream.py): the same numbers, without the step log or token times, in memory
that a million requests fit (benchmarks/fleet_scale.py).

Lesson: lessons/03-chunked-prefill-and-disaggregation.md#disaggregation (colocated vs xP+yD disaggregated, the KV
link swept); lessons/04-prefix-caching.md#tenant-isolation (why both copies carry tenant and cache_salt);
lessons/capstone.md#capacity-planning (replicas behind a router, checked at a planned rate);
lessons/07-tuning-knobs.md#from-one-replica-to-a-fleet (routers, autoscaling, cold starts).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Sequence
from dataclasses import MISSING, dataclass, fields, replace
from typing import Any

import simpy

from core.arch_config import ArchConfig
from core.config import EngineConfig
from core.metrics import RunMetrics
from core.metrics_stream import combined_metrics
from core.request import SERVING_STATE, Request
from core.workload import Workload
from sim.autoscaler import AutoscaledFleet, Autoscaler, FleetTimeline
from sim.executor import SimulatedExecutor, feed_arrivals
from sim.hardware import HardwareProfile
from sim.router import Fleet, make_router
from sim.simulator import Simulator, gc_paused, resolve_hardware

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

def served_and_refused(replicas: Sequence[SimulatedExecutor]) -> tuple[list[Request], int]:
    """Every request colocated replicas accepted, and how many they refused."""
    return [r for replica in replicas for r in replica.requests], sum(replica.num_refused for replica in replicas)


@dataclass
class ClusterRun:
    """What `Cluster.simulate` returns: end-to-end metrics, each replica's own (by replica name), the
    GPU-seconds the fleet was up (devices x seconds from time 0, or from a replica's start, to the end of the
    run or its stop), and an autoscaled fleet's timeline."""

    metrics: RunMetrics
    replicas: dict[str, RunMetrics]
    gpu_seconds: float
    timeline: FleetTimeline | None = None

    def cost_per_million_tokens(self, dollars_per_gpu_hour: float) -> float:
        """Dollars per million output tokens at `dollars_per_gpu_hour` (the fleet's whole bill, idle
        replicas and cold starts included, over the tokens it produced)."""
        return self.gpu_seconds / 3600 * dollars_per_gpu_hour / self.metrics.total_output_tokens * 1e6


class Cluster:
    """Replicas behind a router, colocated or prefill/decode disaggregated.

    Colocated: `num_replicas` identical replicas each run whole requests; or `simulators`, one replica per
    `Simulator` (a mixed fleet: same model and block size, any hardware and knobs); or a fleet sized by an
    `autoscaler`, starting at its initial size. Disaggregated: give `num_prefill_replicas` and
    `num_decode_replicas` (both >= 1) instead; the KV link defaults to the hardware profile's network
    bandwidth and latency, and `kv_link_bandwidth` (bytes/s) / `kv_link_latency_s` override them.
    `streaming`: metrics gathered as the run goes, requests let go as they finish (module docstring).
    """

    def __init__(self, model: ArchConfig | str | None = None, hardware: HardwareProfile | str | None = None,
                 config: EngineConfig | None = None, *, num_replicas: int = 1,
                 num_prefill_replicas: int = 0, num_decode_replicas: int = 0,
                 router: str = "round_robin", kv_link_bandwidth: float | None = None,
                 kv_link_latency_s: float | None = None, dtype: str | None = None,
                 tensor_parallel_size: int = 1, num_kv_blocks: int | None = None,
                 simulators: Sequence[Simulator] | None = None, autoscaler: Autoscaler | None = None,
                 streaming: bool = False) -> None:
        self.disaggregated = num_prefill_replicas > 0 or num_decode_replicas > 0
        if self.disaggregated and (num_prefill_replicas < 1 or num_decode_replicas < 1 or num_replicas != 1):
            raise ValueError("disaggregation needs num_prefill_replicas >= 1 and num_decode_replicas >= 1 "
                             "(and no num_replicas)")
        if num_replicas < 1:
            raise ValueError(f"num_replicas must be >= 1, got {num_replicas}")
        if sum((num_replicas > 1, simulators is not None, autoscaler is not None, self.disaggregated)) > 1:
            raise ValueError("give one fleet: num_replicas, simulators, an autoscaler, or prefill and decode "
                             "replicas")
        hardware = resolve_hardware(hardware)
        if kv_link_bandwidth is not None:
            hardware = replace(hardware, network_bandwidth=kv_link_bandwidth)
        if kv_link_latency_s is not None:
            hardware = replace(hardware, network_latency_s=kv_link_latency_s)
        if self.disaggregated and hardware.network_bandwidth <= 0:
            raise ValueError(f"profile {hardware.name!r} has no network bandwidth for the KV link; "
                             "give kv_link_bandwidth")
        if simulators is not None:
            self.simulators = list(simulators)
            if not self.simulators or len({(s.arch.name, s.config.block_size) for s in self.simulators}) > 1:
                raise ValueError("a mixed fleet needs at least one simulator, all of one model and block size")
        else:  # every replica made from one Simulator: model, hardware, config, cost model, pool size
            self.simulators = [Simulator(model, hardware, config, dtype=dtype,
                                         tensor_parallel_size=tensor_parallel_size, num_kv_blocks=num_kv_blocks)]
        self.simulator = self.simulators[0]
        self.num_replicas = len(self.simulators) if simulators is not None else num_replicas
        self.num_prefill_replicas = num_prefill_replicas
        self.num_decode_replicas = num_decode_replicas
        self.autoscaler = autoscaler
        self.streaming = streaming
        self.router = router
        self.fleet = Fleet(self.simulator.arch.name, self.simulator.config.block_size,
                           min(s.num_kv_blocks for s in self.simulators))
        make_router(router, self.fleet)  # fail early on an unknown name

    def run(self, workload: Workload) -> RunMetrics:
        return self.simulate(workload).metrics

    def simulate(self, workload: Workload, *, on_finish: Callable[[Request], None] | None = None) -> ClusterRun:
        """Serve `workload` from empty replicas at time 0 until every request has finished or been refused
        (and an autoscaled fleet is back at its minimum). `on_finish(request)`: called as each request
        finishes on a replica (a progress bar; with disaggregation, on the prefill side too)."""
        env = simpy.Environment()
        requests = workload.iter_requests(self.simulator.arch.vocab_size)  # each made as it arrives
        router = make_router(self.router, self.fleet)

        def make_replica(simulator: Simulator, name: str) -> SimulatedExecutor:
            replica = simulator.make_executor(env, name, streaming=self.streaming)
            replica.on_finish = on_finish
            return replica

        timeline = None
        with gc_paused():
            if self.disaggregated:
                served, num_failed, replicas, end_to_end = self._run_disaggregated(env, requests, make_replica)
            elif self.autoscaler is not None:
                fleet = AutoscaledFleet(env, self.simulator, router, self.autoscaler, len(workload),
                                        lambda name: make_replica(self.simulator, name))
                env.process(feed_arrivals(env, requests, fleet.deliver))
                env.process(fleet.run_until_done())
                env.run()
                timeline = fleet.close()
                replicas = end_to_end = fleet.replicas
                served, num_failed = served_and_refused(replicas)
            else:
                replicas = end_to_end = self._new_pool(make_replica, "replica", self.num_replicas)
                env.process(feed_arrivals(env, requests,
                                          lambda request: router.route(request, replicas).add_request(request)))
                env.run()
                served, num_failed = served_and_refused(replicas)
            if self.streaming:  # every replica's steps; the requests of those that finish them
                metrics = combined_metrics([r.stream for r in end_to_end], [r.stream for r in replicas], num_failed)
            else:  # one step log, by start time; sorted() is stable, so simultaneous steps keep replica order
                steps = sorted((s for r in replicas for s in r.steps), key=lambda s: s.start)
                metrics = RunMetrics.from_requests(served, steps, num_failed=num_failed)
            per_replica = {r.name: r.metrics() for r in replicas}
        gpu_seconds = timeline.gpu_seconds if timeline is not None else env.now * self._devices(replicas)
        return ClusterRun(metrics, per_replica, gpu_seconds, timeline)

    def _devices(self, replicas: list[SimulatedExecutor]) -> int:
        """Devices of a static fleet, replica i made from simulator i mod n as `_new_pool` makes it."""
        return sum(self.simulators[i % len(self.simulators)].num_devices for i in range(len(replicas)))

    def _new_pool(self, make_replica: Callable[[Simulator, str], SimulatedExecutor], role: str,
                  size: int) -> list[SimulatedExecutor]:
        return [make_replica(self.simulators[i % len(self.simulators)], f"{role}{i}") for i in range(size)]

    def _run_disaggregated(self, env: simpy.Environment, requests: Iterable[Request],
                           make_replica: Callable[[Simulator, str], SimulatedExecutor]
                           ) -> tuple[list[Request], int, list[SimulatedExecutor], list[SimulatedExecutor]]:
        """The end-to-end requests served (none kept when streaming), how many were refused, every replica,
        and the replicas that finish requests end to end (the decode pool)."""
        prefill_pool = self._new_pool(make_replica, "prefill", self.num_prefill_replicas)
        decode_pool = self._new_pool(make_replica, "decode", self.num_decode_replicas)
        prefill_router = make_router(self.router, self.fleet)
        decode_router = make_router(self.router, self.fleet)
        links = {replica.name: simpy.Resource(env, capacity=1) for replica in prefill_pool}
        cost_model = self.simulator.cost_model
        served: list[Request] = []
        num_refused = 0

        def serve(request: Request) -> Generator[simpy.Event, None, None]:
            """One request's journey: prefill replica -> KV link -> decode replica."""
            nonlocal num_refused
            prefill_replica = prefill_router.route(request, prefill_pool)
            prefill = prefill_request(request)
            prefilled = prefill_replica.add_request(prefill)
            if prefilled is None:
                num_refused += 1
                return
            yield prefilled
            with links[prefill_replica.name].request() as link:
                yield link
                yield env.timeout(cost_model.kv_transfer_time(request.num_prompt_tokens))
            decode = decode_request(request, prefill)
            decoded = decode_router.route(decode, decode_pool).add_request(decode)
            if decoded is None:
                num_refused += 1
                return
            yield decoded
            if not self.streaming:
                served.append(decode)

        env.process(feed_arrivals(env, requests, lambda request: env.process(serve(request))))
        env.run()
        return served, num_refused, prefill_pool + decode_pool, decode_pool
