"""Output tokens/s on a mixed workload: continuous vs static scheduling in our engine, and transformers'
`generate()` in static batches of the same size, on the same weights and the same prompts.

    python benchmarks/throughput.py [--dtype float32|bfloat16] [--batch-size 16] [--num-requests 64]
    python benchmarks/throughput.py --paths float32 bfloat16 int8 int4   # each numeric path, continuous only,
                                                                         # against transformers' best (fp32, bf16)
    python benchmarks/throughput.py --paths bfloat16 --batch-sizes 16 32 64   # each path and transformers at each
                                                                              # batch size; the ratio against
                                                                              # transformers' best of all
    python benchmarks/throughput.py --split bfloat16 --batch-size 64   # the same workload split into its prompts
                                                                       # and its decodes: what the engine's own
                                                                       # kernels leave room for

Prints one table; copy it with the machine and the command into benchmarks/RESULTS.md.
Each system produces exactly the workload's output lengths (ignore_eos); transformers runs each static
batch until its longest member is done, and only the tokens a request asked for count as output.
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import time

import torch
from transformers import AutoModelForCausalLM

from core import EngineConfig, Workload
from ref_engine import bench
from ref_engine.model.loader import load_model
from ref_engine.model.store import default_model_path


def transformers_static(workload: Workload, vocab_size: int, batch_size: int, dtype: torch.dtype) -> dict:
    path = default_model_path()
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype).eval()
    requests = workload.make_requests(vocab_size)
    pad = 0
    start = time.perf_counter()
    for i in range(0, len(requests), batch_size):
        batch = requests[i: i + batch_size]
        width = max(r.num_prompt_tokens for r in batch)
        ids = torch.tensor([[pad] * (width - r.num_prompt_tokens) + r.prompt_token_ids for r in batch])
        mask = torch.tensor([[0] * (width - r.num_prompt_tokens) + [1] * r.num_prompt_tokens for r in batch])
        longest = max(r.max_tokens for r in batch)
        with torch.inference_mode():
            model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=longest, min_new_tokens=longest,
                           do_sample=False, pad_token_id=pad)
    duration = time.perf_counter() - start
    return {"duration": duration, "output_throughput": workload.total_output_tokens / duration}


PATHS = {"float32": ("float32", None), "bfloat16": ("bfloat16", None), "int8": ("float32", "int8"),
         "int4": ("float32", "int4")}  # path -> (dtype, quantization), as the manifest's engine keys set them


def at_batch(config: EngineConfig, batch: int) -> EngineConfig:
    """`config` at `batch` sequences, with a pool that holds every member's whole sequence (no preemption)."""
    return config.replace(max_num_seqs=batch, num_kv_blocks=max(2048, 48 * batch))


def split(workload: Workload) -> tuple[Workload, Workload]:
    """The workload's prompts alone (each request asks for one token) and its decodes alone (each request's own
    output length after a one-token prompt): the two halves a continuous engine interleaves."""
    prompts = tuple(dataclasses.replace(w, output_len=1) for w in workload.requests)
    decodes = tuple(dataclasses.replace(w, prompt_len=1) for w in workload.requests)
    return dataclasses.replace(workload, requests=prompts), dataclasses.replace(workload, requests=decodes)


def split_rows(workload: Workload, config: EngineConfig, path: str, transformers_batch: int) -> dict:
    """The engine on the whole workload, on its prompts alone and on its decodes alone, and transformers' static
    batches (bfloat16) on the whole. The halves' sum is about the least a scheduler can make of these kernels: the
    whole needs every prompt row and every decode row (decodes then read longer contexts), and interleaving saves
    only what the decode rows that ride in a prompt's step would have cost on their own."""
    dtype, quantization = PATHS[path]
    model = load_model(None, dtype=dtype, quantization=quantization)
    prompts, decodes = split(workload)
    rows = {}
    for name, part in [("whole workload", workload), ("prompts alone (1 output token each)", prompts),
                       ("decodes alone (1-token prompts, the same outputs)", decodes)]:
        m = bench.run(part, config, model=model)
        rows[f"engine continuous, {path}, {name}"] = {"duration": m.duration, "output_throughput": m.output_throughput}
    del model
    rows[f"transformers generate (static), bfloat16, batch {transformers_batch}, whole workload"] = \
        transformers_static(workload, 49152, transformers_batch, torch.bfloat16)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--paths", nargs="+", choices=list(PATHS),
                        help="compare numeric paths instead (engine continuous each; transformers float32 and bfloat16)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--batch-sizes", type=int, nargs="+",
                        help="with --paths: run every path and transformers at each of these batch sizes")
    parser.add_argument("--split", choices=list(PATHS),
                        help="one path at --batch-size: the whole workload, its prompts alone and its decodes alone; "
                             "transformers bfloat16 at --transformers-batch-size")
    parser.add_argument("--transformers-batch-size", type=int, default=32,
                        help="with --split: transformers' batch (32 was its best, benchmarks/RESULTS.md)")
    parser.add_argument("--max-num-batched-tokens", type=int, default=512, help="the engine's token budget a step")
    parser.add_argument("--num-requests", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    workload = Workload.synthetic(args.num_requests, prompt_len=(32, 512), output_len=(16, 256), seed=args.seed)
    config = EngineConfig(max_num_seqs=args.batch_size, max_num_batched_tokens=args.max_num_batched_tokens,
                          num_kv_blocks=2048)
    rows = {}
    if args.split:
        rows = split_rows(workload, at_batch(config, args.batch_size), args.split, args.transformers_batch_size)
    elif args.paths:
        batch_sizes = args.batch_sizes or [args.batch_size]
        label = (lambda b: f", batch {b}") if len(batch_sizes) > 1 else (lambda b: "")
        for path in args.paths:
            dtype, quantization = PATHS[path]
            model = load_model(None, dtype=dtype, quantization=quantization)
            for b in batch_sizes:
                m = bench.run(workload, at_batch(config, b), model=model)
                rows[f"engine continuous, {path}{label(b)}"] = {"duration": m.duration,
                                                                "output_throughput": m.output_throughput}
            del model
        for dtype in ("float32", "bfloat16"):
            for b in batch_sizes:
                rows[f"transformers generate (static), {dtype}{label(b)}"] = transformers_static(
                    workload, 49152, b, getattr(torch, dtype))
    else:
        loaded = load_model(None, dtype=args.dtype)
        for name, cfg in [("continuous", config), ("static", config.replace(scheduling="static"))]:
            m = bench.run(workload, cfg, model=loaded)
            rows[f"engine {name}"] = {"duration": m.duration, "output_throughput": m.output_throughput}
        del loaded
        rows["transformers generate (static)"] = transformers_static(
            workload, 49152, args.batch_size, getattr(torch, args.dtype))

    print(f"machine: {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, "
          f"torch {torch.__version__}, " + (f"path {args.split}" if args.split else f"paths {' '.join(args.paths)}"
                                            if args.paths else f"dtype {args.dtype}"))
    print(f"workload: {args.num_requests} requests, prompts 32-512, outputs 16-256 (seed {args.seed}), "
          f"{workload.total_output_tokens} output tokens, batch size "
          f"{' '.join(map(str, args.batch_sizes)) if args.paths and args.batch_sizes else args.batch_size}, "
          f"token budget {args.max_num_batched_tokens}")
    if args.split:
        halves = [r["duration"] for name, r in rows.items() if "alone" in name]
        best = min(r["duration"] for name, r in rows.items() if name.startswith("transformers"))
        print(f"prompts alone + decodes alone: {sum(halves):.1f} s, at most {best / sum(halves):.2f}x transformers' "
              f"{best:.1f} s (less what rides free in the prompts' steps)")
    print("| system | duration (s) | output tok/s | vs transformers' best |")
    print("| --- | --- | --- | --- |")
    ref = max(r["output_throughput"] for name, r in rows.items() if name.startswith("transformers"))
    for name, r in rows.items():
        print(f"| {name} | {r['duration']:.1f} | {r['output_throughput']:.1f} | {r['output_throughput'] / ref:.2f}x |")


if __name__ == "__main__":
    main()
