"""What `enforce_eager=False` (the decoder through torch.compile, ref_engine/model/compile.py) costs and buys.

    python benchmarks/compile.py [--threads 1] [--batches 1 16 64] [--steps 8] [--rounds 3]

- compile time: building a compiled engine less building an eager one, in two fresh processes that share a
  new, empty inductor cache folder: the first compiles cold, the second finds inductor's on-disk cache warm;
- decode step time at each batch (requests of 128 prompt tokens, all decoding), eager and compiled engines on
  the same weights in one process, alternating: `--rounds` rounds of each, median wall of `--steps` steps per
  round; the table gives the median round and the range;
- token-exactness on SmolLM2: greedy outputs of the first 4 eval-set prompts, 32 tokens, compiled vs eager.

Prints markdown for benchmarks/RESULTS.md ("Compiling the decoder"). A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import sys
import tempfile
import time

import torch
from step_profile import decode_engine, median_wall

from ref_engine import LLM, SamplingParams
from ref_engine.engine import LLMEngine
from ref_engine.model.loader import load_model
from serving_lab.eval_set import eval_prompts


def startup_seconds(threads: int) -> float:
    """Seconds a compiled engine takes to build beyond an eager one (this process's compiling)."""
    torch.set_num_threads(threads)
    loaded = load_model(None)
    seconds = {}
    for enforce_eager in (True, False):
        start = time.perf_counter()
        LLMEngine(loaded, enforce_eager=enforce_eager)
        seconds[enforce_eager] = time.perf_counter() - start
    return seconds[False] - seconds[True]


def compile_seconds(threads: int) -> tuple[float, float]:
    """(cold, warm): the compile time of a first and a second process on one new inductor cache folder."""
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
        runs = [subprocess.run([sys.executable, __file__, "--startup", "--threads", str(threads)], env=env,
                               check=True, capture_output=True, text=True) for _ in range(2)]
    cold, warm = (float(run.stdout.split()[-1]) for run in runs)
    return cold, warm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--startup", action="store_true", help=argparse.SUPPRESS)  # one compile_seconds process
    args = parser.parse_args()
    if args.startup:
        print(f"{startup_seconds(args.threads):.2f}")
        return
    torch.set_num_threads(args.threads)
    print(f"machine: {platform.processor() or platform.machine()}, torch {torch.__version__}, {args.threads} "
          f"threads; {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC")
    cold, warm = compile_seconds(args.threads)
    print(f"compile time at engine start: {cold:.1f} s cold, {warm:.1f} s with inductor's cache warm")
    loaded = load_model(None)
    print(f"\n| decode step, ms (median round, range of {args.rounds}) | eager | compiled | compiled / eager |")
    print("| --- | --- | --- | --- |")
    for batch in args.batches:
        engines = {eager: decode_engine(loaded, batch, "auto", enforce_eager=eager) for eager in (True, False)}
        walls: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(args.rounds):
            for eager, engine in engines.items():
                engine.step()  # warm-up
                walls[eager].append(1e3 * median_wall(engine.step, args.steps))
        eager_ms, compiled_ms = (sorted(walls[e])[len(walls[e]) // 2] for e in (True, False))
        cells = [f"{sorted(walls[e])[len(walls[e]) // 2]:.1f} ({min(walls[e]):.1f}-{max(walls[e]):.1f})"
                 for e in (True, False)]
        print(f"| batch {batch} | {cells[0]} | {cells[1]} | {compiled_ms / eager_ms:.2f} |", flush=True)
    prompts = [loaded.tokenizer.apply_chat_template([{"role": "user", "content": p}]) for p in eval_prompts(4)]
    params = SamplingParams(max_tokens=32, temperature=0.0)
    outputs = [[o.outputs[0].token_ids for o in LLM(loaded, enforce_eager=eager).generate(prompts, params,
                                                                                          use_tqdm=False)]
               for eager in (True, False)]
    print(f"\ntoken-exact on SmolLM2 (4 eval prompts, 32 greedy tokens): {outputs[0] == outputs[1]}")


if __name__ == "__main__":
    main()
