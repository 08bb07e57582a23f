"""Tensor parallelism on this CPU: the engine's step times at TP 1 and 3 beside the simulator's prediction.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/tensor_parallel_fidelity.py [--tp 1 3] [--repeats 2]

For each degree N one engine, `LLMEngine(tensor_parallel_size=N)` on SmolLM2-135M in float32 (above the
machine's cores with `allow_cpu_oversubscription`, the only way to run SmolLM2's 9 heads in 3 ranks on 2 cores),
serves `--repeats` passes of: decode at batch 1, 16 and 64 (B requests of 64-token prompts, 16 tokens out,
all arriving at once) and one 512-token prompt (a single prefill step). Measured per point: the median of its
steps (the decode steps at batch B; the prefill step), fastest pass kept, and the all-reduce seconds the ranks
reported for those steps (least and most over the ranks: the slowest rank waits least). Simulated:
`CostModel(..., tensor_parallel_size=N)` on this machine's calibrated profile (`load_or_calibrate`, with the
measured all-reduce, serving_lab/calibrate.py) priced on the same step shapes, with its terms; and TP N's
step over TP 1's, measured and simulated, which leaves out what the TP 1 fit itself misses. Prints one
Markdown table. benchmarks/tensor_parallel.py measures the engine alone (and TP 1 in a worker process).
A benchmark, not a test. Results: benchmarks/RESULTS.md ("The simulator against the TP engine (issue 27)").
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import time
from dataclasses import dataclass
from typing import Any

from core.arch_config import ArchConfig
from core.config import EngineConfig
from core.metrics import StepRecord
from core.workload import Workload
from serving_lab.calibrate import load_or_calibrate
from sim.cost_model import BatchShape, CostModel
from sim.hardware import HardwareProfile

DECODE_BATCHES = (1, 16, 64)
PROMPT, OUTPUT, PREFILL = 64, 16, 512
# Prefix caching off: a pass's prompts are the last pass's, and a cached prompt would skip its prefill.
CONFIG = EngineConfig(max_num_seqs=max(DECODE_BATCHES), max_num_batched_tokens=max(DECODE_BATCHES) * PROMPT,
                      num_kv_blocks=512, enable_prefix_caching=False)


@dataclass(frozen=True)
class Point:
    name: str
    workload: Workload

    def times(self, step: StepRecord) -> bool:
        """Whether this point times `step`: a decode step at the full batch, or the prefill step."""
        if self.workload.name == "prefill":
            return step.num_tokens == PREFILL
        return step.num_seqs == len(self.workload.requests) and max(step.query_lens) == 1


@dataclass(frozen=True)
class Measured:
    step_s: float  # median of the point's steps
    all_reduce_s: tuple[float, float]  # median over those steps of the least and the most over the ranks
    shape: BatchShape  # the median step's


def points() -> list[Point]:
    decode = [Point(f"decode, batch {b}", Workload.synthetic(b, prompt_len=PROMPT, output_len=OUTPUT, seed=b,
                                                            name="decode")) for b in DECODE_BATCHES]
    return decode + [Point(f"prefill, {PREFILL} tokens", Workload.synthetic(1, prompt_len=PREFILL, output_len=1, seed=0,
                                                                            name="prefill"))]


def serve(engine: Any, workload: Workload) -> list[tuple[StepRecord, tuple[float, ...]]]:
    """Every step of `workload` (all requests at once), with the all-reduce seconds each rank reported."""
    engine.reset_clock()
    for request in workload.make_requests(engine.arch.vocab_size, engine.eos_token_ids):
        engine.add_workload_request(request)
    steps = []
    while engine.has_unfinished_requests():
        engine.step()
        steps.append((engine.step_records[-1], tuple(getattr(engine.model_executor, "all_reduce_s", (0.0,)))))
    return steps


def measure(model: Any, tp: int, repeats: int) -> dict[str, Measured]:
    """Each point's fastest pass on an engine of `tp` ranks."""
    from ref_engine.distributed.parallel_state import cpu_cores
    from ref_engine.engine import LLMEngine

    engine = LLMEngine(model, config=CONFIG, tensor_parallel_size=tp, allow_cpu_oversubscription=tp > cpu_cores())
    try:
        serve(engine, points()[0].workload)  # throw-away: first-call costs
        best: dict[str, Measured] = {}
        for _ in range(repeats):
            for point in points():
                steps = [(s, ar) for s, ar in serve(engine, point.workload) if point.times(s)]
                ordered = sorted(steps, key=lambda sa: sa[0].duration)
                median_step = ordered[len(ordered) // 2][0]
                result = Measured(statistics.median(s.duration for s, _ in steps),
                                  (statistics.median(min(ar) for _, ar in steps),
                                   statistics.median(max(ar) for _, ar in steps)),
                                  BatchShape.from_step(median_step))
                if point.name not in best or result.step_s < best[point.name].step_s:
                    best[point.name] = result
        return best
    finally:
        engine.model_executor.shutdown()


def table(profile: HardwareProfile, arch: ArchConfig, measured: dict[int, dict[str, Measured]]) -> str:
    lines = ["| point | TP | measured ms | simulated ms | error | TP N / TP 1 measured / simulated | tok/s measured / "
             "simulated | simulated compute + memory / comm / overhead ms | measured all-reduce ms (ranks) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    simulated = {tp: {name: CostModel(arch, profile, dtype="float32", tensor_parallel_size=tp,
                                      block_size=CONFIG.block_size).breakdown(m.shape)
                      for name, m in results.items()} for tp, results in measured.items()}
    for tp, results in measured.items():
        for name, m in results.items():
            cost = simulated[tp][name]
            ratio = (f"{m.step_s / measured[1][name].step_s:.2f} / {cost.total_s / simulated[1][name].total_s:.2f}"
                     if 1 in measured else "")
            tokens = m.shape.num_tokens
            lines.append(
                f"| {name} | {tp} | {m.step_s * 1e3:.1f} | {cost.total_s * 1e3:.1f} | "
                f"{100 * (cost.total_s / m.step_s - 1):+.0f}% | {ratio} | {tokens / m.step_s:.0f} / "
                f"{tokens / cost.total_s:.0f} | {(cost.compute_s + cost.memory_s) * 1e3:.1f} / {cost.comm_s * 1e3:.1f} / "
                f"{cost.overhead_s * 1e3:.1f} (turns x{cost.tp_turns:.2f}) | {m.all_reduce_s[0] * 1e3:.1f}-{m.all_reduce_s[1] * 1e3:.1f} |")
    return "\n".join(lines)


def main() -> None:
    from ref_engine.model.loader import load_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tp", type=int, nargs="+", default=[1, 3], help="tensor-parallel degrees")
    parser.add_argument("--repeats", type=int, default=2, help="passes over the points; the fastest is kept")
    args = parser.parse_args()
    started = time.perf_counter()
    loaded = load_model(dtype="float32")
    profile = load_or_calibrate(loaded)
    measured = {tp: measure(loaded, tp, args.repeats) for tp in args.tp}
    allreduce = ", ".join(f"{p} processes {lat * 1e6:.0f} us + bytes / {bw / 1e9:.2f} GB/s"
                          for p, (lat, bw) in sorted(profile.measured_allreduce.items()))
    print(f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} logical CPUs; "
          f"{datetime.datetime.now().isoformat(timespec='minutes')}; {loaded.model_id} float32; profile "
          f"{profile.name} fitted {profile.provenance.get('fitted_at')} (all-reduce: {allreduce}; time slice "
          f"{profile.scheduler_slice_s * 1e3:.2f} ms); fastest of "
          f"{args.repeats} passes; OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '')}; "
          f"{time.perf_counter() - started:.0f} s\n")
    print(table(profile, loaded.arch, measured))


if __name__ == "__main__":
    main()
