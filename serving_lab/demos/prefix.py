"""Lesson 4's demo: requests sharing a system prompt, with prefix caching off and on, after one warm-up
request (`shared_prefix_ttft`). The core decides the hits, so both sides hit the same tokens; with the cache
warm, TTFT stops growing with the prefix. Then the same on a simulated H100 with the papers' prefix lengths.

Lesson: lessons/04-prefix-caching.md#ttft-and-throughput
"""

from __future__ import annotations

from serving_lab.demos.common import GPU, DemoContext, DemoReport, gpu_name, plot_comparison, side_by_side
from serving_lab.experiments import shared_prefix_ttft

PRESETS = {
    "full": dict(prefix_lens=(0, 128, 256), repeats=2, requests_per_group=4, suffix_len=32, output_len=4),
    "fast": dict(prefix_lens=(0, 32), repeats=1, requests_per_group=2, suffix_len=8, output_len=2, num_kv_blocks=32),
}
GPU_PREFIX_LENS = (0, 512, 1024, 2048)
GPU_TTFT = dict(requests_per_group=16, suffix_len=50, output_len=64, num_kv_blocks=8192)  # as notebook 04's


def run(context: DemoContext) -> DemoReport:
    p = dict(context.preset(PRESETS))
    rows = shared_prefix_ttft(p.pop("prefix_lens"), context.sides(p.pop("repeats")), **p)
    gpu = {(r["prefix_len"], r["caching"]): r for r in shared_prefix_ttft(GPU_PREFIX_LENS, GPU, **GPU_TTFT)}
    labels = ("prefix_len", "caching")
    comparison = side_by_side(rows, labels, ("mean_ttft_ms", "prefix_cache_hits"))
    figure, (what_if,) = plot_comparison(comparison, labels, f"{p['requests_per_group']} requests sharing a system "
                                         "prompt, prefix caching off vs on (hits: decided by the core)")
    for caching in (False, True):
        what_if.plot(GPU_PREFIX_LENS, [gpu[(n, caching)]["mean_ttft_ms"] for n in GPU_PREFIX_LENS], "o-",
                     label=f"caching {'on' if caching else 'off'}")
    what_if.set(xlabel="shared prefix (tokens)", ylabel="mean TTFT (ms)", title=gpu_name())
    what_if.legend(fontsize=7)
    longest = GPU_PREFIX_LENS[-1]
    cold, warm = gpu[(longest, False)], gpu[(longest, True)]
    return DemoReport(comparison, labels, figure, notes=[
        f"GPU what-if, {gpu_name()}: a warm {longest}-token prefix cuts mean TTFT {cold['mean_ttft_ms']:.0f} -> "
        f"{warm['mean_ttft_ms']:.0f} ms and raises output throughput "
        f"{warm['output_throughput'] / cold['output_throughput']:.2f}x "
        f"({GPU_TTFT['requests_per_group']} requests, {GPU_TTFT['suffix_len']}-token questions)",
    ])
