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
from ref_engine.core.metrics import relative_error
from serving_lab.demos.common import GPU, DemoContext, DemoReport, gpu_what_if, plot_comparison
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
    slowdown = request_slowdown(one, sides)
    comparison = [{"requests": "one alone", "clock": clock, "metric": r["metric"], "measured": r[measured],
                   "simulated": r["simulated"], "simulated_err_pct": relative_error(r["simulated"], r[measured]),
                   "slowdown": slowdown}
                  for r in simulated_request(one, sides, config)
                  for clock, measured in (("engine core", "engine_core"), ("client", "client"))]
    queued = load_rows(burst, sides, config)
    for metric, simulated in (("queue_ms", "sim_queue_ms"), ("ttft_ms", "sim_ttft_ms")):
        measured_mean, simulated_mean = fmean(r[metric] for r in queued), fmean(r[simulated] for r in queued)
        comparison.append({"requests": f"burst of {p['burst']}, mean", "clock": "engine core",
                           "metric": metric, "measured": measured_mean, "simulated": simulated_mean,
                           "simulated_err_pct": relative_error(simulated_mean, measured_mean)})
    labels = ("requests", "clock")
    figure, (queue,) = plot_comparison(comparison, labels, f"serving-lab serve, max_num_seqs={p['max_num_seqs']}: one "
                                       f"request alone ({p['prompt_len']} tokens in, {p['output_len']} out), then a "
                                       f"burst of {p['burst']} ({p['burst_prompt_len']} in): measured vs simulated")
    queue.plot([r["queue_ms"] for r in queued], "s-", label="measured")
    queue.plot([r["sim_queue_ms"] for r in queued], "o--", label="simulated")
    queue.set(xticks=range(len(queued)), xlabel="burst request, in the order it reached the core",
              ylabel="queue time (ms)")
    queue.legend(fontsize=7)
    gpu = {r["metric"]: r["simulated"] for r in simulated_request(one, GPU, config)}
    return DemoReport(comparison, labels, figure, notes=[
        f"{gpu_what_if()} the same request alone: TTFT {gpu['ttft_ms']:.1f} ms, ITL {gpu['itl_ms']:.1f} ms",
    ])
