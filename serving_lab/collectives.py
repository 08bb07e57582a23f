"""What a tensor-parallel all-reduce costs on this machine, measured.

The engine's tensor parallelism (`LLM(tensor_parallel_size=N)`) runs one worker process per rank and sums
each decoder layer's partial activations twice (after o_proj and after down_proj) with a gloo all-reduce of
tokens x hidden_size float32 values. The simulator prices one such all-reduce of `n` bytes among `p` ranks
as sim/cost_model.py does for NVLink:

    time = latency_s + 2 (p - 1) / p * n / bus_bandwidth

(a ring all-reduce sends and receives 2 (p - 1) / p of the buffer per rank; NCCL's tests call the rate seen
through that factor the "bus bandwidth"). On a CPU the "link" is the loopback TCP gloo uses between
processes on one machine, and its latency is mostly the wake-ups of processes that share the cores.

`measure_allreduce` spawns `p` processes that rendezvous through a file, times `all_reduce` of float32
tensors of the given sizes in every rank with the torch threads the engine's workers get
(max(1, cores // p)), and keeps rank 0's fastest batch per size; `fit_allreduce` fits latency and bus
bandwidth to the timings by least squares weighted by 1 / time (relative error, as calibration fits steps).
Calibration (serving_lab/calibrate.py) measures a few sizes for the CPU profile; benchmarks/allreduce.py
prints the whole range.

Lesson: lessons/07-tuning-knobs.md#parallelism
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from core.arch_config import ArchConfig

FLOAT32_BYTES = 4
# Few sizes, so that calibration pays only the processes' start-up (~3 s) and well under a second of
# timing: one decode row, a decode batch of 64 and a 512-token prefill of SmolLM2 (hidden 576, float32),
# and a 4 MiB buffer that pins the bandwidth.
CALIBRATION_SIZES = (576 * 4, 64 * 576 * 4, 512 * 576 * 4, 4 << 20)
# Each timed batch of all-reduces of one size runs for about this long, and `repeats` batches are timed.
BATCH_SECONDS = 0.02


@dataclass(frozen=True)
class AllReduceTiming:
    """Seconds one all-reduce of `num_bytes` took among `world_size` processes (rank 0's fastest batch)."""

    world_size: int
    num_bytes: int
    seconds: float


@dataclass(frozen=True)
class AllReduceFit:
    """time(n bytes) = latency_s + 2 (p - 1) / p * n / bus_bandwidth, among p = `world_size` ranks."""

    world_size: int
    latency_s: float
    bus_bandwidth: float  # bytes/s
    mean_abs_error_pct: float = 0.0

    def time(self, num_bytes: float) -> float:
        """Seconds the fitted form predicts for one all-reduce of `num_bytes`."""
        return self.latency_s + ring_factor(self.world_size) * num_bytes / self.bus_bandwidth


def ring_factor(world_size: int) -> float:
    """Share of the buffer a ring all-reduce sends (and receives) per rank: 2 (p - 1) / p."""
    if world_size < 2:
        raise ValueError(f"an all-reduce needs at least 2 processes, got world_size={world_size}")
    return 2 * (world_size - 1) / world_size


def activation_sizes(arch: ArchConfig, token_counts: Sequence[int], element_bytes: int = FLOAT32_BYTES) -> list[int]:
    """Bytes of the all-reduces a step of each token count runs: tokens x hidden_size elements."""
    return [tokens * arch.hidden_size * element_bytes for tokens in token_counts]


def fit_allreduce(timings: Sequence[AllReduceTiming]) -> AllReduceFit:
    """Latency and bus bandwidth of timings among one world size, at least two distinct sizes."""
    world_sizes = {t.world_size for t in timings}
    if len(world_sizes) != 1:
        raise ValueError(f"fit one world size at a time; got timings for {sorted(world_sizes)}")
    if len({t.num_bytes for t in timings}) < 2:
        raise ValueError("fitting a latency and a bandwidth needs timings of at least two sizes")
    # scipy here, not at the top: the spawned ranks import this module and never fit
    from scipy.optimize import nnls

    (world_size,) = world_sizes
    moved = np.array([ring_factor(world_size) * t.num_bytes for t in timings], dtype=float)
    y = np.array([t.seconds for t in timings])
    X = np.column_stack([np.ones_like(moved), moved])
    w = 1.0 / y
    (latency_s, seconds_per_byte), _ = nnls(X * w[:, None], y * w)
    if seconds_per_byte <= 0:
        raise ValueError("the timings do not grow with size; no bandwidth can be fitted (measure larger sizes)")
    predicted = X @ np.array([latency_s, seconds_per_byte])
    error = float(np.mean(np.abs(predicted - y) / y)) * 100
    return AllReduceFit(world_size, float(latency_s), float(1.0 / seconds_per_byte), round(error, 2))


def measure_allreduce(world_sizes: Sequence[int], sizes: Sequence[int] = CALIBRATION_SIZES, repeats: int = 5,
                      cores: int | None = None) -> dict[int, list[AllReduceTiming]]:
    """Time gloo `all_reduce` of float32 tensors of `sizes` bytes among each of `world_sizes` processes.

    One start-up for all world sizes (each process imports torch, ~2 s of a calibration): max(world_sizes)
    processes are spawned, and for each world size p the first p of them time their own process group while
    the others sleep (in a multiprocessing barrier, not a spinning collective). Each rank runs the torch
    threads the engine's workers get (`worker_threads(p, cores)`, ref_engine.distributed.parallel_state).
    Each size is warmed up, then `repeats` batches of back-to-back all-reduces (as many as fill about `BATCH_SECONDS`) are timed after a
    barrier; rank 0's fastest batch mean is kept, as every measurement here keeps the fastest run (other
    programs only ever slow one down)."""
    import torch.multiprocessing as mp

    from ref_engine.distributed.parallel_state import worker_threads  # the engine's own rule (imports torch)

    for p in world_sizes:
        ring_factor(p)  # validates p
    if not world_sizes or len(set(world_sizes)) != len(world_sizes):
        raise ValueError(f"world_sizes must be distinct, and at least one; got {list(world_sizes)}")
    if not sizes or any(n < FLOAT32_BYTES or n % FLOAT32_BYTES for n in sizes):
        raise ValueError(f"sizes must be positive multiples of {FLOAT32_BYTES} bytes (float32), got {list(sizes)}")
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    context = mp.get_context("spawn")
    processes_max = max(world_sizes)
    phases = [(p, worker_threads(p, cores)) for p in world_sizes]
    results, between_phases = context.SimpleQueue(), context.Barrier(processes_max)
    with tempfile.TemporaryDirectory() as folder:
        rendezvous = str(Path(folder) / "rendezvous")
        processes = [context.Process(target=_rank_main, args=(rank, processes_max, rendezvous, phases, list(sizes),
                                                             repeats, between_phases, results))
                     for rank in range(processes_max)]
        for process in processes:
            process.start()
        for process in processes:
            process.join()
        failed = [process.exitcode for process in processes if process.exitcode != 0]
        if failed:
            raise RuntimeError(f"an all-reduce process failed (exit codes {failed}); see its traceback above")
        seconds = dict(results.get() for _ in phases)
    return {p: [AllReduceTiming(p, n, s) for n, s in zip(sizes, seconds[p])] for p in world_sizes}


def _rank_main(rank: int, num_processes: int, rendezvous: str, phases: list[tuple[int, int]], sizes: list[int],
               repeats: int, between_phases: Any, results: Any) -> None:
    """One process of `measure_allreduce`: in each phase (world size, threads) it times the phase's group if it
    is one of its first ranks, else sleeps; rank 0 puts (world size, fastest seconds per size) on `results`."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=num_processes)
    try:
        groups = [dist.new_group(list(range(p))) for p, _ in phases]  # every process creates every group
        for (p, threads), group in zip(phases, groups):
            if rank < p:
                torch.set_num_threads(threads)
                best = [_time_size(torch, dist, group, n // FLOAT32_BYTES, repeats) for n in sizes]
                if rank == 0:
                    results.put((p, best))
            between_phases.wait()
    finally:
        dist.destroy_process_group()


def _time_size(torch: Any, dist: Any, group: Any, numel: int, repeats: int) -> float:
    """Seconds per all-reduce of `numel` float32 values in `group`: the fastest of `repeats` timed batches.
    Rank 0 picks the batch length from a warm-up and broadcasts it, so that every rank runs as many calls."""
    tensor = torch.zeros(numel, dtype=torch.float32)  # zeros: sums of ones would overflow to inf
    start = time.perf_counter()
    for _ in range(3):
        dist.all_reduce(tensor, group=group)
    per_call = (time.perf_counter() - start) / 3
    calls_tensor = torch.tensor([max(1, min(1000, round(BATCH_SECONDS / per_call)))])
    dist.broadcast(calls_tensor, src=0, group=group)
    calls = int(calls_tensor)
    best = float("inf")
    for _ in range(repeats):
        dist.barrier(group=group)
        start = time.perf_counter()
        for _ in range(calls):
            dist.all_reduce(tensor, group=group)
        best = min(best, (time.perf_counter() - start) / calls)
    return best
