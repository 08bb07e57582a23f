"""What one decode row of one step costs in CPython at the least: the floor under the core scheduler's speed.

    python benchmarks/per_row_floor.py [--rows 256] [--steps 2000]
    python benchmarks/per_row_floor.py --fleet-steps 8673221 --fleet-rows 28078200   # a whole fleet run's floor

The simulator's speed is the core scheduler's per-row work: `benchmarks/sim_speed.py` runs 2.58 million
request-steps (a request scheduled in a step), and the scheduler, its output rows and the step's update take
most of its time. This benchmark prices the same work for pure decode rows in one fused loop with nothing
else: is the next token the last known one, does the block table have room, emit the row (id, token,
position, table, logits flag), sum the context for the cost model, append the sampled token and its time,
advance the computed count. No phases, no policy hooks, no row objects, no second pass. The gap between this
floor and the core's own cost per request-step is what the core's readable structure costs (RESULTS.md,
"sim-speed-floor").

A fleet adds a floor per step: each replica's engine loop is a SimPy process, and every step is one timeout
event that SimPy queues and resumes. `--fleet-steps` times that alone (16 processes yielding timeouts, nothing
else) and prints what a run of that many steps and `--fleet-rows` request-steps costs at the two floors. A
benchmark, not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import platform
import time
from dataclasses import dataclass, field

import simpy


@dataclass(eq=False)
class DecodingRequest:
    """The fields a decode step reads and writes, as `core.request.Request` holds them."""

    request_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)
    num_computed_tokens: int = 0


def fused_step(running: list[DecodingRequest], block_tables: dict[str, list[int]], block_size: int,
               now: float) -> tuple[list[tuple[str, list[int], int, list[int], bool]], int]:
    """Schedule, emit and update every decoding row in one pass; returns the rows and the context summed."""
    rows, context = [], 0
    for request in running:
        start = request.num_computed_tokens
        if len(request.prompt_token_ids) + len(request.output_token_ids) - start != 1:
            continue
        table = block_tables[request.request_id]
        if len(table) * block_size <= start:
            table = block_tables[request.request_id] = [*table, len(table)]
        rows.append((request.request_id, request.output_token_ids[-1:] or request.prompt_token_ids[-1:], start,
                     table, True))
        context += start
        request.output_token_ids.append(0)
        request.token_times.append(now)
        request.num_computed_tokens = start + 1
    return rows, context


def simpy_step_floor(replicas: int = 16, steps: int = 200_000) -> float:
    """Seconds of SimPy's own work per replica step: `replicas` processes each yielding `steps / replicas`
    timeouts of slightly different lengths (so their events interleave, as replicas' steps do)."""

    def engine_loop(env: simpy.Environment, n: int, step_s: float):  # noqa: ANN202 (a SimPy process)
        for _ in range(n):
            yield env.timeout(step_s)

    env = simpy.Environment()
    for i in range(replicas):
        env.process(engine_loop(env, steps // replicas, 0.01 + i * 1e-4))
    start = time.process_time()
    env.run()
    return (time.process_time() - start) / (steps // replicas * replicas)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=256, help="requests decoding in every step")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--fleet-steps", type=int, help="a fleet run's replica steps (fleet_scale.py prints them)")
    parser.add_argument("--fleet-rows", type=int, default=0, help="and its request-steps")
    args = parser.parse_args()
    running = [DecodingRequest(str(i), [1] * 500, num_computed_tokens=499) for i in range(args.rows)]
    block_tables = {r.request_id: list(range(32)) for r in running}
    start = time.process_time()
    for step in range(args.steps):
        fused_step(running, block_tables, 16, float(step))
    per_row = (time.process_time() - start) / (args.steps * args.rows)
    print(f"{platform.machine()}, Python {platform.python_version()}: {per_row * 1e6:.2f} us per request-step "
          f"({args.rows} rows x {args.steps} steps); sim_speed's 2.58M request-steps would take "
          f"{per_row * 2.58e6:.1f} s")
    if args.fleet_steps:
        per_step = simpy_step_floor()
        print(f"SimPy: {per_step * 1e6:.2f} us per replica step; {args.fleet_steps:,} steps and {args.fleet_rows:,} "
              f"request-steps: at least {per_step * args.fleet_steps:.1f} + {per_row * args.fleet_rows:.1f} = "
              f"{per_step * args.fleet_steps + per_row * args.fleet_rows:.1f} s")


if __name__ == "__main__":
    main()
