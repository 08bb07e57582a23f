"""What sampling costs the engine per step: the sampler (ref_engine/sampler.py) on one step's logits, by what the
batch's requests ask for, against the model's own decode step at the same batch.

    python benchmarks/sampler.py [--batches 1 64] [--threads 1] [--repeats 20]

Logits are random float32 rows of SmolLM2's vocabulary (49,152). Cases: every row greedy; temperature only;
top-p 0.9 (one sort per row); top-k 50 with top-p 0.9 (the same sort); min-p 0.05; greedy with 5 logprobs
(a full log-softmax and a top-5); temperature with a seed per request (each row draws its noise from its own
generator, a Python loop). The decode step is the engine's median decode step at that batch (`bench.run`: greedy, 64-token
prompts, 32 new tokens), from its step records. Prints the median over repeats of each case in ms and
as a share of the decode step, and markdown for benchmarks/RESULTS.md. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

from core.config import EngineConfig
from core.workload import Workload
from ref_engine import SamplingParams, bench
from ref_engine.model.loader import LoadedModel, load_model
from ref_engine.sampler import Sampler, SamplingMetadata

VOCAB = 49_152
CASES = {
    "greedy": SamplingParams(temperature=0),
    "temperature 0.8": SamplingParams(temperature=0.8),
    "top-p 0.9": SamplingParams(temperature=0.8, top_p=0.9),
    "top-k 50 + top-p 0.9": SamplingParams(temperature=0.8, top_k=50, top_p=0.9),
    "min-p 0.05": SamplingParams(temperature=0.8, min_p=0.05),
    "greedy + 5 logprobs": SamplingParams(temperature=0, logprobs=5),
    "temperature 0.8, a seed per request": SamplingParams(temperature=0.8, seed=1),
}


def sampler_ms(batch: int, params: SamplingParams, repeats: int) -> float:
    sampler = Sampler(seed=0)
    generators = [torch.Generator().manual_seed(i) if params.seed is not None else None for i in range(batch)]
    meta = SamplingMetadata.build([params] * batch, generators, [8] * batch, {0}, "cpu")
    logits = torch.randn(batch, VOCAB, generator=torch.Generator().manual_seed(0)) * 3
    sampler(logits, meta)  # warm-up
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        sampler(logits, meta)
        times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


def decode_step_ms(loaded: LoadedModel, batch: int) -> float:
    config = EngineConfig(max_num_seqs=batch, max_num_batched_tokens=max(512, 64 * batch))
    steps = bench.run(Workload.synthetic(batch, 64, 32), config, model=loaded).steps
    decode = [s.duration for s in steps if s.num_seqs == batch and s.num_tokens == batch]
    return 1000 * statistics.median(decode)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    loaded = load_model()
    print(f"Machine: {platform.machine()}, Python {platform.python_version()}, torch {torch.__version__}, "
          f"{args.threads} thread(s); `python benchmarks/sampler.py --batches {' '.join(map(str, args.batches))} "
          f"--threads {args.threads} --repeats {args.repeats}`; SmolLM2-135M-Instruct float32, vocabulary {VOCAB:,}.\n")
    steps = {batch: decode_step_ms(loaded, batch) for batch in args.batches}
    header = " | ".join(f"batch {b}: ms (share of a {steps[b]:.1f} ms decode step)" for b in args.batches)
    print(f"| what the requests ask for | {header} |")
    print("| --- |" + " --- |" * len(args.batches))
    for name, params in CASES.items():
        cells = []
        for batch in args.batches:
            ms = sampler_ms(batch, params, args.repeats)
            cells.append(f"{ms:.2f} ({100 * ms / steps[batch]:.1f}%)")
        print(f"| {name} | {' | '.join(cells)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
