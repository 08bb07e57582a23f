"""What a speculative verify step costs the engine, and where: one forward pass (model and LM head) over
three shapes at the same context, split by `benchmarks/step_profile.py`'s categories.

    python benchmarks/verify_cost.py [--k 5] [--context 150] [--threads 1] [--repeats 10]

- decode: 1 request, 1 row (logits on it);
- verify: 1 request, 1 + k rows (logits on all of them: every draft is scored), the shape of a speculative
  step at batch 1; the engine runs it on attention's multi-token path (`paged_attention`);
- decode x (1 + k): 1 + k requests, 1 row each, on the batched decode path: the same rows of matrix products.

Prints the median wall time of each and its milliseconds per category, and the verify's cost in decode steps,
which lesson 5 compares with the calibrated profile's price. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import platform

import torch
from step_profile import CATEGORIES, median_wall, seconds_by_category

from ref_engine.attention import AttentionMetadata, allocate_kv_cache
from ref_engine.model.loader import LoadedModel, load_model

BLOCK_SIZE = 16


@torch.inference_mode()
def forward(loaded: LoadedModel, kv_caches: list[torch.Tensor], query_lens: list[int], context: int,
            all_rows_logits: bool) -> None:
    """One forward pass of requests with these query lengths, each after `context` cached tokens, then the
    LM head on each request's last row (or on every row)."""
    seq_lens = [context + q for q in query_lens]
    blocks = -(-max(seq_lens) // BLOCK_SIZE)
    tables = [list(range(r * blocks, (r + 1) * blocks)) for r in range(len(query_lens))]
    meta = AttentionMetadata.build(query_lens, seq_lens, tables, BLOCK_SIZE)
    positions = torch.cat([torch.arange(context, s) for s in seq_lens])
    hidden = loaded.model(torch.full((len(positions),), 1000), positions, kv_caches, meta)
    last_rows = torch.arange(len(positions)) if all_rows_logits else torch.cumsum(torch.tensor(query_lens), 0) - 1
    loaded.model.compute_logits(hidden[last_rows])


def measure(loaded: LoadedModel, query_lens: list[int], context: int, all_rows_logits: bool,
            repeats: int) -> dict[str, float]:
    """Median wall milliseconds of the pass, and milliseconds per category under the profiler."""
    blocks = len(query_lens) * -(-(context + max(query_lens)) // BLOCK_SIZE)
    kv_caches = allocate_kv_cache(loaded.arch, blocks, BLOCK_SIZE, torch.float32)

    def run() -> None:
        forward(loaded, kv_caches, query_lens, context, all_rows_logits)

    run()  # warm-up
    wall = median_wall(run, repeats)
    result = {name: seconds * 1e3 for name, seconds in seconds_by_category(run, repeats).items()}
    result["wall"] = wall * 1e3
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--k", type=int, default=5, help="draft tokens per verify")
    parser.add_argument("--context", type=int, default=150, help="cached tokens before the step")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    loaded = load_model(None)
    rows = 1 + args.k
    shapes = {"decode (1 row)": ([1], False), f"verify (1 request, {rows} rows)": ([rows], True),
              f"decode x {rows} (1 row each)": ([1] * rows, False)}
    columns = {name: measure(loaded, q, args.context, logits, args.repeats) for name, (q, logits) in shapes.items()}
    print(f"machine: {platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; {loaded.model_id} float32; context {args.context}; median of "
          f"{args.repeats} passes, categories from torch.profiler")
    print("\n| ms per forward pass | " + " | ".join(columns) + " |")
    print("| --- |" + " --- |" * len(columns))
    for row in [*CATEGORIES, "wall"]:
        print(f"| {row} | " + " | ".join(f"{c[row]:.1f}" for c in columns.values()) + " |")
    decode, verify = list(columns.values())[:2]
    print(f"\nverify / decode: {verify['wall'] / decode['wall']:.2f} plain decode steps; of the difference, "
          f"matmuls {verify['matmuls'] - decode['matmuls']:.1f} ms, attention "
          f"{verify['attention'] - decode['attention']:.1f} ms")


if __name__ == "__main__":
    main()
