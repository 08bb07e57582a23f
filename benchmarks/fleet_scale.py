"""How fast, and in how much memory, the simulator runs a fleet: a production trace replayed on 16 replicas.

    python benchmarks/fleet_scale.py [--num-requests 20000] [--time-scale 40] [--replicas 16] [--router least_loaded]

Azure's 2023 chat trace (`Workload.replay`, looped past its 19,366 requests, played `--time-scale` times faster)
on Llama-3.1-8B replicas on the H100 profile with vLLM's GPU defaults for the knobs that matter. Prints the
time to build the workload and to simulate it, the steps, the peak resident memory (ru_maxrss) and the fleet's
numbers. The issue's goal is a million requests on 16 replicas in under 60 s and 4 GB; this measures how far
the simulator is from it. A benchmark, not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import platform
import resource
import time

from core import EngineConfig, Workload
from sim import Cluster


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-requests", type=int, default=20_000)
    parser.add_argument("--time-scale", type=float, default=40.0, help="play the trace this many times faster")
    parser.add_argument("--replicas", type=int, default=16)
    parser.add_argument("--router", default="least_loaded")
    args = parser.parse_args()

    start = time.perf_counter()
    workload = Workload.replay("azure-conv-2023", time_scale=args.time_scale, num_requests=args.num_requests)
    built = time.perf_counter()
    config = EngineConfig(max_num_seqs=256, max_num_batched_tokens=8192, max_model_len=16384)
    run = Cluster("llama-3.1-8b", "h100-sxm", config, num_replicas=args.replicas, router=args.router).simulate(workload)
    done = time.perf_counter()
    metrics = run.metrics
    print(f"{platform.machine()}, Python {platform.python_version()}: {args.num_requests} requests of azure-conv-2023 "
          f"at {args.time_scale:g}x on {args.replicas} replicas ({args.router})")
    print(f"  build {built - start:.1f} s, simulate {done - built:.1f} s, {len(metrics.steps)} steps, peak RSS "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")
    print(f"  {metrics.completed} completed in {metrics.duration:.0f} s simulated, p99 TTFT {metrics.p99_ttft_ms:.0f} ms, "
          f"{metrics.output_throughput:.0f} output tokens/s, {run.gpu_seconds / 3600:.2f} GPU-hours")


if __name__ == "__main__":
    main()
