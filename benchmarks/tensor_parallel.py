"""Tensor parallelism on the course CPU: SmolLM2 at TP 1 against TP 3 (gloo, one worker process per rank).

    python benchmarks/tensor_parallel.py [--batches 1 16 64] [--steps 8] [--prefills 3]

For each engine (TP 1 in the engine's process, TP 1 in one worker process, TP 3 in three):
- decode step time at each batch: requests of 32 prompt tokens, all decoding; the median wall of `--steps`
  steps (the engine's `StepRecord.duration`: schedule, the workers' forward, sampling), and the median time
  rank 0 spent inside all-reduce calls in those steps (`Executor.all_reduce_s`), as a share of the step;
- the prefill of one 512-token prompt in one step (prefix caching off): median of `--prefills`.

TP 1 in a worker process against TP 1 in the engine's isolates what the executor costs (a pickled
`SchedulerOutput` per step over a pipe, rank 0's logits through shared memory). Each worker runs
max(1, cores // tp) torch threads: on 2 cores, TP 3 is three one-thread processes on two cores.
Prints markdown. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import statistics

from ref_engine.engine import LLMEngine
from ref_engine.model.loader import load_model
from ref_engine.sampling_params import SamplingParams

PROMPT_TOKENS = 32
PREFILL_TOKENS = 512


def decode_steps(engine: LLMEngine, batch: int, steps: int) -> tuple[float, float]:
    """(median step seconds, median rank-0 all-reduce seconds) of `steps` decode steps at `batch`."""
    params = SamplingParams(max_tokens=steps + 4, temperature=0.0, ignore_eos=True)
    for i in range(batch):
        engine.add_request(f"d{batch}-{i}", [1000 + (17 * i + 31 * j) % 20000 for j in range(PROMPT_TOKENS)], params)
    engine.step()
    while engine.step_records[-1].query_lens != (1,) * batch:
        engine.step()  # the prefill, then one decode step as a warm-up
    walls, reduces = [], []
    for _ in range(steps):
        engine.step()
        record = engine.step_records[-1]
        assert record.query_lens == (1,) * batch, record.query_lens
        walls.append(record.duration)
        reduces.append(engine.model_executor.all_reduce_s[0])
    while engine.has_unfinished_requests():
        engine.step()
    return statistics.median(walls), statistics.median(reduces)


def prefill(engine: LLMEngine, repeats: int) -> tuple[float, float]:
    """(median seconds, median rank-0 all-reduce seconds) of one 512-token prompt's one-step prefill."""
    walls, reduces = [], []
    for i in range(repeats + 1):
        engine.add_request(f"p{i}", [1000 + (31 * j) % 20000 for j in range(PREFILL_TOKENS)],
                           SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
        engine.step()
        if i:  # the first is a warm-up
            walls.append(engine.step_records[-1].duration)
            reduces.append(engine.model_executor.all_reduce_s[0])
    return statistics.median(walls), statistics.median(reduces)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--prefills", type=int, default=3)
    args = parser.parse_args()
    loaded = load_model(None)
    engines = {"TP 1, engine's process (uni)": dict(tensor_parallel_size=1),
               "TP 1, one worker process (mp)": dict(tensor_parallel_size=1, distributed_executor_backend="mp"),
               "TP 3, three worker processes (mp)": dict(tensor_parallel_size=3, allow_cpu_oversubscription=True)}
    print("| engine | batch | step (ms) | all-reduce, rank 0 (ms) | share |")
    print("| --- | --- | --- | --- | --- |")
    for name, knobs in engines.items():
        engine = LLMEngine(loaded, max_num_seqs=max(args.batches), max_num_batched_tokens=2048,
                           num_kv_blocks=512, enable_prefix_caching=False, **knobs)
        try:
            rows = [(f"decode {batch}", *decode_steps(engine, batch, args.steps)) for batch in args.batches]
            rows.append((f"prefill {PREFILL_TOKENS}", *prefill(engine, args.prefills)))
        finally:
            engine.shutdown()
        for what, wall, reduce in rows:
            print(f"| {name} | {what} | {wall * 1e3:.1f} | {reduce * 1e3:.1f} | {reduce / wall:.0%} |", flush=True)


if __name__ == "__main__":
    main()
