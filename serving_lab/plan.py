"""`serving-lab plan`: the fewest replicas (and the tensor-parallel degree) that serve a workload within SLOs,
and what a million output tokens costs on them.

This module owns capacity planning as a search over simulated fleets: for each tensor-parallel degree, grow
the fleet one replica at a time (`Cluster`, sim/cluster.py, behind a router) until at least `attainment` of
the requests meet both the TTFT and the TPOT target; a degree that cannot within `max_replicas` says so. The
plan is the candidate with the lowest dollars per hour (ties: fewer GPUs, then the lower degree); the others
are the runners-up, and the fleet one replica smaller than the plan is shown missing the SLO, so "fewest"
can be read off the table.

Prices are the user's (`usd_per_gpu_hour`); the cost per million output tokens is the fleet's whole bill
over the run (idle tails included) divided by the tokens it produced (`ClusterRun.cost_per_million_tokens`).

Lesson: lessons/07-tuning-knobs.md#from-one-replica-to-a-fleet; lessons/capstone.md#capacity-planning.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from core.workload import Workload
from serving_lab.manifest import Manifest
from sim.cluster import Cluster
from sim.hardware import HardwareProfile
from sim.simulator import Simulator


@dataclass(frozen=True)
class PlanTarget:
    """What a plan must meet, and the price it is costed at."""

    ttft_ms: float
    tpot_ms: float
    usd_per_gpu_hour: float
    attainment: float = 0.9  # the share of requests within both SLOs
    max_replicas: int = 16
    router: str = "least_loaded"

    def __post_init__(self) -> None:
        if not (self.ttft_ms > 0 and self.tpot_ms > 0 and self.usd_per_gpu_hour > 0):
            raise ValueError("a plan needs SLOs (TTFT and TPOT, ms) and a price per GPU-hour, all > 0")
        if not 0 < self.attainment <= 1 or self.max_replicas < 1:
            raise ValueError(f"attainment must be in (0, 1] and max_replicas >= 1, got {self.attainment}, "
                             f"{self.max_replicas}")


def candidate(simulator: Simulator, replicas: int, workload: Workload, target: PlanTarget) -> dict[str, Any]:
    """One fleet simulated: its size, attainment, tails and price."""
    run = Cluster(simulators=[simulator] * replicas, router=target.router).simulate(workload)
    gpus = replicas * simulator.num_devices
    attainment = run.metrics.slo_attainment(target.ttft_ms, target.tpot_ms)
    return {"tensor_parallel_size": simulator.tensor_parallel_size, "replicas": replicas, "gpus": gpus,
            "attainment_%": round(100 * attainment, 1), "meets_slo": attainment >= target.attainment,
            "p99_ttft_ms": round(run.metrics.p99_ttft_ms, 1), "p99_tpot_ms": round(run.metrics.p99_tpot_ms, 2),
            "usd_per_hour": round(gpus * target.usd_per_gpu_hour, 2),
            "usd_per_M_tokens": round(run.cost_per_million_tokens(target.usd_per_gpu_hour), 3)}


def plan(manifest: Manifest, workload: Workload, hardware: HardwareProfile, target: PlanTarget,
         tensor_parallel_sizes: Sequence[int] = (1,)) -> list[dict[str, Any]]:
    """Rows, the plan first: per degree, the smallest fleet that meets the SLOs (or the largest tried, marked
    `meets_slo` False), then the fleet one replica smaller than the plan. Raises if no degree fits the
    model on the device (the simulator's own error names why)."""
    deployment = manifest.simulator_kwargs(speculation=False)
    found, missed = [], []
    for tp in tensor_parallel_sizes:
        simulator = Simulator(hardware=hardware, **{**deployment, "tensor_parallel_size": tp})
        previous = None
        for replicas in range(1, target.max_replicas + 1):
            row = candidate(simulator, replicas, workload, target)
            if row["meets_slo"]:
                found.append((row, previous))
                break
            previous = row
        else:
            missed.append(row)
    if not found:
        return missed
    found.sort(key=lambda pair: (pair[0]["usd_per_hour"], pair[0]["gpus"], pair[0]["tensor_parallel_size"]))
    best, smaller = found[0]
    rows = [best, *(row for row, _ in found[1:]), *missed]
    return rows + ([smaller] if smaller is not None else [])
