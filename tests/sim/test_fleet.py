"""Tests of fleets: routers as plug-ins, tenant-aware routing, mixed fleets, autoscaling with cold starts.

A fleet of one replica behind any router decides exactly what one `Simulator` decides; tenant-aware
routing never lets one tenant's prompts draw another's requests (a property over random workloads);
prefix-aware routing beats round-robin's hit rate on shared prefixes; an autoscaled fleet respects its
bounds, loses nothing while draining, and the first request after scale-to-zero waits exactly the priced
cold start.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from core import EngineConfig, Exponential, Request, Workload
from course.playground import decision_digest
from sim import Cluster, Simulator
from sim.autoscaler import AutoscaledFleet, Autoscaler, ColdStart
from sim.cost_model import model_weight_bytes
from sim.router import ROUTERS, Fleet, PrefixAwareRouter, make_router, register_router
from sim.simulator import device_block_bytes

GPU = dict(model="llama-3.1-8b", hardware="h100-sxm")
CONFIG = EngineConfig(max_num_seqs=32, max_num_batched_tokens=1024)


def mixed_workload(n: int = 60, seed: int = 0, arrival: str | float = 30.0) -> Workload:
    return Workload.synthetic(n, (16, 400), Exponential(64, 256), arrival=arrival, seed=seed).with_tenant_mix(
        {"a": 2, "b": 1})


def shared_prefix_workload(seed: int = 0) -> Workload:
    """8 system prompts of 4 blocks, each opening 12 requests, interleaved, at 40 requests/s."""
    return Workload.shared_prefix(8, 12, prefix_len=64, suffix_len=32, output_len=16, arrival=40.0, seed=seed)


# ---- routers ----

@pytest.mark.parametrize("router", sorted(ROUTERS))
def test_a_fleet_of_one_behind_any_router_decides_what_one_simulator_decides(router):
    workload = mixed_workload()
    fleet = Cluster(**GPU, config=CONFIG, router=router).simulate(workload)
    single = Simulator(**GPU, config=CONFIG).run(workload)
    assert decision_digest([fleet.metrics]) == decision_digest([single])
    assert repr(fleet.metrics.to_dict()) == repr(single.to_dict())


def test_an_autoscaled_fleet_held_at_one_replica_is_one_simulator():
    workload = mixed_workload()
    fleet = Cluster(**GPU, config=CONFIG, autoscaler=Autoscaler(min_replicas=1, max_replicas=1)).simulate(workload)
    assert repr(fleet.metrics.to_dict()) == repr(Simulator(**GPU, config=CONFIG).run(workload).to_dict())


def test_unknown_and_duplicate_routers_are_refused_by_name():
    with pytest.raises(ValueError, match="unknown router 'random'; known: round_robin, "):
        Cluster(**GPU, router="random")
    with pytest.raises(ValueError, match="already registered"):
        register_router("round_robin")(PrefixAwareRouter)


def test_a_plug_in_router_is_used_by_name():
    class LastReplica:
        def __init__(self, fleet: Fleet) -> None:
            pass

        def route(self, request, replicas):
            return replicas[-1]

    register_router("last_replica_for_test")(LastReplica)
    try:
        run = Cluster(**GPU, config=CONFIG, num_replicas=3, router="last_replica_for_test").simulate(mixed_workload())
    finally:
        del ROUTERS["last_replica_for_test"]
    assert [m.completed for m in run.replicas.values()] == [0, 0, 60]


def test_prefix_aware_routing_hits_more_than_round_robin_on_shared_prefixes():
    workload = shared_prefix_workload()
    rates = {router: Cluster(**GPU, config=CONFIG, num_replicas=3, router=router).run(workload).prefix_cache_hit_rate
             for router in ("round_robin", "prefix_aware", "tenant_aware")}
    assert rates["prefix_aware"] > rates["round_robin"] + 0.1
    assert rates["tenant_aware"] == rates["prefix_aware"]  # one tenant: the same index


def test_a_shared_system_prompt_does_not_send_every_request_to_one_replica():
    """One prefix in every prompt, but under half of each prompt: the guard routes by load instead."""
    workload = Workload.chat(24, 1, system_len=64, user_len=200, output_len=16, arrival=60.0)
    run = Cluster(**GPU, config=CONFIG, num_replicas=3, router="prefix_aware").simulate(workload)
    assert min(m.completed for m in run.replicas.values()) >= 4


def routed_with_other_tenants_prefix(router_name: str, workload: Workload, num_replicas: int = 3) -> list[str]:
    """Requests the router sent to a replica for a prefix that only another tenant had sent there."""
    cluster = Cluster(**GPU, config=CONFIG, num_replicas=num_replicas, router=router_name)
    router = make_router(router_name, cluster.fleet)
    sent: dict[str, dict[tuple[int, ...], set[str]]] = {}  # replica -> prefix -> tenants that sent it
    offenders = []
    block = cluster.fleet.block_size
    env = simpy.Environment()
    replicas = [cluster.simulator.make_executor(env, f"replica{i}") for i in range(num_replicas)]
    for request in workload.make_requests(cluster.simulator.arch.vocab_size):
        replica = router.route(request, replicas)
        name, match = router.last_decision
        prefix = tuple(request.prompt_token_ids[:match * block])
        if match and request.tenant not in sent.get(name, {}).get(prefix, set()):
            offenders.append(request.request_id)
        for k in range(1, len(request.prompt_token_ids) // block + 1):
            sent.setdefault(replica.name, {}).setdefault(
                tuple(request.prompt_token_ids[:k * block]), set()).add(request.tenant)
    return offenders


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), num_groups=st.integers(1, 4), tenants=st.lists(
    st.sampled_from("abc"), min_size=2, max_size=3, unique=True))
def test_tenant_aware_routing_never_routes_by_another_tenants_prefix(seed, num_groups, tenants):
    """Tenants send prompts from the same prefix groups (identical tokens); the tenant-aware router's every
    prefix match was sent to that replica by the same tenant."""
    workload = Workload.shared_prefix(num_groups, 6, prefix_len=48, suffix_len=(1, 20), output_len=4,
                                      seed=seed).with_tenant_mix(dict.fromkeys(tenants, 1))
    assert routed_with_other_tenants_prefix("tenant_aware", workload) == []


def test_the_tenant_blind_prefix_router_does_route_by_another_tenants_prefix():
    """The property above can fail: the blind index draws b's request to where a sent the same prompt."""
    workload = Workload.shared_prefix(1, 6, prefix_len=48, suffix_len=4, output_len=4).with_tenant_mix(
        {"a": 1, "b": 1})
    assert routed_with_other_tenants_prefix("prefix_aware", workload) != []


def test_session_affinity_keeps_a_session_on_its_replica_and_spreads_new_ones():
    cluster = Cluster(**GPU, config=CONFIG, num_replicas=3, router="session_affinity")
    router = make_router("session_affinity", cluster.fleet)
    env = simpy.Environment()
    replicas = [cluster.simulator.make_executor(env, f"replica{i}") for i in range(3)]
    homes = {}
    for turn in range(3):
        for session in ("s0", "s1", "s2"):
            request = Request(f"{session}-{turn}", [1] * 40, max_tokens=4, user=session)
            replica = router.route(request, replicas)
            replica.add_request(request)
            assert homes.setdefault(session, replica.name) == replica.name
    assert sorted(homes.values()) == ["replica0", "replica1", "replica2"]
    assert router.route(Request("s0-lost", [1] * 8, max_tokens=1, user="s0"), replicas[1:]).name != homes["s0"]


def test_least_kv_prefers_the_replica_with_the_emptier_pool():
    cluster = Cluster(**GPU, config=CONFIG, num_replicas=2, router="least_kv")
    router = make_router("least_kv", cluster.fleet)
    env = simpy.Environment()
    replicas = [cluster.simulator.make_executor(env, f"replica{i}") for i in range(2)]
    long_prompt = Request("long", [5] * 4000, max_tokens=8)
    replicas[0].add_request(long_prompt)
    replicas[0].scheduler.schedule(0.0)  # admits it: its blocks are allocated
    for i in range(3):
        replicas[1].add_request(Request(f"short{i}", [5] * 8, max_tokens=8))
    assert router.route(Request("next", [5] * 8, max_tokens=8), replicas).name == "replica1"
    assert make_router("least_loaded", cluster.fleet).route(Request("next", [5] * 8, max_tokens=8),
                                                            replicas).name == "replica0"


# ---- fleets ----

def test_a_mixed_fleet_serves_everything_and_the_faster_gpu_finishes_sooner():
    h100, a100 = (Simulator("llama-3.1-8b", gpu, CONFIG) for gpu in ("h100-sxm", "a100-80gb-sxm"))
    run = Cluster(simulators=[h100, a100], router="round_robin").simulate(mixed_workload(arrival="all"))
    assert run.metrics.completed == 60
    assert run.replicas["replica0"].duration < run.replicas["replica1"].duration
    with pytest.raises(ValueError, match="one model and block size"):
        Cluster(simulators=[h100, Simulator("llama-3.1-70b", "h100-sxm", CONFIG, tensor_parallel_size=4)])


def test_a_static_fleet_bills_every_replica_for_the_whole_run():
    run = Cluster(**GPU, config=CONFIG, num_replicas=3).simulate(mixed_workload())
    end = max(s.start + s.duration for s in run.metrics.steps)
    assert run.gpu_seconds == pytest.approx(3 * end)
    assert run.cost_per_million_tokens(3.6) == pytest.approx(
        run.gpu_seconds / 3600 * 3.6 / run.metrics.total_output_tokens * 1e6)


# ---- autoscaling ----

COLD = ColdStart(process_start_s=5.0, load_bandwidth=2e9, compile_s=1.0)


def test_a_cold_start_is_its_priced_parts():
    simulator = Simulator(**GPU, config=CONFIG)
    parts = COLD.parts(simulator)
    weight_bytes = model_weight_bytes(simulator.arch, "bfloat16", simulator.hardware)
    assert parts["weight_load"] == weight_bytes / 2e9 + weight_bytes / simulator.hardware.memory_bandwidth
    assert parts["kv_allocation"] == simulator.num_kv_blocks * device_block_bytes(
        simulator.arch, 16, simulator.kv_cache_dtype) / simulator.hardware.memory_bandwidth
    assert COLD.seconds(simulator) == pytest.approx(5.0 + 1.0 + parts["weight_load"] + parts["kv_allocation"])
    assert 8 < parts["weight_load"] < 8.1  # 16 GB of bf16 weights at 2 GB/s
    slow_pages = replace(COLD, allocation_bandwidth=1e9).parts(simulator)["kv_allocation"]
    assert slow_pages == pytest.approx(parts["kv_allocation"] * simulator.hardware.memory_bandwidth / 1e9)


def test_after_scaling_to_zero_the_first_request_waits_exactly_the_cold_start():
    one = Workload.synthetic(1, 200, 20)
    two = Workload.synthetic(2, 200, 20)
    two = replace(two, requests=(two.requests[0], replace(two.requests[1], arrival_time=500.0)))
    policy = Autoscaler(min_replicas=0, max_replicas=2, scale_down_delay_s=30.0, cold_start=COLD)
    run = Cluster(**GPU, config=CONFIG, autoscaler=policy).simulate(two)
    alone = Simulator(**GPU, config=CONFIG).run(one).requests[0]
    cold = COLD.seconds(Simulator(**GPU, config=CONFIG))
    first, second = sorted(run.metrics.requests, key=lambda r: r.arrival_time)
    assert first.ttft == pytest.approx(cold + alone.ttft, abs=1e-9)
    assert second.ttft == pytest.approx(cold + alone.ttft, abs=1e-9)  # the fleet was at zero again
    assert run.timeline.num_cold_starts == 2
    assert run.timeline.changes[-1][1:] == (0, 0, 0)


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 1000), min_replicas=st.integers(0, 2), extra=st.integers(0, 3))
def test_an_autoscaled_fleet_stays_in_bounds_and_loses_no_request_while_draining(seed, min_replicas, extra):
    """A burst, a lull long enough to scale down, a second burst: every request served, bounds held."""
    max_replicas = max(1, min_replicas) + extra
    burst = Workload.synthetic(80, (16, 300), Exponential(48, 200), arrival=80.0, seed=seed)
    later = Workload.synthetic(40, (16, 300), Exponential(48, 200), arrival=80.0, seed=seed + 1)
    later = later.delayed(120.0)
    policy = Autoscaler(target_concurrency=8, min_replicas=min_replicas, max_replicas=max_replicas,
                        scale_down_delay_s=10.0, cold_start=COLD)
    run = Cluster(**GPU, config=CONFIG, autoscaler=policy).simulate(burst + later)
    assert run.metrics.completed == 120 and run.metrics.failed == 0
    for time, starting, serving, _ in run.timeline.changes:
        assert starting + serving <= max_replicas
        assert time == 0 or starting + serving >= min_replicas
    assert run.timeline.changes[-1][1:] == (0, min_replicas, 0)
    assert run.gpu_seconds > 0 and math.isfinite(run.cost_per_million_tokens(2.0))


def test_the_same_autoscaled_run_twice_gives_the_same_numbers():
    policy = Autoscaler(target_concurrency=4, min_replicas=0, max_replicas=4, cold_start=COLD)
    runs = [Cluster(**GPU, config=CONFIG, autoscaler=policy, router="prefix_aware").simulate(
        shared_prefix_workload(seed=3)) for _ in range(2)]
    assert repr(runs[0].metrics.to_dict()) == repr(runs[1].metrics.to_dict())
    assert runs[0].timeline == runs[1].timeline
    assert runs[0].timeline.max_serving > 1


class ScriptedFleet(AutoscaledFleet):
    """A fleet whose outstanding count the test sets, to check the windows' arithmetic by hand."""

    count = 0

    @property
    def outstanding(self) -> int:
        return self.count


@pytest.mark.parametrize("panic", [True, False])
def test_knative_windows_by_hand(panic):
    """Stable window 10 s, sampled every 2 s; the panic window (10%: 1 s) holds this tick alone; target 10 per
    replica, one serving. Without panic (threshold out of reach) the stable mean alone decides."""
    policy = Autoscaler(target_concurrency=10, min_replicas=0, max_replicas=8, initial_replicas=1,
                        stable_window_s=10.0, panic_threshold_pct=200.0 if panic else 1e9)
    fleet = ScriptedFleet(simpy.Environment(), Simulator(**GPU, config=CONFIG), make_router("round_robin", None),
                          policy, num_requests=0)
    script = [(2, 10), (4, 10), (6, 10), (8, 30), (10, 10), (12, 50), (14, 0), (20, 0), (22, 0)]
    wanted = []
    for now, count in script:
        fleet.count = count
        wanted.append(fleet._windowed_desired(float(now), current=1))
    if panic:
        # t = 8: 30 / 10 = 3 replicas' worth >= 200% of the 1 serving: panic, to 3; t = 12: 5, and never fewer
        # until 10 s after the last reason (t = 12); at t = 22 the stable window (12, 22] holds only zeros
        assert wanted == [1, 1, 1, 3, 3, 5, 5, 5, 0]
    else:
        # means over the ticks in (now - 10, now]: 10, 10, 10, 15, 14, 22, 20, 16.7, 0
        assert wanted == [1, 1, 1, 2, 2, 3, 2, 2, 0]


def test_with_knative_windows_the_last_replica_goes_after_a_whole_stable_window_without_requests():
    one = Workload.synthetic(1, 200, 20)
    stops = {}
    for window in (None, 60.0):
        policy = Autoscaler(min_replicas=0, max_replicas=2, scale_down_delay_s=0.0, stable_window_s=window,
                            cold_start=COLD)
        run = Cluster(**GPU, config=CONFIG, autoscaler=policy).simulate(one)
        finish = run.metrics.requests[0].finish_time
        stops[window] = run.timeline.changes[-1][0] - finish
        assert run.timeline.changes[-1][1:] == (0, 0, 0)
    assert 0 < stops[None] <= 2.0  # the first tick after the request finished
    assert 58.0 <= stops[60.0] <= 62.0  # once the window's last tick with the request in it is 60 s old


def test_bad_autoscaler_and_fleet_arguments_are_refused():
    with pytest.raises(ValueError, match="min_replicas <= initial_replicas <= max_replicas"):
        Autoscaler(min_replicas=3, max_replicas=2)
    with pytest.raises(ValueError, match="bandwidths > 0"):
        ColdStart(load_bandwidth=0)
    with pytest.raises(ValueError, match="bandwidths > 0"):
        ColdStart(allocation_bandwidth=0)
    with pytest.raises(ValueError, match="stable_window_s must be at least interval_s"):
        Autoscaler(stable_window_s=1.0)
    with pytest.raises(ValueError, match="panic_window_pct in"):
        Autoscaler(stable_window_s=60.0, panic_window_pct=0)
    with pytest.raises(ValueError, match="give one fleet"):
        Cluster(**GPU, num_replicas=2, autoscaler=Autoscaler())


@pytest.mark.parametrize("router", ["prefix_aware", "tenant_aware", "least_kv"])
def test_a_disaggregated_fleet_routes_both_pools_with_any_router(router):
    workload = shared_prefix_workload().with_tenant_mix({"a": 1, "b": 1})
    run = Cluster(**GPU, config=CONFIG, num_prefill_replicas=2, num_decode_replicas=2, router=router).simulate(workload)
    assert run.metrics.completed == len(workload) and run.metrics.failed == 0
    assert sorted(run.replicas) == ["decode0", "decode1", "prefill0", "prefill1"]


def test_session_affinity_keeps_conversations_whole_where_prefix_routing_piles_onto_one_replica():
    """Lesson 7's chat table: a shared system prompt is half of every first turn."""
    workload = Workload.chat(50, 4, system_len=256, user_len=256, output_len=128, arrival=20.0).with_sessions()
    assert {r.user for r in workload.requests} == {f"session-{c}" for c in range(50)}
    runs = {router: Cluster(**GPU, config=EngineConfig(max_num_seqs=128, max_num_batched_tokens=2048),
                            num_replicas=4, router=router).simulate(workload)
            for router in ("round_robin", "prefix_aware", "session_affinity")}
    rates = {router: run.metrics.prefix_cache_hit_rate for router, run in runs.items()}
    assert rates["session_affinity"] > rates["prefix_aware"] > rates["round_robin"]
    served = {router: [m.completed for m in run.replicas.values()] for router, run in runs.items()}
    assert max(served["session_affinity"]) - min(served["session_affinity"]) <= 12
    assert max(served["prefix_aware"]) > 100  # the hot spot the load guard lets through
