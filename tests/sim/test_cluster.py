"""Tests of the simulated cluster: routers spread load, a one-replica cluster is a Simulator, and
prefill/decode disaggregation produces every token with the KV transfer inside TTFT."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest

from core import EngineConfig, Exponential, Request, RequestStatus, Workload, WorkloadRequest
from core.request import SERVING_STATE
from sim import Cluster, Simulator
from sim.cluster import decode_request, prefill_request
from sim.cost_model import BatchShape

GPU = dict(model="llama-3.1-8b", hardware="h100-sxm")
CONFIG = EngineConfig(max_num_seqs=32, max_num_batched_tokens=1024)


def mixed_workload(n: int = 120, seed: int = 0, arrival: str | float = 30.0) -> Workload:
    return Workload.synthetic(n, (16, 400), Exponential(64, 256), arrival=arrival, seed=seed)


# ---- routers ----

def served_per_replica(router: str, workload: Workload, num_replicas: int = 3) -> list[int]:
    run = Cluster(**GPU, config=CONFIG, num_replicas=num_replicas, router=router).simulate(workload)
    assert run.metrics.completed == len(workload)
    return [m.completed for m in run.replicas.values()]


def test_round_robin_splits_requests_evenly():
    assert served_per_replica("round_robin", mixed_workload(n=120)) == [40, 40, 40]


def test_least_loaded_spreads_load():
    assert served_per_replica("least_loaded", mixed_workload(n=120, arrival="all")) == [40, 40, 40]
    counts = served_per_replica("least_loaded", mixed_workload(n=120))
    assert min(counts) > 0.6 * max(counts)


def test_prefix_aware_sends_a_shared_first_block_to_one_replica_and_spreads_random_prompts():
    rng = random.Random(0)
    system_prompts = [[rng.randrange(100, 1000) for _ in range(16)] for _ in range(2)]
    prompts = [system_prompts[i % 2] + [rng.randrange(100, 1000) for _ in range(20)] for i in range(40)]
    shared = Cluster(**GPU, config=CONFIG, num_replicas=4, router="prefix_aware").simulate(
        Workload.from_token_ids(prompts, output_len=8, arrival=50.0))
    assert sorted(m.completed for m in shared.replicas.values() if m.completed) in ([20, 20], [40])
    assert all(count > 0 for count in served_per_replica("prefix_aware", mixed_workload(n=120)))


def test_one_colocated_replica_is_exactly_a_simulator():
    workload = mixed_workload(n=60)
    cluster = Cluster(**GPU, config=CONFIG).run(workload)
    single = Simulator(**GPU, config=CONFIG).run(workload)
    assert repr(cluster.to_dict()) == repr(single.to_dict())


def test_cluster_runs_are_deterministic():
    def run():
        return Cluster(**GPU, config=CONFIG, num_prefill_replicas=1, num_decode_replicas=2,
                       router="least_loaded").run(mixed_workload(seed=4))
    assert repr(run().to_dict()) == repr(run().to_dict())


def test_bad_cluster_shapes_are_refused():
    with pytest.raises(ValueError, match="router"):
        Cluster(**GPU, router="random")
    with pytest.raises(ValueError, match="disaggregation"):
        Cluster(**GPU, num_prefill_replicas=1)
    with pytest.raises(ValueError, match="disaggregation"):
        Cluster(**GPU, num_replicas=2, num_prefill_replicas=1, num_decode_replicas=1)


# ---- prefill/decode disaggregation ----

def test_disaggregated_requests_produce_all_their_tokens():
    workload = mixed_workload(n=120)
    colocated = Cluster(**GPU, config=CONFIG, num_replicas=2).run(workload)
    run = Cluster(**GPU, config=CONFIG, num_prefill_replicas=1, num_decode_replicas=1).simulate(workload)
    for metrics in (colocated, run.metrics):
        assert metrics.completed == len(workload) and metrics.failed == 0
        assert metrics.total_output_tokens == workload.total_output_tokens
        assert metrics.total_input_tokens == sum(r.prompt_len for r in workload.requests)
    # the prefill replica ran every prompt for one (discarded) token; the decode replica made all outputs
    assert run.replicas["prefill0"].total_output_tokens == len(workload)
    assert run.replicas["decode0"].total_output_tokens == workload.total_output_tokens


def test_ttft_of_a_lone_request_is_prefill_plus_transfer_plus_one_decode_step():
    prompt_len = 300
    workload = Workload.synthetic(1, prompt_len, 5, seed=0)
    cluster = Cluster(**GPU, config=CONFIG, num_prefill_replicas=1, num_decode_replicas=1,
                      kv_link_bandwidth=10e9, kv_link_latency_s=1e-4)
    cost = cluster.simulator.cost_model
    expected = (cost.step_time(BatchShape((prompt_len,), (0,)))
                + 1e-4 + prompt_len * cost.arch.kv_bytes_per_token(2) / 10e9
                + cost.step_time(BatchShape((1,), (prompt_len - 1,))))
    assert math.isclose(cluster.run(workload).mean_ttft_ms / 1000, expected, rel_tol=1e-9)


def test_kv_link_bandwidth_moves_ttft_monotonically():
    workload = mixed_workload(n=80, arrival=20.0)
    ttfts = [Cluster(**GPU, config=CONFIG, num_prefill_replicas=1, num_decode_replicas=1,
                     kv_link_bandwidth=bandwidth).run(workload).mean_ttft_ms
             for bandwidth in (0.5e9, 2e9, 8e9, 32e9)]
    assert ttfts == sorted(ttfts, reverse=True) and len(set(ttfts)) == len(ttfts)
    colocated = Cluster(**GPU, config=CONFIG, num_replicas=2).run(workload).mean_ttft_ms
    assert ttfts[0] > colocated  # a slow link costs more TTFT than disaggregation saves here


# A value for every field of `Request`, none of them its default, so a copy that drops a field shows. A
# field added to Request makes the first assert of the test below fail until it gets a value here.
EVERY_FIELD = dict(
    request_id="r7", prompt_token_ids=[5, 6, 7, 8, 9], max_tokens=9, arrival_time=1.5,
    eos_token_ids=frozenset({2}), stop_token_ids=frozenset({3}), ignore_eos=True, min_tokens=2, tenant="alice",
    cache_salt="salt", user="a label", priority=-2, sampling_params="opaque to the core",
    # serving state, as if some replica had already served the request for a while
    output_token_ids=[11], num_computed_tokens=4, status=RequestStatus.RUNNING, num_preemptions=1,
    num_cached_tokens=3, block_hashes=[b"hash"], first_scheduled_time=2.0, first_token_time=2.5,
    token_times=[2.5], finish_time=3.0, spec_token_ids=[12])


def test_disaggregation_carries_every_field_but_the_serving_state():
    names = [f.name for f in dataclasses.fields(Request)]
    assert sorted(EVERY_FIELD) == sorted(names)
    fresh = Request("fresh", [1], 1)
    original = Request(**EVERY_FIELD)
    assert all(getattr(original, name) != getattr(fresh, name) for name in names if name != "request_id")

    def check(copy: Request, differences: dict[str, object]) -> None:
        """Each field as the original's, or fresh for the serving state, except the listed differences."""
        for name in names:
            default = getattr(fresh, name) if name in SERVING_STATE else EVERY_FIELD[name]
            assert getattr(copy, name) == differences.get(name, default), name

    prefill = prefill_request(original)
    check(prefill, {"max_tokens": 1})
    prefill.first_scheduled_time, prefill.num_preemptions, prefill.num_cached_tokens = 4.0, 2, 5  # as served
    decode = decode_request(original, prefill)
    check(decode, {"num_computed_tokens": 4, "first_scheduled_time": 4.0, "num_preemptions": 2,
                   "num_cached_tokens": 5})
    assert decode.output_token_ids is not prefill.output_token_ids is not original.output_token_ids


def test_disaggregation_keeps_tenants_and_cache_salts_apart():
    """Two requests with the same 64-token prompt, the second long after the first: it hits the prefill
    replica's cache only when it is sent by the same tenant with the same salt."""
    prompt = tuple(range(100, 164))

    def hits(tenant: str, cache_salt: str | None) -> tuple[int, int]:
        workload = Workload((WorkloadRequest(0.0, 64, 4, prompt, tenant="alice"),
                             WorkloadRequest(1.0, 64, 4, prompt, tenant=tenant, cache_salt=cache_salt)))
        run = Cluster(**GPU, config=CONFIG, num_prefill_replicas=1, num_decode_replicas=1).simulate(workload)
        assert run.metrics.completed == 2
        assert run.replicas["prefill0"].prefix_cache_hits == run.metrics.prefix_cache_hits  # end to end
        return run.metrics.prefix_cache_hits

    assert hits("alice", None) == 63  # every full block hit, the last token computed again
    assert hits("bob", None) == 0
    assert hits("alice", "another salt") == 0
