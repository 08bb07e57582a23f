"""Tests of the single-replica simulator: determinism, conservation, replay against the bare core, defaults,
and two qualitative results from the literature (Orca: continuous vs static; vLLM: paged vs reserving).

No timing asserts here: the simulator's speed is measured by benchmarks/sim_speed.py.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections import deque
from itertools import pairwise
from statistics import fmean

import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from core import EngineConfig, Exponential, RequestStatus, StepResult, Workload, make_scheduler
from core.arch_config import ArchConfig
from core.kv_sizing import CPU_KV_CACHE_MEMORY, num_kv_blocks
from sim import Simulator
from sim.cost_model import kv_cache_num_blocks
from sim.executor import ReplayTimer
from sim.hardware import HardwareProfile
from sim.simulator import SimulatorOptions, num_kv_blocks_for

SMALL = dict(model="smollm2-135m", hardware="local-cpu")


def small_workload(seed: int, n: int = 40) -> Workload:
    return Workload.synthetic(n, (8, 120), Exponential(24, 80, minimum=2), arrival=200.0, seed=seed)


# ---- determinism ----

def test_same_seed_gives_identical_metrics_to_the_last_digit():
    config = EngineConfig(max_num_seqs=8, max_num_batched_tokens=64)
    runs = [Simulator(**SMALL, config=config, num_kv_blocks=40).run(small_workload(seed=7)) for _ in range(2)]
    assert repr(runs[0].to_dict()) == repr(runs[1].to_dict())
    assert runs[0].steps == runs[1].steps


@pytest.mark.parametrize("enabled", [True, False])
def test_a_run_pauses_the_garbage_collector_and_gives_it_back_as_it_was(enabled):
    import gc

    seen = []

    class Watching(ReplayTimer):
        def step_time(self, output):
            seen.append(gc.isenabled())
            return 0.01

    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        Simulator(**SMALL, config=EngineConfig(max_num_seqs=8), step_timer=Watching([])).run(small_workload(seed=3, n=4))
        assert seen and not any(seen)  # off during every step
        assert gc.isenabled() is enabled  # restored
    finally:
        (gc.enable if was else gc.disable)()


def test_different_seeds_give_different_metrics():
    simulator = Simulator(**SMALL, config=EngineConfig(max_num_seqs=8, max_num_batched_tokens=64))
    assert simulator.run(small_workload(seed=1)).to_dict() != simulator.run(small_workload(seed=2)).to_dict()


# ---- conservation and invariants over random workloads ----

@st.composite
def scenarios(draw):
    block_size = draw(st.sampled_from([1, 4, 16]))
    max_model_len = draw(st.integers(16, 160))
    chunked = draw(st.booleans())
    budget = draw(st.integers(1, 96)) if chunked else draw(st.integers(max_model_len, max_model_len + 64))
    config = EngineConfig(
        block_size=block_size, max_num_seqs=draw(st.integers(1, 12)), max_num_batched_tokens=budget,
        max_model_len=max_model_len, enable_chunked_prefill=chunked,
        preemption_mode=draw(st.sampled_from(["recompute", "swap"])),
        # weighted towards the combination that can preempt: continuous and paged
        scheduling=draw(st.sampled_from(["continuous", "continuous", "continuous", "static"])),
        kv_allocation=draw(st.sampled_from(["paged", "paged", "paged", "contiguous", "contiguous_exact"])),
        enable_prefix_caching=draw(st.booleans()),
    )
    blocks_for_one_max_length_request = -(-max_model_len // block_size)
    num_kv_blocks = draw(st.integers(max(1, blocks_for_one_max_length_request // 2),
                                     2 * blocks_for_one_max_length_request))
    arrival = draw(st.sampled_from(["all", "all", 500.0, 5.0]))
    workload = Workload.synthetic(
        draw(st.integers(1, 30)), prompt_len=(1, draw(st.integers(1, max_model_len + 8))),
        output_len=Exponential(draw(st.sampled_from([8.0, 32.0, 64.0])), cap=draw(st.integers(1, 128))),
        arrival=arrival, seed=draw(st.integers(0, 2**16)))
    return config, num_kv_blocks, workload


@settings(max_examples=100, deadline=None)
@given(scenarios())
def test_every_request_finishes_or_is_refused_and_invariants_hold(scenario):
    config, num_kv_blocks, workload = scenario
    simulator = Simulator(**SMALL, config=config, num_kv_blocks=num_kv_blocks)
    env = simpy.Environment()
    executor = simulator.make_executor(env)
    env.process(executor.feed(workload.make_requests(simulator.arch.vocab_size)))
    env.run()
    metrics = executor.metrics()

    # conservation: every request finished (with exactly its max_tokens) or was refused
    assert executor.num_refused + len(executor.requests) == len(workload)
    assert metrics.completed + metrics.failed == len(workload)
    for request in executor.requests:
        assert request.status is RequestStatus.FINISHED_LENGTH
        assert request.num_output_tokens == request.max_tokens
        assert (request.arrival_time <= request.first_scheduled_time <= request.first_token_time
                <= request.finish_time)
    assert metrics.total_output_tokens == sum(r.num_output_tokens for r in executor.requests)
    if metrics.duration > 0:
        assert math.isclose(metrics.output_throughput * metrics.duration, metrics.total_output_tokens,
                            rel_tol=1e-12)

    # the KV pool is never overdrawn, and the budgets hold
    for step in metrics.steps:
        assert 0 <= step.kv_usage <= 1
        assert step.num_reserved_slots <= num_kv_blocks * config.block_size
        if not config.enable_prefix_caching:  # a block shared by k requests counts k times in the live tokens
            assert step.num_live_tokens <= step.num_reserved_slots
        assert step.num_tokens <= config.max_num_batched_tokens
        assert 1 <= step.num_seqs <= config.max_num_seqs
        assert step.duration > 0
    # simulated time only moves forward: a step starts no earlier than the previous one ended
    for before, after in pairwise(metrics.steps):
        assert after.start >= before.start + before.duration
        assert after.step_id == before.step_id + 1
    # quiescence: the pool is whole again
    assert executor.scheduler.kv_cache_manager.block_pool.num_free_blocks == num_kv_blocks


# ---- replay: the simulator adds a clock to the core, nothing else ----

def run_core_by_hand(config: EngineConfig, num_kv_blocks: int, workload: Workload, durations: list[float]):
    """The core scheduler in a plain loop: add what has arrived, schedule, let the step take its time."""
    scheduler = make_scheduler(config, num_kv_blocks)
    pending = deque(sorted(workload.make_requests(49152), key=lambda r: r.arrival_time))
    times = iter(durations)
    now, steps = 0.0, []
    while pending or scheduler.has_unfinished_requests():
        while pending and pending[0].arrival_time <= now:
            try:
                scheduler.add_request(pending.popleft())
            except ValueError:
                pass
        output = scheduler.schedule(now)
        if output.is_empty:
            now = pending[0].arrival_time  # idle until the next arrival
            continue
        start = now
        now += next(times)
        result = StepResult({s.request_id: [0] for s in output.scheduled if s.needs_logits})
        scheduler.update_from_output(output, result, now)
        steps.append((start, output.batch_shape, len(output.preempted_request_ids)))
    return steps, scheduler.num_preemptions


@pytest.mark.parametrize("scheduling, preemption_mode", [
    ("continuous", "recompute"), ("continuous", "swap"), ("static", "recompute")])
def test_replayed_step_times_reproduce_the_core_batch_by_batch(scheduling, preemption_mode):
    config = EngineConfig(block_size=4, max_num_seqs=6, max_num_batched_tokens=48, max_model_len=128,
                          scheduling=scheduling, preemption_mode=preemption_mode, num_swap_blocks=8)
    workload = Workload.synthetic(30, (4, 60), Exponential(20, 60), arrival=40.0, seed=11)
    rng = random.Random(3)
    durations = [rng.uniform(0.005, 0.05) for _ in range(5000)]
    num_kv_blocks = 40

    expected, expected_preemptions = run_core_by_hand(config, num_kv_blocks, workload, durations)
    metrics = Simulator(**SMALL, config=config, num_kv_blocks=num_kv_blocks,
                        step_timer=ReplayTimer(durations)).run(workload)

    assert [(s.query_lens, s.context_lens) for s in metrics.steps] == [shape for _, shape, _ in expected]
    assert [s.num_preempted for s in metrics.steps] == [n for _, _, n in expected]
    assert metrics.num_preemptions == expected_preemptions
    assert all(math.isclose(s.start, start, rel_tol=1e-12, abs_tol=1e-12)
               for s, (start, _, _) in zip(metrics.steps, expected, strict=True))
    if scheduling == "continuous":
        assert expected_preemptions > 0  # the pool is small enough that the replay covers preemption


def test_replay_timer_says_when_it_runs_out():
    simulator = Simulator(**SMALL, config=EngineConfig(), step_timer=ReplayTimer([0.01, 0.01]))
    with pytest.raises(RuntimeError, match="ran out of durations"):
        simulator.run(Workload.synthetic(2, 8, 8, seed=0))


# ---- defaults and pool sizing ----

def test_default_hardware_is_the_calibrated_profile_when_one_is_saved(monkeypatch, tmp_path):
    monkeypatch.setenv("SERVING_LAB_CACHE", str(tmp_path))
    calibrated = dataclasses.replace(HardwareProfile.named("local-cpu"), name="calibrated-cpu-float32",
                                     source="calibrated", provenance={"dtype": "float32"})
    calibrated.save()
    simulator = Simulator()
    assert simulator.hardware == calibrated
    assert simulator.dtype == "float32"  # a calibrated profile brings the dtype it was measured in


def test_default_hardware_falls_back_to_the_cpu_estimate_with_a_warning(monkeypatch, tmp_path):
    monkeypatch.setenv("SERVING_LAB_CACHE", str(tmp_path))
    with pytest.warns(UserWarning, match="no calibrated hardware profile"):
        simulator = Simulator()
    assert simulator.hardware.name == "local-cpu"
    assert simulator.arch.name == "SmolLM2-135M"


def test_kv_pool_size_comes_from_the_first_knob_that_is_set():
    per_block = Simulator(**SMALL).arch.kv_bytes_per_block(16, 2)
    assert per_block == Simulator(**SMALL).arch.kv_bytes_per_token(2) * 16
    by_memory = EngineConfig(kv_cache_memory=10 * per_block + 5)
    assert Simulator(**SMALL, config=by_memory).num_kv_blocks == 10
    assert Simulator(**SMALL, config=by_memory.replace(num_kv_blocks=7)).num_kv_blocks == 7
    assert Simulator(**SMALL, config=by_memory.replace(num_kv_blocks=7), num_kv_blocks=3).num_kv_blocks == 3
    profiled = Simulator("llama-3.1-8b", "h100-sxm", EngineConfig())
    assert profiled.num_kv_blocks == kv_cache_num_blocks(
        profiled.arch, profiled.hardware, "bfloat16", 16, max_num_batched_tokens=512, max_num_seqs=64)


def test_the_simulator_applies_the_rule_with_the_profile_memory_and_the_model_dims():
    arch = ArchConfig.named("llama-3.1-8b")
    h100 = HardwareProfile.named("h100-sxm")
    config = EngineConfig(gpu_memory_utilization=0.8)
    per_block = arch.kv_bytes_per_block(config.block_size, 2)
    assert num_kv_blocks_for(arch, h100, config) == num_kv_blocks(
        config, per_block, device_memory=h100.memory_bytes, weight_bytes=arch.weight_bytes(2),
        activation_bytes=arch.peak_activation_bytes(config.max_num_batched_tokens, config.max_num_seqs, 2))
    cpu = HardwareProfile.named("local-cpu")  # a CPU profile, like a real CPU, gets the fixed pool
    assert num_kv_blocks_for(arch, cpu, config) == CPU_KV_CACHE_MEMORY // per_block



# ---- qualitative reproduction of the literature (GPU profile, 7B-class model) ----

def throughput_ratio(workload: Workload) -> float:
    """Continuous over static output throughput, Llama-2-7B on an A100 profile."""
    def run(scheduling: str) -> float:
        config = EngineConfig(max_num_seqs=64, max_num_batched_tokens=4096, max_model_len=2048,
                              scheduling=scheduling)
        return Simulator("llama-2-7b", "a100-80gb-sxm", config).run(workload).output_throughput
    return run("continuous") / run("static")


def test_continuous_beats_static_by_a_margin_that_grows_with_output_length_variance():
    # Orca (OSDI'22) and the Anyscale blog (2023): equal at low variance, the gap grows with it.
    low_variance = throughput_ratio(Workload.synthetic(256, 128, Exponential(128, cap=32), seed=0))
    high_variance = throughput_ratio(Workload.synthetic(256, 128, Exponential(128, cap=512), seed=0))
    homogeneous = throughput_ratio(Workload.synthetic(256, 128, 128, seed=0))
    assert 1.0 <= low_variance < 1.25
    assert high_variance > low_variance + 0.5
    assert homogeneous < 1.1  # Orca Fig 11: with equal lengths the gap nearly closes


def test_reserving_max_length_wastes_most_kv_memory_and_paging_almost_none():
    # vLLM (SOSP'23) Fig 2: reserving allocators hold 20-38% live tokens; paging wastes under ~4%.
    workload = Workload.synthetic(256, 512, Exponential(128, cap=512), seed=0)

    def live_fraction(kv_allocation: str) -> float:
        config = EngineConfig(max_num_seqs=64, max_num_batched_tokens=4096, max_model_len=2048,
                              kv_allocation=kv_allocation)
        steps = Simulator("llama-2-7b", "a100-80gb-sxm", config, num_kv_blocks=2000).run(workload).steps
        return fmean(s.num_live_tokens / s.num_reserved_slots for s in steps)

    assert live_fraction("contiguous") < 0.5
    assert live_fraction("paged") > 0.95


# ---- the KV pool from device memory, KV dtype and gpu_memory_utilization (issue 15) ----------------------

TINY = ArchConfig(name="tiny", architecture="llama", num_layers=2, hidden_size=8, num_attention_heads=2,
                  num_kv_heads=1, head_dim=4, intermediate_size=16, vocab_size=32)


def _toy(memory_bytes: float) -> HardwareProfile:
    return HardwareProfile(name="toy", peak_flops={"bfloat16": 2e8, "fp8": 4e8}, memory_bandwidth=1e8,
                           memory_bytes=memory_bytes, interconnect_bandwidth=1e7)


def test_kv_pool_follows_memory_kv_dtype_and_utilization():
    # tiny: 1704 weights (3408 bytes in bf16); activations of a 10-token, 2-seq step: 10*88*2 + 2*32*4 = 2016;
    # a 4-token block of KV: 4 tokens x 2 layers x 1 head x 4 x 2 (K and V) x 2 bytes = 128 in bf16, 64 in fp8
    config = EngineConfig(block_size=4, max_num_batched_tokens=10, max_num_seqs=2, gpu_memory_utilization=0.5)
    def blocks(memory: float = 100_000, engine: EngineConfig = config, **kwargs: object) -> int:
        return Simulator(TINY, _toy(memory), engine, **kwargs).num_kv_blocks  # type: ignore[arg-type]
    assert blocks() == (50_000 - 3408 - 2016) // 128 == 348
    assert blocks(200_000) == (100_000 - 3408 - 2016) // 128
    assert blocks(kv_cache_dtype="fp8") == (50_000 - 3408 - 2016) // 64 == 696
    assert blocks(engine=dataclasses.replace(config, gpu_memory_utilization=0.8)) == (80_000 - 3408 - 2016) // 128 == 582
    # fp8 weights: the 2 layers' 1184 weights in 1 byte, embeddings, lm_head and norms (520) in 2; KV in fp8 too
    assert blocks(dtype="fp8") == (50_000 - (1184 + 520 * 2) - 2016) // 64 == 715
    # 2 pipeline stages: each device holds 1 of the 2 layers' KV and half the weights
    assert blocks(pipeline_parallel_size=2) == (50_000 - 1704 - 2016) // 64 == 723


def test_kv_pool_uses_the_devices_real_memory():
    h100 = HardwareProfile.named("h100-sxm")
    config = EngineConfig(max_num_seqs=256, max_num_batched_tokens=8192)
    arch = ArchConfig.named("llama-3.1-8b")
    activations = arch.peak_activation_bytes(8192, 256, 2)
    expected = int((0.9 * 81559 * 2**20 - arch.weight_bytes(2) - activations) // (16 * 128 * 1024))
    assert Simulator(arch, h100, config).num_kv_blocks == expected


def test_frontend_latency_adds_to_ttft_only():
    config = EngineConfig(block_size=4, max_num_seqs=2, max_num_batched_tokens=64, num_kv_blocks=64)
    workload = Workload.synthetic(1, 20, 8, seed=1)
    plain = Simulator(TINY, _toy(100_000), config).run(workload)
    served = Simulator(TINY, _toy(100_000), config, frontend_latency_s=0.05).run(workload)
    assert served.mean_ttft_ms == pytest.approx(plain.mean_ttft_ms + 50)
    assert served.mean_itl_ms == pytest.approx(plain.mean_itl_ms)


def test_options_beyond_model_hardware_and_config_are_one_dataclass():
    simulator = Simulator(TINY, _toy(100_000), EngineConfig(num_kv_blocks=64), tensor_parallel_size=2,
                          frontend_latency_s=0.01)
    assert simulator.options == SimulatorOptions(tensor_parallel_size=2, frontend_latency_s=0.01)
    with pytest.raises(TypeError, match="tensor_parallel"):
        Simulator(TINY, _toy(100_000), tensor_parallel=2)
    with pytest.raises(ValueError, match="frontend_latency_s"):
        SimulatorOptions(frontend_latency_s=-1.0)


def test_a_concurrency_cap_keeps_at_most_n_requests_running_or_waiting():
    workload = Workload.synthetic(24, 32, (4, 24), arrival=200.0, seed=3)
    simulator = Simulator(**SMALL)

    def most_open(run) -> int:  # requests between their (send) arrival and their finish, at each arrival
        rows = run.requests
        return max(sum(1 for o in rows if o.arrival_time <= r.arrival_time < o.finish_time) for r in rows)

    free, capped = simulator.run(workload), simulator.run(workload, max_concurrency=3)
    assert most_open(free) > 3 and most_open(capped) == 3
    assert capped.completed == 24 and capped.total_output_tokens == free.total_output_tokens
    assert capped.duration > free.duration
    with pytest.raises(ValueError, match="max_concurrency must be >= 1, got 0"):
        simulator.run(workload, max_concurrency=0)
