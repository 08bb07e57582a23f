"""How fast the simulator runs: 10,000 requests of a mixed workload, Llama-3.1-8B on an H100 profile.

    python benchmarks/sim_speed.py [--num-requests 10000] [--rate 25] [--profile]

Prints the wall time of `Simulator.run` (and of building the requests, which it includes), the simulated
duration and the step count. Target: under 10 s on the course's 2-core machine. `--profile` prints the
top of a cProfile run instead, to find the hot spots. A benchmark, not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import cProfile
import platform
import pstats
import time

from core import EngineConfig, Exponential, Workload
from sim import Simulator


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-requests", type=int, default=10_000)
    parser.add_argument("--rate", type=float, default=25.0, help="Poisson arrivals, requests/s")
    parser.add_argument("--profile", action="store_true", help="print cProfile's top functions")
    args = parser.parse_args()

    # vLLM's GPU defaults for the knobs that matter here.
    config = EngineConfig(max_num_seqs=256, max_num_batched_tokens=8192, max_model_len=4096)
    workload = Workload.synthetic(args.num_requests, prompt_len=(32, 1024), output_len=Exponential(256, 2048),
                                  arrival=args.rate, seed=0, name="mixed")
    simulator = Simulator("llama-3.1-8b", "h100-sxm", config)

    if args.profile:
        profiler = cProfile.Profile()
        profiler.runcall(simulator.run, workload)
        pstats.Stats(profiler).sort_stats("tottime").print_stats(15)
        return

    start = time.perf_counter()
    metrics = simulator.run(workload)
    wall = time.perf_counter() - start
    print(f"machine: {platform.processor() or platform.machine()}, python {platform.python_version()}")
    print(f"{args.num_requests} requests, Llama-3.1-8B on H100-SXM, {simulator.num_kv_blocks} KV blocks")
    print(f"simulated {metrics.duration:.1f} s in {metrics.num_steps} steps "
          f"({metrics.completed} completed, {metrics.failed} failed, {metrics.num_preemptions} preemptions, "
          f"{metrics.output_throughput:.0f} output tok/s)")
    print(f"wall time: {wall:.2f} s")


if __name__ == "__main__":
    main()
