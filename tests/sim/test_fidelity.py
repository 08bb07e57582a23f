"""Fidelity: the simulator, calibrated on this machine, predicts the real engine on workloads it was not
calibrated on.

Three held-out workloads (all at once with mixed lengths, Poisson arrivals below capacity, long prompts),
each under static and continuous scheduling, run on the real engine (SmolLM2-135M, float32, this CPU) and
in the simulator with a profile calibrated at the start of this test module, on the grid of
sim/calibrate.py, so that calibration and measurement see the same machine.

Tolerance: 35%, widened by the engine's own run-to-run spread (the engine runs twice and the fastest run
is kept; when the two disagree by s%, no model can be judged closer than that). The goal is 20%. With the
small-batch terms of the calibrated profile (decode time concave in batch size, as a CPU's is), a quiet run
met 20% on every case (benchmarks/RESULTS.md); the linear form it replaced failed 35% once in a clean-clone
run. The tolerance stays at 35% until several runs on this drifting VM show 20% holds; 35% still catches a
broken cost model or executor, which is off by far more.

Where arrivals do not depend on timing (all at once), the shared core must also make identical decisions
on both sides: same steps, same batch shapes, same preemptions, same prefix-cache hits.

A fourth workload checks prefix caching: eight requests sharing a 512-token prefix, after a warm-up
request put it in the cache; the simulated warm-prefix TTFT must meet the same tolerance.
"""

from __future__ import annotations

import pytest

from ref_engine.core import EngineConfig, Workload
from sim.experiments import Sides, run_pair, same_policy

TOLERANCE_PCT = 35.0  # the goal is 20%: see the module docstring for why the test still allows more

HELD_OUT = {
    "mixed-all-at-once": Workload.synthetic(16, prompt_len=(32, 256), output_len=(16, 64), seed=11),
    # ~60% of the static scheduler's capacity: a static batch rarely has a queue behind it. (Static batching
    # near capacity is chaotic: whether a request just makes or just misses a batch moves its TTFT by a
    # whole batch, so a few milliseconds of timing error become seconds of TTFT; lesson 1 shows it.)
    "poisson-below-capacity": Workload.synthetic(10, prompt_len=(32, 128), output_len=(8, 32), arrival=0.6,
                                                 seed=12),
    "long-prompts": Workload.synthetic(6, prompt_len=(600, 1000), output_len=(8, 24), seed=13),
}


@pytest.fixture(scope="module")
def sides(smollm2):
    from sim.calibrate import calibrate

    return Sides(model=smollm2, hardware=calibrate(smollm2, verbose=False), repeats=2)


@pytest.mark.slow
@pytest.mark.parametrize("scheduling", ["continuous", "static"])
@pytest.mark.parametrize("name", list(HELD_OUT))
def test_simulator_predicts_the_engine(name, scheduling, sides):
    workload = HELD_OUT[name]
    config = EngineConfig(max_num_seqs=8, max_num_batched_tokens=512, num_kv_blocks=600, scheduling=scheduling)
    measured, simulated = run_pair(workload, config, sides, name=name, scheduling=scheduling)
    assert measured["completed"] == simulated["completed"] == len(workload)
    assert measured["total_output_tokens"] == simulated["total_output_tokens"] == workload.total_output_tokens
    if workload.requests[-1].arrival_time == 0:
        assert same_policy(measured["metrics"], simulated["metrics"])
    tolerance = TOLERANCE_PCT + measured["repeat_spread_pct"]
    for key in ("output_throughput", "mean_ttft_ms"):
        error = simulated[f"{key}_err_pct"]
        print(f"{name}/{scheduling} {key}: simulated {simulated[key]:.1f}, measured {measured[key]:.1f} "
              f"({error:+.1f}%, tolerance {tolerance:.1f}%)")
        assert abs(error) <= tolerance, (
            f"{name}/{scheduling}: simulated {key} {simulated[key]:.1f} vs measured {measured[key]:.1f} "
            f"({error:+.1f}%, tolerance {TOLERANCE_PCT}% + repeat spread {measured['repeat_spread_pct']:.1f}%)")


@pytest.mark.slow
def test_simulator_predicts_warm_prefix_ttft(sides):
    workload = Workload.shared_prefix(1, 8, 512, 50, 8, seed=14)
    warmup = Workload.shared_prefix(1, 1, 512, 50, 1, seed=15, prefix_seed=14)
    config = EngineConfig(max_num_seqs=8, max_num_batched_tokens=1024, num_kv_blocks=600)
    measured, simulated = run_pair(workload, config, sides, warmup=warmup)
    assert same_policy(measured["metrics"], simulated["metrics"])
    assert measured["prefix_cache_hits"] == simulated["prefix_cache_hits"] == 8 * 512
    tolerance = TOLERANCE_PCT + measured["repeat_spread_pct"]
    error = simulated["mean_ttft_ms_err_pct"]
    print(f"warm prefix TTFT: simulated {simulated['mean_ttft_ms']:.1f}, measured {measured['mean_ttft_ms']:.1f} "
          f"({error:+.1f}%, tolerance {tolerance:.1f}%)")
    assert abs(error) <= tolerance
