"""Checks for lesson 3's exercises; `impl` is the reference or your stub (see conftest.py).

E03.1 drives the engine's `FairRequestQueue` with the same counters and compares the admission order.
E03.2 compares your bytes with `ArchConfig.kv_bytes_per_token` and your seconds with the simulator's
`CostModel.kv_transfer_time` on a profile whose network link is the one you were given.
E03.3 runs your plan in the simulated cluster (`Cluster`): it must meet the SLOs, every layout with fewer
instances must miss them on the fastest link, and the next slower link must miss them with your layout.
E03.4 runs your scheduler in the simulator as a `scheduling_policy`: a tenant that comes back after idling
must not starve the one that kept the server busy, and the steps must be those of the engine's "fair".
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.arch_config import ArchConfig
from core.config import EngineConfig
from core.fair import FairRequestQueue
from core.metrics import RequestRecord, RunMetrics
from core.request import Request
from core.scheduler_registry import register_scheduler
from core.workload import Workload, WorkloadRequest
from sim.cluster import Cluster
from sim.cost_model import CostModel
from sim.hardware import HardwareProfile
from sim.simulator import Simulator

FEW = settings(max_examples=150, deadline=None, derandomize=True)


# ---- E03.1 -------------------------------------------------------------------------------------------


def _engine_order(requests, weights):
    counters: dict[str, float] = {t: 0.0 for t, _ in requests}
    queue = FairRequestQueue(counters, Counter())
    for i, (tenant, _) in enumerate(requests):
        queue.add_request(Request(str(i), [1], max_tokens=1, arrival_time=float(i), tenant=tenant))
    order = []
    while len(queue):
        r = queue.pop_request()
        i = int(r.request_id)
        counters[r.tenant_key] += requests[i][1] / weights.get(r.tenant_key, 1.0)
        order.append(i)
    return order


def test_e03_1_examples(impl):
    assert impl.vtc_order([("a", 10), ("a", 10), ("b", 10)]) == [0, 2, 1]
    assert impl.vtc_order([("a", 5)] * 4 + [("b", 5)] * 2) == [0, 4, 1, 5, 2, 3]  # round-robin, then a alone
    # weights 1:3: b gets three requests for each one of a's while both are backlogged
    order = impl.vtc_order([("a", 30)] * 4 + [("b", 30)] * 12, {"a": 1, "b": 3})
    assert [("a" if i < 4 else "b") for i in order[:8]] == ["a", "b", "b", "b", "a", "b", "b", "b"]


@FEW
@given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(1, 50)), min_size=1, max_size=30),
       st.floats(0.5, 4), st.floats(0.5, 4))
def test_e03_1_matches_the_engines_fair_queue(impl, requests, wa, wb):
    weights = {"a": wa, "b": wb}
    assert impl.vtc_order(requests, weights) == _engine_order(requests, weights)


# ---- E03.2 -------------------------------------------------------------------------------------------

def test_e03_2_by_hand(impl):
    llama = ArchConfig.named("llama-3.1-8b")
    assert impl.kv_transfer_bytes(llama, 1) == 128 * 1024  # 128 KiB per token in bf16
    assert impl.kv_transfer_bytes(llama, 4096) == 512 * 1024 * 1024  # 512 MiB for 4096 tokens
    assert impl.kv_transfer_seconds(llama, 4096, 50e9) == pytest.approx(512 * 2**20 / 50e9)  # ~10.7 ms
    assert impl.kv_transfer_seconds(llama, 4096, 1.25e9) == pytest.approx(0.4295, rel=1e-3)  # ~0.43 s on 10 GbE


@pytest.mark.parametrize("name", ["llama-3.1-8b", "mistral-7b", "smollm2-135m"])
@pytest.mark.parametrize("prompt_len", [1, 512, 4096])
def test_e03_2_matches_the_cost_model(impl, name, prompt_len):
    arch = ArchConfig.named(name)
    assert impl.kv_transfer_bytes(arch, prompt_len) == arch.kv_bytes_per_token(2) * prompt_len
    for bandwidth, latency in ((450e9, 5e-6), (50e9, 1e-5), (1.25e9, 5e-5)):
        hardware = replace(HardwareProfile.named("h100-sxm"), network_bandwidth=bandwidth, network_latency_s=latency)
        expected = CostModel(arch, hardware, dtype="bfloat16").kv_transfer_time(prompt_len)
        assert impl.kv_transfer_seconds(arch, prompt_len, bandwidth, latency) == pytest.approx(expected, rel=1e-9)


# ---- E03.3 -------------------------------------------------------------------------------------------

LINKS = {"NVLink 450 GB/s": 450e9, "InfiniBand 400 Gb/s": 50e9, "100 GbE": 12.5e9, "25 GbE": 3.125e9,
         "10 GbE": 1.25e9}
# name -> (workload, p90 TTFT SLO ms, p99 ITL SLO ms): Llama-3.1-8B on simulated H100s, 100 Poisson requests
MIXES = {
    "long prompts": (Workload.synthetic(100, 2048, 256, arrival=30.0, seed=0), 200.0, 10.0),
    "long outputs": (Workload.synthetic(100, 512, 512, arrival=40.0, seed=0), 200.0, 8.0),
}
POOL = EngineConfig(max_num_batched_tokens=2048, max_num_seqs=256)  # the stub's default config


@functools.cache


def _cluster_run(mix: str, x: int, y: int, bandwidth: float) -> RunMetrics:
    cluster = Cluster("llama-3.1-8b", "h100-sxm", POOL, num_prefill_replicas=x, num_decode_replicas=y,
                      router="least_loaded", kv_link_bandwidth=bandwidth)
    return cluster.run(MIXES[mix][0])


def _verdict(mix: str, x: int, y: int, link: str) -> tuple[bool, str]:
    workload, ttft, itl = MIXES[mix]
    m = _cluster_run(mix, x, y, LINKS[link])
    ok = m.completed == len(workload.requests) and m.p90_ttft_ms <= ttft and m.p99_itl_ms <= itl
    return ok, (f"{x}P+{y}D on {link}: p90 TTFT {m.p90_ttft_ms:.0f} ms (SLO {ttft:g}), p99 ITL {m.p99_itl_ms:.2f} "
                f"ms (SLO {itl:g}), {m.completed} of {len(workload.requests)} completed")


@pytest.mark.parametrize("mix", MIXES)
def test_e03_3_the_plan_meets_the_slos_with_the_fewest_instances(impl, mix):
    workload, ttft, itl = MIXES[mix]
    x, y, link = impl.size_pd_cluster(workload, ttft, itl, LINKS)
    assert x >= 1 and y >= 1 and link in LINKS, (x, y, link)
    ok, story = _verdict(mix, x, y, link)
    assert ok, f"the plan misses the SLOs in the simulated cluster: {story}"
    fastest = max(LINKS, key=LINKS.get)
    for total in range(2, x + y):
        for smaller in range(1, total):
            ok, story = _verdict(mix, smaller, total - smaller, fastest)
            assert not ok, f"fewer instances meet the SLOs: {story}"
    slower = [name for name in LINKS if LINKS[name] < LINKS[link]]
    if slower:
        ok, story = _verdict(mix, x, y, max(slower, key=LINKS.get))
        assert not ok, f"the next slower link is enough: {story}"


def test_e03_3_says_when_nothing_fits(impl):
    workload, ttft, _ = MIXES["long outputs"]
    with pytest.raises(ValueError):
        impl.size_pd_cluster(workload, ttft, 1.0, LINKS, max_instances=3)  # no decode step is 1 ms

# ---- E03.4 -------------------------------------------------------------------------------------------


def _policy(cls) -> str:
    """Make `cls` a `scheduling_policy` value, as any plug-in becomes one (core/scheduler_registry.py). The
    name is the class's own, so a stub reloaded after an edit (`check("E03.4")` twice) registers afresh."""
    name = f"e03-4:{cls.__module__}:{id(cls):x}"
    register_scheduler(name, policy=True)(cls)
    return name


def _run(policy: str, workload: Workload) -> RunMetrics:
    config = EngineConfig(scheduling_policy=policy, max_num_seqs=4, max_num_batched_tokens=512)
    return Simulator("llama-3.1-8b", "h100-sxm", config).run(workload)


def _tenant_workload(spec) -> Workload:
    """(tenant, arrival time, number of requests), each request 64 prompt tokens and 32 output tokens."""
    requests = [WorkloadRequest(arrival, 64, 32, tenant=tenant) for tenant, arrival, n in spec for _ in range(n)]
    return Workload(tuple(sorted(requests, key=lambda r: r.arrival_time)), seed=0, name="tenants")


RETURN_S = 1.0  # when "bursty" comes back
BURST = _tenant_workload([("steady", 0.0, 80), ("bursty", 0.0, 4), ("bursty", RETURN_S, 20)])


def _admissions_after(metrics: RunMetrics, t: float) -> list[RequestRecord]:
    after = [r for r in metrics.requests if r.first_scheduled_time >= t]
    return sorted(after, key=lambda r: r.first_scheduled_time)


def test_e03_4_a_returning_tenant_does_not_starve_the_busy_one(impl):
    """"bursty" sends 4 requests, goes quiet while "steady" keeps the server busy, then sends 20 more. While
    both are backlogged, admissions must alternate between them, as they did at the start."""
    m = _run(_policy(impl.VTCScheduler), BURST)
    after = _admissions_after(m, RETURN_S)
    last_bursty = max(i for i, r in enumerate(after) if r.tenant == "bursty")
    window = after[:last_bursty + 1]  # from bursty's return until its last request is admitted: both backlogged
    letters = "".join(r.tenant[0] for r in window)
    steady = [r for r in window if r.tenant == "steady"]
    gap = (steady[0].first_scheduled_time if steady else window[-1].first_scheduled_time) - RETURN_S
    share = len(steady) / len(window)
    assert 0.35 <= share <= 0.65, (
        f"after 'bursty' came back at t={RETURN_S:.1f} s, the next {len(window)} admissions, until its last one, "
        f"went {letters} (s = steady, b = bursty): 'steady' was backlogged all along and waited {gap:.2f} s for "
        "its next admission. Which counter did 'bursty' compete with when it came back?")


def test_e03_4_the_start_is_fair_and_nobody_is_refused(impl):
    """Before anyone goes idle, the two tenants alternate; every request of the run completes."""
    m = _run(_policy(impl.VTCScheduler), BURST)
    first = sorted(m.requests, key=lambda r: (r.first_scheduled_time, int(r.request_id)))[:8]
    assert sorted(r.tenant for r in first) == ["bursty"] * 4 + ["steady"] * 4
    assert m.completed == len(BURST) and m.failed == 0


@pytest.mark.parametrize("spec", [
    [("a", 0.0, 40), ("b", 0.0, 3), ("b", 0.6, 12), ("c", 0.3, 5), ("c", 1.2, 8)],
    [("a", 0.0, 30), ("b", 0.2, 6), ("b", 0.9, 6), ("b", 1.4, 6)],
])
def test_e03_4_makes_the_engines_fair_decisions(impl, spec):
    """Tenants coming and going while "a" stays backlogged: every step runs the same requests as under the
    engine's own scheduling_policy="fair" (`FairScheduler`). The requests are all the same size, so the
    steps are compared by who ran in them, not only by their shapes."""
    workload = _tenant_workload(spec)
    engine, yours = (_run(policy, workload) for policy in ("fair", _policy(impl.VTCScheduler)))
    tenant = {r.request_id: r.tenant for r in engine.requests}
    for e, y in zip(engine.steps, yours.steps):
        assert e.request_ids == y.request_ids, (
            f"step {e.step_id} at t={e.start:.2f} s ran {_who(e, tenant)} under the engine's fair policy, "
            f"{_who(y, tenant)} under yours")
    assert len(engine.steps) == len(yours.steps)


def _who(step, tenant: dict[str, str]) -> str:
    return " ".join(f"{rid}:{tenant[rid]}" for rid in step.request_ids)
