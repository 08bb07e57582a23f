"""Streamed runs (`streaming=True`): the same `RunMetrics` as kept runs, to the last bit, on one replica and on
fleets, with preemption and speculation; the pooled inter-token gaps counted exactly; and no `Request` kept
once it has finished, which is what lets memory stay flat as the requests grow."""

from __future__ import annotations

import dataclasses
import math
import random
import weakref
from array import array
from collections import Counter

import pytest
import simpy

from core import EngineConfig, Exponential, Request, Workload
from core.metrics import RunMetrics, latency_summary
from core.metrics_stream import InterTokenGaps, counted_latency_summary, values_at
from sim import Cluster, Simulator
from sim.autoscaler import Autoscaler
from sim.executor import feed_arrivals
from sim.spec_decode import AcceptanceRate

GPU = dict(model="llama-3.1-8b", hardware="h100-sxm")
CONFIG = EngineConfig(max_num_seqs=32, max_num_batched_tokens=1024)


def workload(n: int = 80, seed: int = 0) -> Workload:
    return Workload.synthetic(n, (16, 500), Exponential(64, 256), arrival=30.0, seed=seed).with_tenant_mix(
        {"a": 2, "b": 1})


def assert_same(kept: RunMetrics, streamed: RunMetrics, *, same_order: bool = True) -> None:
    """Every field equal (nan equal to nan), rows equal but for the token times a stream does not keep."""
    same = {k: v for k, v in kept.to_dict().items()
            if v == streamed.to_dict()[k] or (isinstance(v, float) and math.isnan(v) and math.isnan(streamed.to_dict()[k]))}
    assert same == kept.to_dict()
    rows = [dataclasses.replace(row, token_times=None) for row in kept.requests]
    if not same_order:  # a disaggregated kept run lists requests as they finish, a stream by decode replica
        rows.sort(key=lambda row: int(row.request_id))
    assert rows == (list(streamed.requests) if same_order
                    else sorted(streamed.requests, key=lambda row: int(row.request_id)))
    assert kept.per_tenant == streamed.per_tenant and streamed.steps == [] and len(kept.steps) == kept.num_steps


@pytest.mark.parametrize("config", [
    CONFIG,
    EngineConfig(max_num_seqs=32, max_num_batched_tokens=512, num_kv_blocks=120),  # chunks and preemptions
    EngineConfig(max_num_seqs=32, num_kv_blocks=120, preemption_mode="swap", num_swap_blocks=60),
], ids=["plain", "recompute", "swap"])
def test_one_replica_streams_the_numbers_it_keeps(config: EngineConfig) -> None:
    simulator = Simulator(config=config, **GPU)
    kept = simulator.run(workload())
    assert_same(kept, simulator.run(workload(), streaming=True))
    if config.num_kv_blocks:
        assert kept.num_preemptions > 0


def test_speculation_streams_its_counts_and_its_zero_gaps() -> None:
    config = EngineConfig(max_num_seqs=8, speculative_method="draft_model", speculative_model="self:4",
                          num_speculative_tokens=3, speculative_disable_by_batch_size=None)
    def simulator() -> Simulator:  # a fresh acceptance model: its draws go on from run to run
        return Simulator(config=config, acceptance=AcceptanceRate((0.7, 0.5, 0.3)), **GPU)

    kept = simulator().run(workload(30))
    assert kept.num_drafts > 0 and kept.median_itl_ms == 0.0  # several tokens in one step: zero gaps
    assert_same(kept, simulator().run(workload(30), streaming=True))


@pytest.mark.parametrize("fleet", [
    dict(num_replicas=3, router="least_loaded"),
    dict(num_replicas=3, router="prefix_aware"),
    dict(autoscaler=Autoscaler(target_concurrency=4, min_replicas=0, max_replicas=3, scale_down_delay_s=0.5,
                               interval_s=0.25)),
    dict(num_prefill_replicas=2, num_decode_replicas=2),
], ids=["least_loaded", "prefix_aware", "autoscaled", "disaggregated"])
def test_a_fleet_streams_the_numbers_it_keeps(fleet: dict) -> None:
    kept = Cluster(config=CONFIG, **GPU, **fleet).simulate(workload(120))
    streamed = Cluster(config=CONFIG, streaming=True, **GPU, **fleet).simulate(workload(120).with_lazy_prompts())
    assert_same(kept.metrics, streamed.metrics, same_order="num_decode_replicas" not in fleet)
    assert kept.gpu_seconds == streamed.gpu_seconds and kept.replicas.keys() == streamed.replicas.keys()
    for name, replica in kept.replicas.items():
        assert replica.to_dict().keys() == streamed.replicas[name].to_dict().keys()
        assert_same(replica, streamed.replicas[name], same_order="prefill" in name or "num_decode_replicas" not in fleet)


def test_a_streamed_run_lets_each_request_go_when_it_finishes() -> None:
    for streaming in (False, True):
        env = simpy.Environment()
        replica = Simulator(config=CONFIG, **GPU).make_executor(env, streaming=streaming)
        finished: list[weakref.ref[Request]] = []
        replica.on_finish = lambda request, finished=finished: finished.append(weakref.ref(request))
        env.process(feed_arrivals(env, workload(60).with_lazy_prompts().iter_requests(49152), replica.add_request))
        env.run()
        assert len(finished) == 60
        alive = [request for request in (ref() for ref in finished) if request is not None]  # no gc.collect()
        metrics = replica.metrics()
        assert metrics.completed == 60
        if streaming:  # freed by reference counts, but for those of the last step (the engine loop's locals)
            last = max(row.finish_time for row in metrics.requests)
            assert all(r.finish_time == last for r in alive)
        else:
            assert len(alive) == 60


def test_counted_gaps_give_the_summary_of_the_listed_gaps() -> None:
    rng = random.Random(0)
    values = [rng.choice([0.0, 0.0125, 1e-3 * rng.random(), 0.1, 0.1 + 1e-9, 2.5 * rng.random(), 40 * rng.random()])
              for _ in range(3001)]
    for n in (1, 2, 3, 10, 101, 2000, 3001):  # odd and even counts: the median's two forms
        counts = Counter(values[:n])
        summary = counted_latency_summary("itl", array("d", counts.keys()), array("q", counts.values()))
        assert summary == latency_summary("itl", values[:n])
    assert all(math.isnan(x) for x in counted_latency_summary("itl", array("d"), array("q")).values())


def test_values_at_ranks_of_a_multiset() -> None:
    rng = random.Random(1)
    for _ in range(50):
        counts = Counter({rng.choice([rng.random(), rng.randint(0, 3) / 7, 1e3 * rng.random()]): rng.randint(1, 9)
                          for _ in range(rng.randint(1, 300))})
        flat = sorted(counts.elements())
        ranks = {rng.randrange(len(flat)) for _ in range(6)}
        assert values_at(array("d", counts.keys()), array("q", counts.values()), ranks) == {r: flat[r] for r in ranks}


def test_gaps_on_consecutive_steps_are_counted_as_a_run_others_one_by_one() -> None:
    gaps = InterTokenGaps()
    for end in (0.1, 0.25, 0.3, 0.7):
        gaps.step(end)
    gaps.add([0.25, 0.3, 0.7])  # one token in each of the last three steps: a run
    gaps.add([0.1, 0.7])  # the steps between skipped: counted one by one
    gaps.add([0.7, 0.7])  # two tokens in one step
    gaps.add([0.7])  # one token: no gap
    values, counts = gaps.counted()
    assert Counter(dict(zip(values, counts))) == {0.3 - 0.25: 1, 0.7 - 0.3: 1, 0.7 - 0.1: 1, 0.0: 1}
    assert not gaps._others.keys() & {0.3 - 0.25, 0.7 - 0.3}
