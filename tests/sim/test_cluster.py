"""Tests of the simulated cluster: routers spread load, a one-replica cluster is a Simulator, and
prefill/decode disaggregation produces every token with the KV transfer inside TTFT."""

from __future__ import annotations

import math
import random

import pytest

from ref_engine.core import EngineConfig, Exponential, Workload
from sim import Cluster, Simulator
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
