"""Replaying an engine run in the simulator: the tests that show one policy makes the same decisions on
both sides (tests/serving_lab/test_replay_engine.py, test_scheduler_plugin.py,
test_scheduling_policies_replay.py) feed the simulator the engine's own step times.

Each simulated step takes the gap to the engine's next step start (`ReplayTimer`), so it starts when the
engine's did and sees the same arrivals. Arrivals before the engine's first step are moved to that step's
start: the engine notices a request a fraction of a millisecond after it arrives, and the replay starts
from what the engine saw. Only the timing model could make the two sides differ, and here it cannot."""

from __future__ import annotations

from dataclasses import replace
from itertools import pairwise

from core import EngineConfig, RunMetrics, Workload
from core.arch_config import ArchConfig
from sim import Simulator
from sim.executor import ReplayTimer


def replay(measured: RunMetrics, workload: Workload, config: EngineConfig, arch: ArchConfig) -> RunMetrics:
    """The simulator's run of `workload` under `config`, fed the engine's step times and its arrivals as
    the engine saw them."""
    starts = [s.start for s in measured.steps]
    gaps = [b - a for a, b in pairwise(starts)] + [measured.steps[-1].duration]
    seen = replace(workload, requests=tuple(replace(r, arrival_time=max(r.arrival_time, starts[0]))
                                            for r in workload.requests))
    return Simulator(arch, "local-cpu", config, dtype="float32", step_timer=ReplayTimer(gaps)).run(seen)


def batches(metrics: RunMetrics) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Every step's batch: each row's query length and context length, in order."""
    return [(s.query_lens, s.context_lens) for s in metrics.steps]
