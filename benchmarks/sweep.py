"""How fast `serving-lab sweep` runs, and how well the simulator ranks configurations on this CPU.

    python benchmarks/sweep.py speed [--requests 2000] [--limit N] [--jobs J]
    python benchmarks/sweep.py rank [--repeats 3]

`speed`: a Llama-3.1-8B / H100 grid of 200 configurations (max_num_seqs x max_num_batched_tokens x block_size
x kv_cache_dtype x enable_prefix_caching), each simulated on `--requests` mixed requests (prompts uniform
32-1024, outputs uniform 16-512, Poisson at 20 requests/s, seed 0). `--limit N` simulates only the first N
points (spread over the grid) and extrapolates the whole grid's time from them: the whole grid takes many
minutes on a slow machine. Goal (lesson 7's issue): the 200 x 2,000 grid in under 5 minutes.

`rank`: eight configurations of SmolLM2-135M on the engine (`--repeats` interleaved runs each, fastest kept)
and in the simulator on this machine's calibrated profile; prints both throughputs, the simulated error and
Spearman's rho. Goal: rho >= 0.9.

A benchmark, not a test: nothing here asserts a time. Results: benchmarks/RESULTS.md, "Sweeps".
"""

from __future__ import annotations

import argparse
import datetime
import platform
import time

from course import tuning_knobs as tuning
from serving_lab.pairing import format_table
from serving_lab.sweep import Sweep, parse_grid, simulate_points

SPEED_GRID = {"max_num_seqs": [16, 32, 64, 128, 256], "max_num_batched_tokens": [512, 1024, 2048, 4096, 8192],
              "block_size": [16, 32], "kv_cache_dtype": ["bfloat16", "fp8"], "enable_prefix_caching": [True, False]}
SPEED_WORKLOAD = "synthetic:{num_requests}:32-1024:16-512:20"
RANK_GRID = {"max_num_seqs": [1, 2, 4, 8], "max_num_batched_tokens": [32, 512]}


def speed(num_requests: int, limit: int | None, jobs: int) -> None:
    """Simulate the grid (or `limit` points spread over it) and time it."""
    grid = parse_grid(SPEED_GRID)
    sweep = Sweep(tuning.tuning_manifest("llama-3.1-8b"), grid, SPEED_WORKLOAD.format(num_requests=num_requests),
                  hardware="h100-sxm")
    points = grid.points()
    chosen = points if limit is None else points[:: max(1, len(points) // limit)][:limit]
    start = time.perf_counter()
    rows = list(simulate_points(sweep, chosen, jobs))
    elapsed = time.perf_counter() - start
    whole = elapsed / len(chosen) * len(points)
    print(f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.processor() or platform.machine()}")
    print(f"{len(chosen)} of {len(points)} points x {num_requests} requests, {jobs} job(s): {elapsed:.1f} s "
          f"({len(rows) / elapsed:.3f} points/s); "
          f"whole grid {'measured' if limit is None else 'extrapolated'}: {whole:.0f} s (goal: 300 s)")


def rank(repeats: int) -> None:
    from ref_engine.model.loader import load_model
    from serving_lab.calibrate import load_or_calibrate

    model = load_model(None)
    profile = load_or_calibrate(model)
    start = time.perf_counter()
    result = tuning.sweep(RANK_GRID, "synthetic:16:64:16", profile, measure=True, loaded=model, repeats=repeats)
    simulated = {r["point"]: r for r in result.simulated()}
    rows = [{"point": r["point"], "measured": r["output_throughput"],
             "simulated": simulated[r["point"]]["output_throughput"],
             "error_pct": 100 * (simulated[r["point"]]["output_throughput"] / r["output_throughput"] - 1),
             "slowdown": r["slowdown"]} for r in result.measured()]
    print(f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, profile {profile.name} "
          f"(fitted {profile.provenance.get('fitted_at')}), {time.perf_counter() - start:.0f} s")
    print(format_table(rows, ["point", "measured", "simulated", "error_pct", "slowdown"]))
    print(f"Spearman's rho: {result.agreement['rho']:.3f} over {len(rows)} configurations (goal >= 0.9)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("speed")
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--jobs", type=int, default=1, help="processes simulating points at once")
    p = sub.add_parser("rank")
    p.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.what == "speed":
        speed(args.requests, args.limit, args.jobs)
    else:
        rank(args.repeats)


if __name__ == "__main__":
    main()
