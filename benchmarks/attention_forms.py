"""Decode attention through the paged cache, split: the block gather against the attention math, and two
other pure-torch formulations of the same step, for SmolLM2's 30 layers.

    python benchmarks/attention_forms.py [--batches 16 64] [--context 128] [--threads N] [--repeats 7]

For B requests each decoding one token after `--context` cached tokens, with their blocks scattered over the
pool as a serving engine leaves them, it times a whole step's worth (30 layers) of:

- **engine**: what `ref_engine.attention` runs per layer: gather each request's blocks (`index_select`), then
  one masked `scaled_dot_product_attention`;
- **gather only** and **SDPA only**: the two halves of it, to see which one the time is;
- **one gather for all layers**: the same bytes copied by one `index_select` over a cache stacked across layers
  (what "gather once per step" would cost at best: the new token's K/V still has to join it per layer);
- **einsum + softmax**: the engine's gather, then attention as two einsums and a softmax instead of SDPA.

It prints milliseconds per step (median of `--repeats`) and the gather's bytes per second. A benchmark, not a
test; results in benchmarks/RESULTS.md ("Attention without the per-layer copy").
"""

from __future__ import annotations

import argparse
import platform
from collections.abc import Callable

import torch
import torch.nn.functional as F
from step_profile import median_wall

from core.arch_config import ArchConfig

BLOCK_SIZE = 16


def median_ms(run: Callable[[], object], repeats: int) -> float:
    """Median milliseconds of `repeats` calls after one warm-up call."""
    run()
    return median_wall(run, repeats) * 1e3


def forms(arch: ArchConfig, batch: int, context: int) -> tuple[dict[str, Callable[[], object]], int]:
    """The step's attention in each form, and the bytes one layer's gather copies."""
    layers, kv_heads, head_dim = arch.num_layers, arch.num_kv_heads, arch.head_dim
    group = arch.num_attention_heads // kv_heads
    blocks_per_req = -(-(context + 1) // BLOCK_SIZE)
    pool = 2 * batch * blocks_per_req  # half the pool in use, the requests' blocks shuffled through it
    tables = torch.randperm(pool)[: batch * blocks_per_req].view(batch, blocks_per_req)
    stacked = torch.randn(layers, 2, pool, BLOCK_SIZE, kv_heads, head_dim)
    caches = list(stacked.unbind(0))
    q = torch.randn(batch, kv_heads, group, head_dim)
    width = blocks_per_req * BLOCK_SIZE
    mask = (torch.arange(width) < context + 1)[None, None, None, :].expand(batch, 1, 1, width)
    flat = tables.flatten()
    scale = head_dim**-0.5

    def gather(cache: torch.Tensor) -> torch.Tensor:
        kv = cache.index_select(1, flat).view(2, batch, width, kv_heads, head_dim)
        return kv.transpose(2, 3)  # [2, B, Hkv, ctx, D]

    gathered = gather(caches[0])

    def engine() -> None:
        for cache in caches:
            kv = gather(cache)
            F.scaled_dot_product_attention(q, kv[0], kv[1], attn_mask=mask, scale=scale)

    def gather_only() -> None:
        for cache in caches:
            gather(cache)

    def sdpa_only() -> None:
        for _ in caches:
            F.scaled_dot_product_attention(q, gathered[0], gathered[1], attn_mask=mask, scale=scale)

    def one_gather() -> None:
        stacked.index_select(2, flat)

    def einsum_softmax() -> None:
        for cache in caches:
            kv = gather(cache)
            scores = torch.einsum("bhgd,bhkd->bhgk", q, kv[0]) * scale
            probs = scores.masked_fill(~mask, float("-inf")).softmax(-1)
            torch.einsum("bhgk,bhkd->bhgd", probs, kv[1])

    runs = {"engine (gather + SDPA)": engine, "gather only": gather_only, "SDPA only": sdpa_only,
            "one gather for all layers": one_gather, "gather + einsum + softmax": einsum_softmax}
    return runs, gathered.numel() * gathered.element_size()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    arch = ArchConfig.named("smollm2-135m")
    print(f"machine: {platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; {arch.name} shapes ({arch.num_layers} layers, {arch.num_kv_heads} KV "
          f"heads of {arch.head_dim}), float32, block size {BLOCK_SIZE}, context {args.context}; ms per step")
    results: dict[int, dict[str, float]] = {}
    bytes_per_layer: dict[int, int] = {}
    for batch in args.batches:
        runs, bytes_per_layer[batch] = forms(arch, batch, args.context)
        results[batch] = {name: median_ms(run, args.repeats) for name, run in runs.items()}
    print("\n| ms per step (30 layers) | " + " | ".join(f"batch {b}" for b in results) + " |")
    print("| --- |" + " --- |" * len(results))
    for name in next(iter(results.values())):
        print(f"| {name} | " + " | ".join(f"{r[name]:.1f}" for r in results.values()) + " |")
    print("| gather: GB/s copied | " + " | ".join(
        f"{arch.num_layers * bytes_per_layer[b] / r['gather only'] / 1e6:.1f}" for b, r in results.items()) + " |")


if __name__ == "__main__":
    main()
