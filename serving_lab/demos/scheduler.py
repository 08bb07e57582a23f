"""Lesson 3's demo: the prefill stall (`prefill_stall`). A few requests are decoding when a long prompt
arrives; unchunked, its whole prefill is one step and every decode waits for it; chunked under a token
budget, the decodes keep their pace and the long prompt's first token comes a little later. Then the same on
a simulated H100.

Lesson: lessons/03-chunked-prefill-and-disaggregation.md#the-stall
"""

from __future__ import annotations

from serving_lab.demos.common import GPU, DemoContext, DemoReport, gpu_name, plot_comparison, side_by_side
from serving_lab.experiments import prefill_stall

PRESETS = {
    "full": dict(budgets=(None, 64, 256), num_decodes=4, decode_output_len=24, long_prompt_len=320,
                 arrival_after_steps=4),
    "fast": dict(budgets=(None, 16), num_decodes=2, decode_prompt_len=8, decode_output_len=6, long_prompt_len=48,
                 arrival_after_steps=2),
}
GPU_STALL = dict(num_decodes=8, decode_output_len=64, long_prompt_len=1024)  # notebook 03's full sizes
GPU_BUDGETS = (None, 128, 512)


def run(context: DemoContext) -> DemoReport:
    p = dict(context.preset(PRESETS))
    rows = prefill_stall(p.pop("budgets"), context.sides(), **p)
    gpu = prefill_stall(GPU_BUDGETS, GPU, **GPU_STALL)
    labels = ("budget",)
    comparison = side_by_side(rows, labels, ("decode_max_itl_ms", "long_ttft_ms"))
    figure, (what_if,) = plot_comparison(comparison, labels, f"{p['num_decodes']} decodes running when a "
                                         f"{p['long_prompt_len']}-token prompt arrives")
    x = range(len(gpu))
    what_if.bar([i - 0.2 for i in x], [r["decode_max_itl_ms"] for r in gpu], 0.4, label="decodes' longest gap")
    what_if.bar([i + 0.2 for i in x], [r["long_ttft_ms"] for r in gpu], 0.4, label="long prompt's TTFT")
    what_if.set_xticks(list(x), [str(r["budget"]) for r in gpu])
    what_if.set(xlabel="token budget", ylabel="ms", title=gpu_name())
    what_if.legend(fontsize=7)
    return DemoReport(comparison, labels, figure, notes=[
        "decode_max_itl_ms: the longest gap a running decode saw (the stall); long_ttft_ms: the long prompt's TTFT",
        f"GPU what-if, {gpu_name()}: " + "; ".join(
            f"budget {r['budget']}: stall {r['decode_max_itl_ms']:.0f} ms, TTFT {r['long_ttft_ms']:.0f} ms"
            for r in gpu) + f" ({GPU_STALL['num_decodes']} decodes, a {GPU_STALL['long_prompt_len']}-token prompt)",
    ])
