"""Lesson 5's demo: prompt-lookup (n-gram) speculation on a copy task, on the engine and in the simulator
(`speculation`). The simulator replays the engine's accepted drafts, so both sides take the same steps and
accept the same tokens; whether the speed-up survives is this machine's price of a verify step. Then the
batch-size sweep on a simulated H100, where the speed-up fades as decode turns compute-bound.

Lesson: lessons/05-speculative-decoding.md#acceptance-and-speedup
"""

from __future__ import annotations

from ref_engine.core.config import EngineConfig
from serving_lab.demos.common import GPU, DemoContext, DemoReport, gpu_name, plot_comparison, side_by_side
from serving_lab.experiments import grounded_prompts, speculation, speculation_batch_sweep, speedups

PRESETS = {"full": dict(output_len=48, repeats=2, gpu_batches=(1, 8, 64, 256)),
           "fast": dict(output_len=8, repeats=1, gpu_batches=(1, 16))}
CONFIGS = {"off": EngineConfig(), "ngram": EngineConfig(speculative_method="ngram")}
GPU_ACCEPTANCE = 0.5  # the chance a draft token is accepted, as notebook 05's sweep assumes


def run(context: DemoContext) -> DemoReport:
    p = context.preset(PRESETS)
    prompts = grounded_prompts(context.model.tokenizer, 1)
    rows = speculation(prompts, CONFIGS, context.sides(p["repeats"]), output_len=p["output_len"])
    speedup = speedups(rows)
    gpu = speculation_batch_sweep(p["gpu_batches"], GPU_ACCEPTANCE, GPU)
    labels = ("config",)
    comparison = side_by_side(rows, labels, ("output_throughput", "num_steps", "num_accepted_tokens"))
    figure, (what_if,) = plot_comparison(comparison, labels, "prompt lookup on \"copy this text\" "
                                         "(steps and accepted tokens: the engine's, replayed)")
    what_if.plot([r["batch"] for r in gpu], [r["speedup"] for r in gpu], "o-")
    what_if.axhline(1, color="grey", lw=0.8)
    what_if.set(xscale="log", xlabel="batch size", ylabel="speed-up",
                title=f"{gpu_name()}, acceptance {GPU_ACCEPTANCE}")
    return DemoReport(comparison, labels, figure, notes=[
        f"speed-up of ngram over off: measured {speedup[('ngram', 'measured')]:.2f}x, "
        f"simulated {speedup[('ngram', 'simulated')]:.2f}x",
        f"GPU what-if, {gpu_name()}: at acceptance {GPU_ACCEPTANCE}, speed-up "
        + ", ".join(f"{r['speedup']:.2f}x at batch {r['batch']}" for r in gpu),
    ])
