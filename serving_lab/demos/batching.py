"""Lesson 1's demo: static vs continuous batching on the engine and in the simulator (`static_vs_continuous`),
then the same question on a simulated H100, where the gain grows with the spread of output lengths.

Lesson: lessons/01-continuous-batching.md#continuous-batching
"""

from __future__ import annotations

from serving_lab.demos.common import GPU, DemoContext, DemoReport, gpu_name, plot_comparison, side_by_side
from serving_lab.experiments import static_vs_continuous, throughput_ratios

PRESETS = {  # on the GPU profile, notebook 01's caps (outputs Exp(128), 64-token prompts, max_num_seqs 64)
    "full": dict(caps=(16, 96), num_requests=16, prompt_len=64, mean_output=32, max_num_seqs=8,
                 gpu_caps=(32, 128, 512, 1536), gpu_requests=512),
    "fast": dict(caps=(8,), num_requests=4, prompt_len=8, mean_output=6, max_num_seqs=2, gpu_caps=(32, 512),
                 gpu_requests=96),
}


def run(context: DemoContext) -> DemoReport:
    p = context.preset(PRESETS)
    rows = static_vs_continuous(p["caps"], context.sides(), num_requests=p["num_requests"],
                                prompt_len=p["prompt_len"], mean_output=p["mean_output"],
                                max_num_seqs=p["max_num_seqs"])
    ratios = {(r["cap"], r["side"]): r["ratio"] for r in throughput_ratios(rows)}
    gpu = throughput_ratios(static_vs_continuous(p["gpu_caps"], GPU, num_requests=p["gpu_requests"], prompt_len=64,
                                                 mean_output=128, max_num_seqs=64))
    labels = ("cap", "scheduling")
    comparison = side_by_side(rows, labels, ("output_throughput", "mean_ttft_ms"))
    figure, (what_if,) = plot_comparison(comparison, labels, "static vs continuous batching, engine and simulator")
    what_if.plot([r["cap"] for r in gpu], [r["ratio"] for r in gpu], "s--", label=gpu_name())
    for side, style in (("measured", "o-"), ("simulated", "x:")):
        what_if.plot(p["caps"], [ratios[(cap, side)] for cap in p["caps"]], style, label=f"this machine, {side}")
    what_if.set(xscale="log", xlabel="output-length cap (tokens)", ylabel="continuous / static throughput")
    what_if.legend(fontsize=7)
    return DemoReport(comparison, labels, figure, notes=[
        "continuous / static output throughput: " + "; ".join(
            f"cap {cap}: measured {ratios[(cap, 'measured')]:.2f}x, simulated {ratios[(cap, 'simulated')]:.2f}x"
            for cap in p["caps"]),
        f"GPU what-if, {gpu_name()}: continuous / static "
        + ", ".join(f"{r['ratio']:.2f}x at cap {r['cap']}" for r in gpu)
        + f" ({p['gpu_requests']} requests, outputs Exp(128), max_num_seqs 64)",
    ])
