"""Fidelity: the simulator, calibrated on this machine, predicts the real engine on workloads it was not
calibrated on.

Three held-out workloads (all at once with mixed lengths, Poisson arrivals below capacity, long prompts),
each under static and continuous scheduling, run on the real engine (SmolLM2-135M, float32, this CPU) and
in the simulator with this machine's calibrated profile (`load_or_calibrate`: the saved one, or a fresh
calibration on the grid of sim/calibrate.py). Tolerance: simulated output throughput and mean TTFT within
20% of measured (the issue's bound; benchmarks/RESULTS.md records the actual errors). The engine side
keeps the fastest of two runs, since other processes on a shared machine only ever slow a run down.

Where arrivals do not depend on timing (all at once), the shared core must also make identical decisions
on both sides: same steps, same batch shapes, same preemptions.
"""

from __future__ import annotations

import pytest

from ref_engine.core import EngineConfig, Workload
from sim.experiments import Sides, run_pair, same_policy

TOLERANCE_PCT = 20.0

HELD_OUT = {
    "mixed-all-at-once": Workload.synthetic(16, prompt_len=(32, 256), output_len=(16, 64), seed=11),
    "poisson-below-capacity": Workload.synthetic(12, prompt_len=(32, 256), output_len=(16, 64), arrival=0.7,
                                                 seed=12),
    "long-prompts": Workload.synthetic(6, prompt_len=(600, 1000), output_len=(8, 24), seed=13),
}


@pytest.fixture(scope="module")
def sides(smollm2):
    from sim.calibrate import load_or_calibrate

    return Sides(model=smollm2, hardware=load_or_calibrate(smollm2), repeats=2)


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
    for key in ("output_throughput", "mean_ttft_ms"):
        error = simulated[f"{key}_err_pct"]
        assert abs(error) <= TOLERANCE_PCT, (
            f"{name}/{scheduling}: simulated {key} {simulated[key]:.1f} vs measured {measured[key]:.1f} "
            f"({error:+.1f}%, tolerance {TOLERANCE_PCT}%)")
