"""This machine's all-reduce: gloo among processes, the collective tensor parallelism runs twice per layer.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/allreduce.py [--world-sizes 2 3] [--repeats 5] [--lockstep]

For each world size, times that many processes (one torch thread each where the cores do not go round,
as the engine's workers get max(1, cores // N)) and times `all_reduce` of float32 tensors from 1 KiB to
16 MiB, plus the sizes SmolLM2-135M's layers all-reduce (hidden 576 x tokens 1, 16, 64, 512, float32); each
time is the fastest of `--repeats` batches of back-to-back calls (serving_lab/collectives.py). Prints one
Markdown table (microseconds per call, and what the fitted form predicts) and the fitted latency and bus
bandwidth per world size, the numbers calibration stores in the CPU profile.

`--lockstep` adds what a rank's compute does to it, as in a decode step: each rank runs `LOCKSTEP_CALLS` times
a few one-row matmuls (a rank's share of a layer half, roughly) then a one-row all-reduce, and the table gives
the seconds per iteration of the matmuls alone, the all-reduce alone, and both. Where the ranks fit the cores,
both = the sum; where they do not, the ranks take turns (sim/hardware.py, `tensor_parallel_rounds`).
A benchmark, not a test.
Results: benchmarks/RESULTS.md ("All-reduce on this machine").
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

from core.arch_config import ArchConfig
from ref_engine.distributed.parallel_state import worker_threads
from serving_lab.collectives import (
    AllReduceFit,
    AllReduceTiming,
    activation_sizes,
    fit_allreduce,
    measure_allreduce,
)

SMOLLM2_TOKENS = (1, 16, 64, 512)
RANGE = tuple(1024 * 4**i for i in range(8))  # 1 KiB .. 16 MiB
LOCKSTEP_CALLS = 60  # a SmolLM2 step's all-reduces: 2 per layer, 30 layers
LOCKSTEP_MODES = ("matmuls", "all-reduce", "both")


def size_label(num_bytes: int) -> str:
    """1 KiB, 4 MiB, or plain bytes when not a whole KiB."""
    for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
        if num_bytes % scale == 0:
            return f"{num_bytes // scale} {unit}"
    return f"{num_bytes:,} B"


def table(sizes: list[int], smollm2: dict[int, int], timings: dict[int, list[AllReduceTiming]],
          fits: dict[int, AllReduceFit]) -> str:
    world_sizes = list(timings)
    head = " | ".join(f"{p} processes: measured us | fit us" for p in world_sizes)
    lines = [f"| size | SmolLM2 tokens | {head} |", "| --- | --- |" + " --- | --- |" * len(world_sizes)]
    for i, n in enumerate(sizes):
        cells = " | ".join(f"{timings[p][i].seconds * 1e6:.0f} | {fits[p].time(n) * 1e6:.0f}" for p in world_sizes)
        lines.append(f"| {size_label(n)} | {smollm2.get(n, '')} | {cells} |")
    return "\n".join(lines)


def lockstep(world_size: int, repeats: int) -> dict[str, float]:
    """Seconds per iteration of each of `LOCKSTEP_MODES` among `world_size` processes (rank 0's fastest pass)."""
    import torch.multiprocessing as mp

    context = mp.get_context("spawn")
    results = context.SimpleQueue()
    with tempfile.TemporaryDirectory() as folder:
        mp.start_processes(_lockstep_rank, args=(world_size, str(Path(folder) / "rendezvous"), repeats, results),
                           nprocs=world_size, start_method="spawn")
        return results.get()


def _lockstep_rank(rank: int, world_size: int, rendezvous: str, repeats: int, results: Any) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(worker_threads(world_size))
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world_size)
    row, weight, activation = torch.randn(1, 576), torch.randn(576, 4096), torch.zeros(576)
    best = {}
    for mode in LOCKSTEP_MODES:
        for _ in range(repeats):
            dist.barrier()
            start = time.perf_counter()
            for _ in range(LOCKSTEP_CALLS):
                if mode != "all-reduce":
                    for _ in range(4):
                        row @ weight
                if mode != "matmuls":
                    dist.all_reduce(activation)
            best[mode] = min(best.get(mode, float("inf")), (time.perf_counter() - start) / LOCKSTEP_CALLS)
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        results.put(best)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[2, 3], help="processes per all-reduce")
    parser.add_argument("--repeats", type=int, default=5, help="timed batches per size; the fastest is kept")
    parser.add_argument("--lockstep", action="store_true", help="also time all-reduces between matmuls")
    args = parser.parse_args()
    smollm2 = dict(zip(activation_sizes(ArchConfig.named("smollm2-135m"), SMOLLM2_TOKENS), SMOLLM2_TOKENS))
    sizes = sorted(set(RANGE) | set(smollm2))
    started = time.perf_counter()
    timings = measure_allreduce(args.world_sizes, sizes, repeats=args.repeats)
    fits = {p: fit_allreduce(ts) for p, ts in timings.items()}
    print(f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} logical CPUs; Python "
          f"{platform.python_version()}; {datetime.datetime.now().isoformat(timespec='minutes')}; gloo, threads per "
          f"process {', '.join(f'{worker_threads(p)} at {p}' for p in args.world_sizes)}; fastest of {args.repeats} "
          f"batches; OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '')}; {time.perf_counter() - started:.0f} s\n")
    print(table(sizes, smollm2, timings, fits))
    print()
    for p, fit in fits.items():
        print(f"- {p} processes: latency {fit.latency_s * 1e6:.0f} us, bus bandwidth {fit.bus_bandwidth / 1e9:.2f} GB/s "
              f"(time = latency + {2 * (p - 1)}/{p} x bytes / bus bandwidth; mean |error| {fit.mean_abs_error_pct:.1f}%)")
    if args.lockstep:
        print(f"\n| processes | ms per iteration: {' | '.join(LOCKSTEP_MODES)} | both - matmuls - all-reduce |")
        print("| --- |" + " --- |" * (len(LOCKSTEP_MODES) + 1))
        for p in args.world_sizes:
            t = lockstep(p, args.repeats)
            print(f"| {p} | " + " | ".join(f"{t[m] * 1e3:.2f}" for m in LOCKSTEP_MODES)
                  + f" | {(t['both'] - t['matmuls'] - t['all-reduce']) * 1e3:+.2f} |")


if __name__ == "__main__":
    main()
