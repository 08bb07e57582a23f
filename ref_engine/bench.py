"""`run(workload, config)`: a `Workload` on the real engine, measured into `RunMetrics`.

This is the measured half of every lesson's comparison; `sim.Simulator(...).run(workload)` is the other
half, with the same workload object and the same `RunMetrics` definition. Arrival times are honoured on
the wall clock (a request is added once its arrival time has passed, and its TTFT counts from the intended
arrival, as the simulator counts it). The engine's step log (batch shape and duration of every step) comes
back in `RunMetrics.steps`, which is what `serving_lab.calibrate` fits.

Lesson: lessons/01-continuous-batching.md (measuring both sides).
"""

from __future__ import annotations

import time
from collections import deque
from pathlib import Path

import torch

from core.config import EngineConfig
from core.metrics import RunMetrics
from core.workload import Workload
from ref_engine.engine import LLMEngine
from ref_engine.model.loader import LoadedModel


def run(workload: Workload, config: EngineConfig | None = None, *,
        model: str | Path | LoadedModel | None = None, dtype: str | torch.dtype = "float32") -> RunMetrics:
    """Serve `workload` on a fresh engine (pass a `LoadedModel` to reuse weights across runs)."""
    return run_rounds([workload], config, model=model, dtype=dtype)[0]


def run_rounds(workloads: list[Workload], config: EngineConfig | None = None, *,
               model: str | Path | LoadedModel | None = None, dtype: str | torch.dtype = "float32",
               kv_cache_dtype: str = "auto") -> list[RunMetrics]:
    """Serve the workloads one after another on one fresh engine, so each round finds the prefix cache the
    earlier ones left (a warm-up, or the turns of a chat). Each round is measured on its own clock."""
    engine = LLMEngine(model, dtype=dtype, config=config or EngineConfig(), kv_cache_dtype=kv_cache_dtype)
    return [_serve(engine, workload) for workload in workloads]


def _serve(engine: LLMEngine, workload: Workload) -> RunMetrics:
    requests = workload.make_requests(engine.arch.vocab_size, engine.eos_token_ids)
    pending = deque(sorted(requests, key=lambda r: r.arrival_time))
    refused = 0
    engine.reset_clock()
    while pending or engine.has_unfinished_requests():
        now = engine.now()
        while pending and pending[0].arrival_time <= now:
            try:
                engine.add_workload_request(pending.popleft())
            except ValueError:
                refused += 1
        if engine.has_unfinished_requests():
            engine.step(now)
        elif pending:
            time.sleep(max(0.0, pending[0].arrival_time - engine.now()))
    admitted = [r for r in requests if r.finish_time is not None]
    return RunMetrics.from_requests(admitted, engine.step_records, num_failed=refused)
