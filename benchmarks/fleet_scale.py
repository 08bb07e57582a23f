"""How fast, and in how much memory, the simulator runs a fleet: a production trace replayed on 16 replicas.

    python benchmarks/fleet_scale.py [--num-requests 20000] [--trace azure-conv-2023] [--time-scale 40]
        [--replicas 16] [--router least_loaded] [--autoscale] [--keep] [--eager-prompts] [--no-prefix-caching]
        [--ttft-slo-ms 1000] [--tpot-slo-ms 50] [--dollars-per-gpu-hour 2.5] [--no-progress]

An Azure 2023 trace (`Workload.replay`: the chat trace, or the code trace with ~2k-token prompts and short
replies), looped past its end and played `--time-scale` times faster, on Llama-3.1-8B replicas on the H100
profile with vLLM's GPU defaults for the knobs that matter. By default the run streams (`Cluster(streaming=True)`:
requests made as they arrive, prompts drawn only when read, metrics gathered as it goes); `--keep` keeps every
request and step as before, `--eager-prompts` draws every prompt's ids up front. Prints the time to build the
workload and to simulate it, the peak resident memory (ru_maxrss, the whole process), per request, and the
fleet's numbers: goodput at the stated SLOs, replicas over time, cost per million output tokens at the stated
$/GPU-hour. The issue's goal is a million requests on 16 replicas in under 60 s and 4 GB; this measures how far
the simulator is from it. A benchmark, not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import platform
import resource
import sys
import time

from tqdm import tqdm

from core import EngineConfig, Workload
from core.trace import TRACE_FILES
from sim import Cluster
from sim.autoscaler import Autoscaler, FleetTimeline


def replicas_over_time(timeline: FleetTimeline | None, replicas: int, duration: float, points: int = 8) -> str:
    """Serving replicas at evenly spaced moments of the run (a static fleet serves all of them throughout)."""
    if timeline is None:
        return f"{replicas} throughout"
    moments = [duration * i / (points - 1) for i in range(points)]
    serving = [next((n for t, _, n, _ in reversed(timeline.changes) if t <= moment), 0) for moment in moments]
    return (", ".join(f"{n} at {moment:.0f} s" for n, moment in zip(serving, moments))
            + f" (at most {timeline.max_serving}, {timeline.num_cold_starts} cold starts)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-requests", type=int, default=20_000)
    parser.add_argument("--trace", default="azure-conv-2023", choices=sorted(TRACE_FILES))
    parser.add_argument("--time-scale", type=float, default=40.0, help="play the trace this many times faster")
    parser.add_argument("--replicas", type=int, default=16, help="the fleet (with --autoscale: its most)")
    parser.add_argument("--router", default="least_loaded")
    parser.add_argument("--autoscale", action="store_true", help="a concurrency autoscaler, 1 to --replicas")
    parser.add_argument("--keep", action="store_true", help="keep every request and step (no streaming)")
    parser.add_argument("--eager-prompts", action="store_true", help="draw every prompt's ids up front")
    parser.add_argument("--no-prefix-caching", action="store_true")
    parser.add_argument("--ttft-slo-ms", type=float, default=1000.0)
    parser.add_argument("--tpot-slo-ms", type=float, default=50.0)
    parser.add_argument("--dollars-per-gpu-hour", type=float, default=2.5)
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args()

    start = time.perf_counter()
    workload = Workload.replay(args.trace, time_scale=args.time_scale, num_requests=args.num_requests)
    if not args.eager_prompts:
        workload = workload.with_lazy_prompts()
    built = time.perf_counter()
    config = EngineConfig(max_num_seqs=256, max_num_batched_tokens=8192, max_model_len=16384,
                          enable_prefix_caching=not args.no_prefix_caching)
    fleet = (dict(autoscaler=Autoscaler(target_concurrency=64, min_replicas=1, max_replicas=args.replicas,
                                        initial_replicas=args.replicas))
             if args.autoscale else dict(num_replicas=args.replicas))
    cluster = Cluster("llama-3.1-8b", "h100-sxm", config, router=args.router, streaming=not args.keep, **fleet)
    with tqdm(total=args.num_requests, unit="req", file=sys.stderr, disable=args.no_progress,
              mininterval=1.0) as bar:
        finished = 0

        def on_finish(_request: object) -> None:  # the bar itself every 1,000 requests: cheap
            nonlocal finished
            finished += 1
            if finished % 1000 == 0:
                bar.update(1000)

        run = cluster.simulate(workload, on_finish=on_finish)
        bar.update(finished % 1000)
    done = time.perf_counter()
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    m = run.metrics
    n = args.num_requests
    mode = "kept" if args.keep else "streamed"
    print(f"{platform.machine()}, Python {platform.python_version()}: {n} requests of {args.trace} at "
          f"{args.time_scale:g}x on {args.replicas} replicas ({args.router}{', autoscaled' if args.autoscale else ''}),"
          f" {mode}, {'eager' if args.eager_prompts else 'lazy'} prompts, prefix caching "
          f"{'off' if args.no_prefix_caching else 'on'}")
    print(f"  build {built - start:.1f} s, simulate {done - built:.1f} s ({(done - built) / n * 1e3:.2f} ms a request), "
          f"{m.num_steps} steps, peak RSS {peak_mb:.0f} MB ({peak_mb * 1024 / n:.1f} KB a request)")
    print(f"  {m.completed} completed, {m.failed} failed, in {m.duration:.0f} s simulated; TTFT p50/p99 "
          f"{m.median_ttft_ms:.0f}/{m.p99_ttft_ms:.0f} ms, TPOT p50/p99 {m.median_tpot_ms:.1f}/{m.p99_tpot_ms:.1f} ms, "
          f"{m.output_throughput:.0f} output tokens/s")
    print(f"  goodput at TTFT <= {args.ttft_slo_ms:g} ms and TPOT <= {args.tpot_slo_ms:g} ms: "
          f"{m.goodput(args.ttft_slo_ms, args.tpot_slo_ms):.1f} requests/s "
          f"({m.slo_attainment(args.ttft_slo_ms, args.tpot_slo_ms):.1%} of requests)")
    print(f"  replicas: {replicas_over_time(run.timeline, args.replicas, m.duration)}")
    print(f"  {run.gpu_seconds / 3600:.2f} GPU-hours; ${run.cost_per_million_tokens(args.dollars_per_gpu_hour):.3f} "
          f"per million output tokens at ${args.dollars_per_gpu_hour:g}/GPU-hour")


if __name__ == "__main__":
    main()
