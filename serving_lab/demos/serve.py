"""Lesson 6's demo: the OpenAI-compatible server (`serving-lab serve --trace-requests`, started as a user
would, `TracedServer`), one streamed request traced through its boxes and then a burst that queues behind
`max_num_seqs`, each beside the simulator's prediction of the same requests (`simulated_request`,
`load_rows`). The simulator models the engine core, so its error is against the core's clock; the client's
numbers add HTTP, tokenization and ZeroMQ. Then the same request on a simulated H100.

Lesson: lessons/06-architecture-map.md#one-request-traced
"""

from __future__ import annotations

from statistics import fmean

from ref_engine.core.config import EngineConfig
from serving_lab.demos.common import GPU, DemoContext, DemoReport, gpu_name, plot_comparison, side_by_side
from serving_lab.experiments import (
    Sides,
    TracedServer,
    load_rows,
    request_slowdown,
    simulated_request,
    trace_request,
    traced_load,
)

PRESETS = {  # notebook 06's fast sizes
    "full": dict(prompt_len=64, output_len=8, burst=6, burst_prompt_len=32, max_num_seqs=2),
    "fast": dict(prompt_len=16, output_len=3, burst=3, burst_prompt_len=8, max_num_seqs=2),
}


def run(context: DemoContext) -> DemoReport:
    p = context.preset(PRESETS)
    config = EngineConfig(max_num_seqs=p["max_num_seqs"])
    model = (context.model_path,) if context.model_path else ()  # `serve MODEL`, as `vllm serve`
    with TracedServer("--max-num-seqs", str(p["max_num_seqs"]), *model) as server:
        one = trace_request(server, p["prompt_len"], p["output_len"], "demo-one")
        burst = traced_load(server, p["burst"], p["burst_prompt_len"], p["output_len"], prefix="demo-burst")
    sides = Sides(arch=context.model.arch, hardware=context.profile, measure=False)
    # (measured, simulated) rows as the other experiments make them: the request alone on both clocks ...
    prediction = simulated_request(one, sides, config)
    slowdown, prefill_slowdown = request_slowdown(one, sides)
    alone = []
    for clock, column in (("engine core", "engine_core"), ("client", "client")):
        alone_on = {"requests": "one alone", "clock": clock}
        alone += [{**alone_on, "side": "measured", "slowdown": slowdown, "prefill_slowdown": prefill_slowdown,
                   **{r["metric"]: r[column] for r in prediction}},
                  {**alone_on, "side": "simulated", **{r["metric"]: r["simulated"] for r in prediction}}]
    # ... and the burst's means on the core's clock
    queued = load_rows(burst, sides, config)
    means = {"requests": f"burst of {p['burst']}, mean", "clock": "engine core"}
    burst_means = [{**means, "side": side, **{metric: fmean(r[f"{prefix}{metric}"] for r in queued)
                                              for metric in ("queue_ms", "ttft_ms")}}
                   for side, prefix in (("measured", ""), ("simulated", "sim_"))]
    columns = ("requests", "clock")
    comparison = (side_by_side(alone, columns, ("ttft_ms", "itl_ms"))
                  + side_by_side(burst_means, columns, ("queue_ms", "ttft_ms")))
    figure, (queue,) = plot_comparison(comparison, columns, f"serving-lab serve, max_num_seqs={p['max_num_seqs']}: one "
                                       f"request alone ({p['prompt_len']} tokens in, {p['output_len']} out), then a "
                                       f"burst of {p['burst']} ({p['burst_prompt_len']} in): measured vs simulated")
    queue.plot([r["queue_ms"] for r in queued], "s-", label="measured")
    queue.plot([r["sim_queue_ms"] for r in queued], "o--", label="simulated")
    queue.set(xticks=range(len(queued)), xlabel="burst request, in the order it reached the core",
              ylabel="queue time (ms)")
    queue.legend(fontsize=7)
    gpu = {r["metric"]: r["simulated"] for r in simulated_request(one, GPU, config)}
    return DemoReport(comparison, columns, figure, notes=[
        f"GPU what-if, {gpu_name()}: the same request alone: TTFT {gpu['ttft_ms']:.1f} ms, ITL {gpu['itl_ms']:.1f} ms",
    ])
