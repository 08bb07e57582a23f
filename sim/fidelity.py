"""Fidelity: how well the simulator, calibrated on this machine, predicts the real engine on workloads it was
not calibrated on. The fidelity test (tests/sim/test_fidelity.py) asserts on these comparisons and the
benchmark (benchmarks/fidelity.py) tabulates them.

Re-anchoring. A shared VM runs tens of percent faster or slower from one minute to the next (one run saw
the machine 14-22% slower than during its calibration five minutes earlier, which made every case 18-29%
"wrong"). So right before each comparison the calibration grid's drift probe (two short grid runs) is timed
again and the profile is retimed by how much the machine's speed moved (`sim.calibrate.reanchored`). The
probe is not the workload being judged, so this corrects for the machine without absorbing the cost
model's errors. Both errors are kept: re-anchored and unanchored.

What no model can beat, per comparison:
- the engine's own run-to-run spread: it runs `repeats` times and the fastest run is kept; when the runs
  disagree by s%, no prediction can be judged closer than that;
- the metric's timing sensitivity: how far the *simulated* value moves, beyond the nudge itself, when every
  step is 5% faster or slower. It is ~0 for smooth workloads. Under static batching with Poisson arrivals
  one request just making or just missing a batch moves its TTFT by a whole batch (lesson 1 shows it), so
  a step-time error below the machine's noise moves mean TTFT by 10-25%.

Lesson: lessons/01-continuous-batching.md (measuring both sides).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ref_engine.core.config import EngineConfig
from ref_engine.core.metrics import relative_error
from ref_engine.core.workload import Workload
from sim.experiments import Sides, run_pair
from sim.hardware import HardwareProfile

# Held out from calibration: all at once with mixed lengths, Poisson arrivals at ~60% of the static
# scheduler's capacity (where a static batch rarely has a queue behind it), and long prompts.
HELD_OUT: dict[str, Workload] = {
    "mixed-all-at-once": Workload.synthetic(16, prompt_len=(32, 256), output_len=(16, 64), seed=11),
    "poisson-below-capacity": Workload.synthetic(10, prompt_len=(32, 128), output_len=(8, 32), arrival=0.6,
                                                 seed=12),
    "long-prompts": Workload.synthetic(6, prompt_len=(600, 1000), output_len=(8, 24), seed=13),
}
HELD_OUT_CONFIG = EngineConfig(max_num_seqs=8, max_num_batched_tokens=512, num_kv_blocks=600)
TIMING_NUDGE = 0.05


@dataclass
class Comparison:
    """One workload and config, measured and simulated (with the profile re-anchored to the machine's speed
    at that moment); `measured` and `simulated` are `run_pair` rows."""

    name: str
    measured: dict[str, Any]
    simulated: dict[str, Any]
    unanchored: dict[str, Any]  # the simulated row priced with the profile as calibrated
    time_factor: float  # how much slower the machine ran than at calibration (the retiming)
    sensitivity_pct: dict[str, float]  # per metric, see the module docstring

    def error_pct(self, key: str) -> float:
        return self.simulated[f"{key}_err_pct"]

    def unanchored_error_pct(self, key: str) -> float:
        return relative_error(self.unanchored[key], self.measured[key])

    def allowance_pct(self, key: str) -> float:
        """What no model can beat here: the engine's repeat spread plus the metric's timing sensitivity."""
        return self.measured["repeat_spread_pct"] + self.sensitivity_pct[key]

    def describe(self, key: str) -> str:
        return (f"{self.name} {key}: measured {self.measured[key]:.1f}, simulated {self.simulated[key]:.1f} "
                f"({self.error_pct(key):+.1f}%; machine x{self.time_factor:.2f} time, "
                f"{self.unanchored_error_pct(key):+.1f}% unanchored; repeat spread "
                f"{self.measured['repeat_spread_pct']:.1f}%, timing sensitivity {self.sensitivity_pct[key]:.1f}%)")


def timing_sensitivity(workload: Workload, config: EngineConfig, sides: Sides, keys: tuple[str, ...], *,
                       warmup: Workload | None = None, nudge: float = TIMING_NUDGE) -> dict[str, float]:
    """Per metric, how far the simulated value moves beyond `nudge` (in %) when every step is `nudge`
    faster or slower."""
    simulate_only = replace(sides, measure=False)
    base = run_pair(workload, config, simulate_only, warmup=warmup)[0]
    moved = dict.fromkeys(keys, 0.0)
    for factor in (1 - nudge, 1 + nudge):
        row = run_pair(workload, config, replace(simulate_only, hardware=sides.hardware.retimed(factor)),
                       warmup=warmup)[0]
        for key in keys:
            moved[key] = max(moved[key], abs(relative_error(row[key], base[key])) - 100 * nudge)
    return moved


def compare(name: str, workload: Workload, config: EngineConfig, model: Any, calibrated: HardwareProfile, *,
            warmup: Workload | None = None, repeats: int = 2,
            keys: tuple[str, ...] = ("output_throughput", "mean_ttft_ms", "mean_itl_ms")) -> Comparison:
    """Re-anchor `calibrated` to the machine's speed now, then measure (`model`: a `LoadedModel`) and
    simulate `workload` under `config`."""
    from sim.calibrate import reanchored

    sides = Sides(model=model, hardware=reanchored(calibrated, model), repeats=repeats)
    measured, simulated = run_pair(workload, config, sides, warmup=warmup)
    unanchored = run_pair(workload, config, replace(sides, hardware=calibrated, measure=False), warmup=warmup)[0]
    return Comparison(name, measured, simulated, unanchored, sides.hardware.provenance["time_factor"],
                      timing_sensitivity(workload, config, sides, keys, warmup=warmup))


def ranks(values: list[float]) -> list[int]:
    """1 for the largest value, 2 for the next, ..."""
    order = sorted(range(len(values)), key=lambda i: -values[i])
    result = [0] * len(values)
    for rank, i in enumerate(order, start=1):
        result[i] = rank
    return result
