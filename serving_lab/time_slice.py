"""How long this machine's scheduler lets a busy process keep a core while another waits for it, measured.

Tensor parallelism on a CPU with more ranks than cores (SmolLM2's 3 ranks on 2 cores) runs the ranks in
lockstep, an all-reduce after every attention and every MLP, while the OS shares the cores out in time
slices. A rank's stretch of work between two all-reduces that is shorter than a slice runs whole, in turns
(3 ranks on 2 cores: two, then the third); a longer one is cut into slices and shared fairly. The slice
length decides which, so the cost model needs it (`HardwareProfile.scheduler_slice_s`, sim/cost_model.py).
It is the kernel's (Linux's EEVDF base slice, rounded up to its timer tick), not readable without debugfs, so
it is measured: two child processes pinned to one core spin for `SPIN_SECONDS`, each noting when it was off
the core, and the median length of their runs on it is the slice.

Lesson: lessons/07-tuning-knobs.md#parallelism
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

SPIN_SECONDS = 0.5
# A gap between two readings of the clock longer than this means the process was off the core.
OFF_CORE_S = 50e-6


def measure_time_slice(spin_seconds: float = SPIN_SECONDS) -> float | None:
    """Median seconds a busy process runs on a core that another busy process waits for; None where the OS
    cannot pin a process to a core (no `os.sched_setaffinity`) or the runs were not cut at all."""
    import multiprocessing

    if spin_seconds <= 0:
        raise ValueError(f"spin_seconds must be > 0, got {spin_seconds}")
    if not hasattr(os, "sched_setaffinity"):
        return None
    # fork where there is one: a spawned child would import the parent's main module (torch, often) first
    context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    results = context.SimpleQueue()
    core = min(os.sched_getaffinity(0))
    processes = [context.Process(target=_spin, args=(core, spin_seconds, results)) for _ in range(2)]
    for process in processes:
        process.start()
    for process in processes:
        process.join()
    if any(process.exitcode != 0 for process in processes):
        raise RuntimeError("a time-slice process failed; see its traceback above")
    runs = [run for _ in processes for run in results.get()]
    return statistics.median(runs) if runs else None


def _spin(core: int, seconds: float, results: Any) -> None:
    """Pin to `core`, read the clock in a loop for `seconds`, and put on `results` the lengths of the runs
    between two gaps over `OFF_CORE_S` (not the first one, cut by the start rather than the scheduler)."""
    os.sched_setaffinity(0, {core})
    runs: list[float] = []
    start = last = time.perf_counter()
    end = start + seconds
    while last < end:
        now = time.perf_counter()
        if now - last > OFF_CORE_S:
            runs.append(last - start)
            start = now
        last = now
    results.put(runs[1:])
