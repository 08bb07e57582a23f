"""Lesson 7's demo: a `max_num_seqs` sweep in the simulator with every point measured on the engine too
(`tuning.sweep`), and how well the simulator ranks the points (Spearman's rho); then a GPU sweep, where only
the simulator can go, and the point each SLO picks (`tuning.slo_picks`).

Lesson: lessons/07-tuning-knobs.md#trusting-the-sweep
"""

from __future__ import annotations

from serving_lab.demos.common import GPU, DemoContext, DemoReport, gpu_name, plot_comparison, side_by_side
from serving_lab.experiments import tuning
from serving_lab.sweep import SLO

PRESETS = {  # notebook 07's fast CPU sweep: six requests in six, three, two and one waves
    "full": dict(grid={"max_num_seqs": [1, 2, 3, 6]}, workload="synthetic:6:32:8", repeats=2,
                 gpu_grid={"max_num_seqs": [8, 32, 128, 256], "max_num_batched_tokens": [256, 1024, 4096]},
                 gpu_workload="synthetic:150:512:128:60"),
    "fast": dict(grid={"max_num_seqs": [1, 2]}, workload="synthetic:2:8:2", repeats=1,
                 gpu_grid={"max_num_seqs": [8, 64]}, gpu_workload="synthetic:24:128:16:60"),
}
SLOS = (SLO(ttft_ms=150, tpot_ms=20, label="first_token"), SLO(ttft_ms=500, tpot_ms=8.5, label="smooth"))


def run(context: DemoContext) -> DemoReport:
    p = context.preset(PRESETS)
    result = tuning.sweep(p["grid"], p["workload"], context.profile, measure=True, loaded=context.model,
                          repeats=p["repeats"])
    simulated = {r["point"]: r for r in result.simulated()}
    rows = [row for m in result.measured() for row in (m, simulated[m["point"]])]  # (measured, simulated) pairs
    gpu = tuning.sweep(p["gpu_grid"], p["gpu_workload"], GPU.hardware, model=GPU.arch, slos=SLOS)
    labels = tuple(p["grid"])  # the knobs: each row carries its point's values
    comparison = side_by_side(rows, labels, ("output_throughput", "mean_ttft_ms"))
    figure, (what_if,) = plot_comparison(comparison, labels, f"a sweep of {p['workload']} on the engine and in "
                                         "the simulator")
    for on_front, style in ((False, dict(color="lightgray")), (True, dict(color="tab:red"))):
        points = [r for r in gpu.simulated() if r["on_front"] == on_front]
        what_if.scatter([r["p99_itl_ms"] for r in points], [r["output_throughput"] for r in points], s=14,
                        label="Pareto front" if on_front else "dominated", **style)
    what_if.set(xscale="log", xlabel="p99 ITL (ms)", ylabel="output tokens/s",
                title=f"{gpu_name()}: {len(gpu.simulated())} points")
    what_if.legend(fontsize=7)
    rho = result.agreement["rho"]
    return DemoReport(comparison, labels, figure, notes=[
        f"rank agreement (Spearman's rho of output throughput, simulated vs measured): {rho:.2f} "
        f"over {len(result.measured())} points",
        f"GPU what-if, {gpu_name()}: {p['gpu_workload']}, {len(gpu.simulated())} points; best goodput per SLO: " + "; ".join(
            f"{pick['slo']} (TTFT {pick['ttft_ms']:g} ms, TPOT {pick['tpot_ms']:g} ms): {pick['best point']}, "
            f"{pick['goodput']:.2f} req/s" for pick in tuning.slo_picks(gpu, SLOS)),
    ])
