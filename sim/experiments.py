"""Every lesson experiment, once: the same workload through the simulator and the real engine, as a table.

Each function returns a list of rows (plain dicts, one per configuration and side) that a notebook prints,
plots and asserts on. The columns are `RunMetrics` fields plus `side` ("measured" | "simulated") and, on
simulated rows, `*_err_pct`: the simulated number's error relative to the measured one. The engine is only
imported when a measured side is asked for, so simulator-only sweeps run without torch.

Rule of the house (shared/CURRICULUM.md): numbers the shared core decides (steps, batch composition,
preemptions) must be identical on both sides for workloads whose arrivals do not depend on timing; only
times may differ, and every table shows by how much.

Lesson: lessons/01-continuous-batching.md (experiment protocol); lessons/02-paged-attention.md.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ref_engine.core.config import EngineConfig
from ref_engine.core.metrics import RunMetrics, relative_error
from ref_engine.core.workload import Exponential, Workload
from sim.hardware import HardwareProfile
from sim.simulator import Simulator

COMPARED = ("output_throughput", "mean_ttft_ms", "mean_itl_ms", "mean_e2el_ms", "duration")
POLICY_COUNTS = ("num_steps", "num_preemptions", "completed")


@dataclass(frozen=True)
class Sides:
    """Which model the engine serves and which profile the simulator prices it with.

    `model`: a `LoadedModel` (or None to load the default), used only for measured rows; `hardware`: a
    profile or name (None: this machine's calibrated profile); `measure=False` skips the engine."""

    model: Any = None
    hardware: HardwareProfile | str | None = None
    measure: bool = True
    repeats: int = 1


def run_pair(workload: Workload, config: EngineConfig, sides: Sides, **labels: Any) -> list[dict[str, Any]]:
    """Run one workload and config on both sides; returns [measured row, simulated row] (or just simulated).

    The engine runs `sides.repeats` times and the fastest run is kept, as calibration keeps the fastest
    step: on a shared machine other processes only ever slow a run down."""
    simulated = Simulator(hardware=sides.hardware, config=config).run(workload)
    rows = []
    measured = None
    if sides.measure:
        from ref_engine import bench

        runs = [bench.run(workload, config, model=sides.model) for _ in range(sides.repeats)]
        measured = min(runs, key=lambda m: m.duration)
        rows.append(_row(measured, "measured", labels))
    rows.append(_row(simulated, "simulated", labels, reference=measured))
    return rows


def _row(metrics: RunMetrics, side: str, labels: dict[str, Any], reference: RunMetrics | None = None
         ) -> dict[str, Any]:
    row = {**labels, "side": side, **metrics.to_dict(), "metrics": metrics}
    if reference is not None:
        for key in COMPARED:
            row[f"{key}_err_pct"] = relative_error(getattr(metrics, key), getattr(reference, key))
    return row


def pairs(rows: Iterable[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(measured, simulated) row pairs, in order."""
    rows = list(rows)
    return [(m, s) for m, s in zip(rows, rows[1:]) if m["side"] == "measured" and s["side"] == "simulated"]


def same_policy(measured: RunMetrics, simulated: RunMetrics) -> bool:
    """True when the shared core made the same decisions on both sides: same steps, same batch shapes in
    the same order, same preemptions. Holds whenever arrivals do not depend on timing (all at once)."""
    return (all(getattr(measured, k) == getattr(simulated, k) for k in POLICY_COUNTS)
            and [(s.query_lens, s.context_lens) for s in measured.steps]
            == [(s.query_lens, s.context_lens) for s in simulated.steps])


# ---- lesson 1: static vs continuous batching ----


def static_vs_continuous(caps: Iterable[int], sides: Sides, *, num_requests: int = 16, prompt_len: int = 64,
                         mean_output: int = 32, max_num_seqs: int = 8, seed: int = 0) -> list[dict[str, Any]]:
    """Fixed prompts, exponential output lengths (mean `mean_output`) capped at each cap, all at once; both
    schedulers. The continuous/static ratio grows with the spread of output lengths (Anyscale, Orca)."""
    rows = []
    for cap in caps:
        workload = Workload.synthetic(num_requests, prompt_len=prompt_len, output_len=Exponential(mean_output, cap),
                                      seed=seed, name=f"exp-{mean_output}-cap-{cap}")
        for scheduling in ("static", "continuous"):
            config = EngineConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max(512, prompt_len * max_num_seqs),
                                  num_kv_blocks=max_num_seqs * -(-(prompt_len + cap) // 16) + 16,
                                  scheduling=scheduling)
            rows += run_pair(workload, config, sides, cap=cap, scheduling=scheduling)
    return rows


def load_sweep(rates: Iterable[float], sides: Sides, *, num_requests: int = 24, prompt_len: tuple[int, int] = (32, 128),
               output_len: tuple[int, int] = (16, 48), scheduling: str = "continuous", max_num_seqs: int = 8,
               seed: int = 0) -> list[dict[str, Any]]:
    """Poisson arrivals at rising rates: latency is flat, then climbs steeply at capacity."""
    rows = []
    for rate in rates:
        workload = Workload.synthetic(num_requests, prompt_len=prompt_len, output_len=output_len, arrival=rate,
                                      seed=seed, name=f"poisson-{rate}")
        config = EngineConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=512, num_kv_blocks=512,
                              scheduling=scheduling)
        rows += run_pair(workload, config, sides, rate=rate, scheduling=scheduling)
    return rows
