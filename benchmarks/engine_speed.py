"""Engine speed per numeric path (float32, bfloat16, int8 W8A8), beside transformers, and each path's
quality against float32 on the eval set, side by side in one run.

    python benchmarks/engine_speed.py [--eval-prompts 50] [--eval-tokens 64]

(Not with OMP_WAIT_POLICY=PASSIVE, unlike the other benchmarks: a decode step runs hundreds of small
operators, and threads that sleep between them cost single-stream decode up to 2x on the course machine.)

- single stream: one prompt of 128 tokens, 128 output tokens (EOS ignored), greedy, output tok/s;
- batch 32: 32 such requests at once, output tok/s (continuous batching, all decode together);
- transformers `generate()` (float32 and bfloat16) on the same GGUF weights, the same two shapes;
- quality: `serving_lab.eval_set.compare_quality` against float32 (greedy agreement, mean KL).

Each engine number is the faster of two runs after a warm-up. Prints markdown; copy it with the machine
and the command into benchmarks/RESULTS.md ("Engine speed"). A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import platform
import time
from collections.abc import Callable

import torch
from transformers import AutoModelForCausalLM

from ref_engine import LLM, SamplingParams
from ref_engine.model.loader import LoadedModel, load_model
from ref_engine.model.store import default_model_path
from serving_lab.eval_set import compare_quality, eval_prompts

PROMPT_LEN, OUTPUT_LEN = 128, 128
PATHS = {"float32": {}, "bfloat16": {"dtype": "bfloat16"}, "int8 (W8A8)": {"quantization": "int8"}}


def prompts(batch: int) -> list[list[int]]:
    return [[1000 + (17 * i + 31 * j) % 20000 for j in range(PROMPT_LEN)] for i in range(batch)]


def fastest(run: Callable[[], None], repeats: int = 2) -> float:
    run()  # warm-up: first-call dispatch, allocations
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def engine_tok_s(loaded: LoadedModel, batch: int) -> float:
    llm = LLM(loaded, max_num_seqs=max(batch, 1))
    params = SamplingParams(max_tokens=OUTPUT_LEN, temperature=0.0, ignore_eos=True)
    batch_prompts = prompts(batch)
    return batch * OUTPUT_LEN / fastest(lambda: llm.generate(batch_prompts, params, use_tqdm=False))


def transformers_tok_s(dtype: torch.dtype, batch: int) -> float:
    path = default_model_path()
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype).eval()
    ids = torch.tensor(prompts(batch))

    def run() -> None:
        with torch.inference_mode():
            model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=OUTPUT_LEN,
                           min_new_tokens=OUTPUT_LEN, do_sample=False, pad_token_id=0)

    return batch * OUTPUT_LEN / fastest(run, repeats=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--eval-prompts", type=int, default=50, help="eval-set prompts per path (200: all)")
    parser.add_argument("--eval-tokens", type=int, default=64)
    args = parser.parse_args()
    print(f"machine: {platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads, "
          f"torch {torch.__version__}; prompt {PROMPT_LEN}, output {OUTPUT_LEN} tokens; eval "
          f"{args.eval_prompts} prompts x {args.eval_tokens} tokens")
    print("\n| system | single stream (tok/s) | batch 32 (tok/s) | greedy agreement | mean KL (nats/token) |")
    print("| --- | --- | --- | --- | --- |")
    reference = load_model(None)
    for name, kwargs in PATHS.items():
        loaded = reference if not kwargs else load_model(None, **kwargs)
        single, batched = engine_tok_s(loaded, 1), engine_tok_s(loaded, 32)
        quality = compare_quality(reference, loaded, eval_prompts(args.eval_prompts), args.eval_tokens)
        print(f"| engine, {name} | {single:.1f} | {batched:.1f} | {quality.agreement:.3f} | {quality.mean_kl:.4f} |",
              flush=True)
    for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        print(f"| transformers generate, {name} | {transformers_tok_s(dtype, 1):.1f} | "
              f"{transformers_tok_s(dtype, 32):.1f} |  |  |", flush=True)


if __name__ == "__main__":
    main()
