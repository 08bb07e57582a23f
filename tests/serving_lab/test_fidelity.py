"""Fidelity: the simulator, calibrated on this machine, predicts the real engine on workloads it was not
calibrated on (the issue's test; serving_lab/fidelity.py has the method, benchmarks/fidelity.py the numbers).

Three held-out workloads (all at once with mixed lengths, Poisson arrivals below capacity, long prompts),
each under static and continuous scheduling (by default only the first under continuous, see CASES), run
on the real engine (SmolLM2-135M, float32, this CPU) and
in the simulator with this machine's calibrated profile, as the notebooks get it (`load_or_calibrate`: the
saved profile while it was fitted on a steady machine and the drift probe still agrees with it, else a fresh
calibration on the grid of serving_lab/calibrate.py, saved for the notebooks that follow, so a test run pays
for one calibration, not two). The drift probe is timed before and after each case (serving_lab/fidelity.py).

Tolerance: 20% on output throughput and mean TTFT (the issue's), widened only by what no model can beat in
that case: the engine's run-to-run spread and the metric's timing sensitivity (both printed; the
sensitivity is ~0 except for static batching under Poisson arrivals). A case during which the machine was
not in its calibrated state (a probe more than 10% off its calibration time) cannot be judged that finely:
it is held to 35% instead, and the reason printed; a broken cost model or executor is off by far more.
If the calibration itself ran on a busy machine (`unsteady_fit`: its repeats disagreed or its threads
waited for a core), the cases are skipped with that reason: the fit describes the load, not the machine.
A case that misses is measured once more, and fails only if it misses again: machine noise seldom strikes
twice in a row, while an error of the cost model reproduces every time.

Where arrivals do not depend on timing (all at once), the shared core must also make identical decisions
on both sides: same steps, same batch shapes, same preemptions, same prefix-cache hits.

A fourth workload checks prefix caching: eight requests sharing a 512-token prefix, after a warm-up
request put it in the cache; the simulated warm-prefix TTFT must meet the same tolerance.
"""

from __future__ import annotations

import pytest

from core import EngineConfig, Workload
from serving_lab.fidelity import (
    HELD_OUT,
    HELD_OUT_CONFIG,
    WARM_PREFIX,
    WARM_PREFIX_CONFIG,
    WARM_PREFIX_WARMUP,
    Comparison,
    compare,
    ranks,
    timing_sensitivity,
)
from serving_lab.pairing import Sides, same_policy
from sim.hardware import HardwareProfile

TOLERANCE_PCT = 20.0  # the issue's, for a case during which the machine kept one speed
UNSTEADY_TOLERANCE_PCT = 35.0  # otherwise; a broken cost model or executor is off by far more


@pytest.fixture(scope="module")
def calibrated(smollm2):
    from serving_lab.calibrate import load_or_calibrate, unsteady_fit

    profile = load_or_calibrate(smollm2)
    unsteady = unsteady_fit(profile)
    if unsteady:  # every comparison would measure the load, not the simulator
        pytest.skip(f"machine unsteady: {unsteady}")
    return profile


def misses(comparison: Comparison, keys: tuple[str, ...]) -> list[str]:
    """The metrics outside tolerance (each printed, with the tolerance it was held to)."""
    base = UNSTEADY_TOLERANCE_PCT if comparison.unsteady else TOLERANCE_PCT
    if comparison.unsteady:
        print(f"{comparison.name}: judged at {base:g}%, not {TOLERANCE_PCT:g}%: {comparison.unsteady}")
    missed = []
    for key in keys:
        tolerance = base + comparison.allowance_pct(key)
        print(f"{comparison.describe(key)}, tolerance {tolerance:.1f}%")
        if not abs(comparison.error_pct(key)) <= tolerance:
            missed.append(f"{comparison.describe(key)}: tolerance {tolerance:.1f}%")
    return missed


def judged(name: str, workload: Workload, config: EngineConfig, smollm2, calibrated, keys: tuple[str, ...],
           warmup: Workload | None = None) -> Comparison:
    """Compare, and compare once more if a metric missed: machine noise seldom strikes twice in a row, a
    cost-model error always reproduces. Fails if both attempts miss."""
    first = compare(name, workload, config, smollm2, calibrated, warmup=warmup)
    if not misses(first, keys):
        return first
    print(f"{name}: missed once; measuring again")
    second = compare(name, workload, config, smollm2, calibrated, warmup=warmup)
    missed = misses(second, keys)
    assert not missed, missed
    return second


# The default run judges one case, the all-at-once workload under continuous batching (where the shared
# core's decisions must also match); the other five (~40-75 s each) run with SERVING_LAB_LONG_TESTS=1. The
# notebooks compare their kinds on every run, error printed: lesson 1 static against continuous (same
# decisions, asserted) and a Poisson load sweep, lesson 3 long prompts.
DEFAULT_CASE = ("mixed-all-at-once", "continuous")
CASES = [pytest.param(name, scheduling, marks=() if (name, scheduling) == DEFAULT_CASE else pytest.mark.long,
                      id=f"{name}-{scheduling}")
         for name in HELD_OUT for scheduling in ("continuous", "static")]


@pytest.mark.slow
@pytest.mark.parametrize("name, scheduling", CASES)
def test_simulator_predicts_the_engine(name, scheduling, smollm2, calibrated):
    workload = HELD_OUT[name]
    config = HELD_OUT_CONFIG.replace(scheduling=scheduling)
    comparison = judged(f"{name}/{scheduling}", workload, config, smollm2, calibrated,
                        ("output_throughput", "mean_ttft_ms"))
    measured, simulated = comparison.measured, comparison.simulated
    assert measured["completed"] == simulated["completed"] == len(workload)
    assert measured["total_output_tokens"] == simulated["total_output_tokens"] == workload.total_output_tokens
    if workload.requests[-1].arrival_time == 0:
        assert same_policy(measured["metrics"], simulated["metrics"])


@pytest.mark.slow
def test_simulator_predicts_warm_prefix_ttft(smollm2, calibrated):
    comparison = judged("warm prefix", WARM_PREFIX, WARM_PREFIX_CONFIG, smollm2, calibrated, ("mean_ttft_ms",),
                        warmup=WARM_PREFIX_WARMUP)
    assert same_policy(comparison.measured["metrics"], comparison.simulated["metrics"])
    assert comparison.measured["prefix_cache_hits"] == comparison.simulated["prefix_cache_hits"] == 8 * 512


def test_timing_sensitivity_is_zero_when_nothing_waits_on_timing():
    """All at once, every simulated time scales with the steps: nothing moves beyond the nudge itself."""
    sides = Sides(hardware=HardwareProfile.named("local-cpu"), measure=False)
    moved = timing_sensitivity(HELD_OUT["mixed-all-at-once"], HELD_OUT_CONFIG, sides,
                               ("output_throughput", "mean_ttft_ms"))
    assert moved["mean_ttft_ms"] == pytest.approx(0.0, abs=1e-6)
    assert moved["output_throughput"] <= 0.3  # 1 / 0.95 - 1 is 5.26%: a hair beyond the nudge


def test_ranks_put_the_largest_first():
    assert ranks([3.0, 9.0, 1.0, 5.0]) == [3, 1, 4, 2]


@pytest.mark.parametrize("factors, reason", [
    ((1.05, 0.93), None),
    ((0.97, 0.87), "x0.97 / x0.87"),
    ((1.15, 1.02), "x1.15 / x1.02"),
])
def test_a_case_is_steady_only_while_the_machine_is_in_its_calibrated_state(factors, reason):
    comparison = Comparison("case", {}, {}, factors, {})
    if reason is None:
        assert comparison.unsteady is None
    else:
        assert reason in comparison.unsteady
