"""Lesson 2's demo: the same KV pool and workload under contiguous (max_model_len reserved up front),
contiguous-exact (an oracle) and paged allocation (`allocation_modes`): the core decides the same steps on
both sides, so requests per step match exactly and only times differ; then the simulated H100 picture.

Lesson: lessons/02-paged-attention.md#reservation-waste
"""

from __future__ import annotations

from serving_lab.demos.common import GPU, DemoContext, DemoReport, gpu_name, plot_comparison, side_by_side
from serving_lab.experiments import allocation_modes, kv_cache_sizes, plot_memory

PRESETS = {
    "full": dict(repeats=2, alloc=dict(num_requests=8, prompt_len=(56, 88), output_len=(4, 24), num_kv_blocks=40,
                                       max_model_len=256)),
    "fast": dict(repeats=1, alloc=dict(num_requests=4, prompt_len=(8, 16), output_len=(2, 6), num_kv_blocks=6,
                                       max_model_len=64)),
}
# notebook 02's full sizes, on the GPU profile
GPU_ALLOC = dict(num_requests=64, prompt_len=(200, 400), output_len=(16, 256), num_kv_blocks=1024, max_model_len=2048,
                 max_num_seqs=64)


def run(context: DemoContext) -> DemoReport:
    p = context.preset(PRESETS)
    rows = allocation_modes(context.sides(p["repeats"]), **p["alloc"])
    gpu = {r["allocation"]: r for r in allocation_modes(GPU, **GPU_ALLOC)}
    (fit,) = kv_cache_sizes([GPU.arch], hardware=GPU.hardware, seq_len=2048)
    labels = ("allocation",)
    comparison = side_by_side(rows, labels, ("mean_batch", "output_throughput"))
    figure, (memory,) = plot_comparison(comparison, labels, f"one KV pool of {p['alloc']['num_kv_blocks']} blocks, "
                                        "three allocators (requests per step: decided by the core, equal on both sides)")
    for row in rows:
        if row["side"] == "measured":
            plot_memory(memory, row["metrics"], label=row["allocation"])
    memory.set_title("measured: live tokens (solid) vs reserved slots (dashed)", fontsize=9)
    memory.legend(fontsize=6)
    live = ", ".join(f"{r['allocation']} {r['live_fraction']:.0%}" for r in rows if r["side"] == "measured")
    return DemoReport(comparison, labels, figure, notes=[
        f"share of reserved KV slots holding a live token (both sides alike): {live}",
        f"GPU what-if, {gpu_name()}: paged / contiguous throughput "
        f"{gpu['paged']['output_throughput'] / gpu['contiguous']['output_throughput']:.2f}x, mean batch "
        f"{gpu['paged']['mean_batch']:.1f} vs {gpu['contiguous']['mean_batch']:.1f} in the same "
        f"{GPU_ALLOC['num_kv_blocks']}-block pool ({GPU_ALLOC['num_requests']} requests, prompts "
        f"{'-'.join(map(str, GPU_ALLOC['prompt_len']))}, outputs {'-'.join(map(str, GPU_ALLOC['output_len']))})",
        f"  the KV room of {fit['where']}: {fit['seqs_that_fit']} 2048-token sequences of {fit['model']} in "
        f"{fit['dtype']} ({fit['kv_mib_per_seq']:.0f} MiB of KV each)",
    ])
