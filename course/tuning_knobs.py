"""Lesson 7: the tuning knobs. Sweeping the knobs, picking a point per SLO, checking the simulator's ranking on
the engine, numerics on the throughput/quality plane, and the roofline floor where tuning stops paying.

- `tuning_manifest`: the example manifest with vLLM's plain knobs (no separate prefill/decode budgets,
  FCFS), optionally serving a model the simulator knows by name (the GPU what-ifs);
- `sweep`: `serving_lab.sweep` on a grid, in the simulator, with every point measured on the engine when
  asked (the CPU sweep, whose rank agreement the notebook reports);
- `slo_picks`: for each SLO, the point with the highest goodput;
- `numerics`: float32, bfloat16, int8 and int4 weights on this CPU, measured: throughput and quality on the eval set;
- `roofline`: simulated decode throughput against the device's roofline ceiling, by batch size.

`sweep_loop` draws the sweep's loop; `demo` is `serving-lab demo tuning`.

Lesson: lessons/07-tuning-knobs.md
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from core.config import EngineConfig
from core.workload import Workload
from course.demo import GPU, DemoContext, DemoReport, gpu_name, plot_comparison, side_by_side
from course.drawing import COLORS, arrow, box, canvas
from serving_lab.manifest import EXAMPLE_MANIFEST, Manifest, load_manifest
from serving_lab.sweep import SLO, Sweep, SweepResult, parse_grid, run_sweep
from sim.cost_model import BatchShape
from sim.hardware import HardwareProfile, dtype_bytes
from sim.simulator import Simulator, resolve_hardware, resolve_model


def tuning_manifest(model: str | None = None) -> Manifest:
    """The example deployment with the step budget as vLLM's one `max_num_batched_tokens` (no manifest
    budgets) and first-come-first-served admission; `model`: a known name such as "llama-3.1-8b"."""
    overrides: dict[str, Any] = {"scheduler.prefill_budget_tokens": None, "scheduler.decode_batch_max_tokens": None,
                                 "api.admission.fairness": "none", "api.request_limits.max_model_len": 4096}
    if model is not None:
        overrides["engine.model"] = model
    else:
        overrides["api.request_limits.max_model_len"] = 2048
    return load_manifest(EXAMPLE_MANIFEST, overrides)


def sweep(grid: dict[str, list[Any]], workload: str, hardware: HardwareProfile | str, *, model: str | None = None,
          slos: Sequence[SLO] = (), measure: bool = False, loaded: Any = None, repeats: int = 1) -> SweepResult:
    """Every point of `grid` in the simulator on `hardware`; with `measure`, every point on the engine too
    (`loaded`: the engine's model, reused)."""
    spec = dict(grid)
    if measure:
        spec["measure"] = [{}]  # the empty mapping matches every point of the grid
    run = Sweep(tuning_manifest(model), parse_grid(spec), workload, hardware=hardware, slos=tuple(slos))
    return run_sweep(run, repeats=repeats, model=loaded)


def slo_picks(result: SweepResult, slos: Sequence[SLO]) -> list[dict[str, Any]]:
    """For each SLO, the simulated point with the most goodput (ties: the first in grid order)."""
    rows = result.simulated()
    picks = []
    for slo in slos:
        best = max(rows, key=lambda row: row[slo.column])
        picks.append({"slo": slo.label, "ttft_ms": slo.ttft_ms, "tpot_ms": slo.tpot_ms, "best point": best["point"],
                      "goodput": best[slo.column], "output_throughput": best["output_throughput"]})
    return picks


def quantized_paths_on(device: Any) -> list[str]:
    """The weight-only paths lesson 7 measures on `device` (a torch.device): int8 and int4 run on torch's CPU
    kernels, which refuse CUDA, where the comparison is float32 against bfloat16; int4 also needs a torch
    with the int4 kernel."""
    from ref_engine.model.int4 import has_int4_kernel

    paths = ["int8"] if device.type == "cpu" else []
    return paths + (["int4"] if has_int4_kernel(device) else [])


def numerics(reference: Any, prompts: list[str], max_tokens: int, workload: Workload, config: EngineConfig,
             path: str | None = None) -> list[dict[str, Any]]:
    """float32 (`reference`, loaded from `path`; None: the default model), bfloat16 on its device, and int8 and
    int4 weights where they run (`quantized_paths_on`): the engine's measured output throughput on `workload`, and
    quality against float32 on `prompts` of the eval set (greedy agreement, KL in nats per token)."""

    from ref_engine import bench
    from ref_engine.model.loader import load_model, quantized
    from serving_lab.eval_set import compare_quality

    device = next(reference.model.parameters()).device
    variants = {"float32": reference, "bfloat16": load_model(path, dtype="bfloat16", device=device)}
    for quantization in quantized_paths_on(device):
        variants[f"{quantization} weight-only"] = quantized(reference, quantization)
    rows = []
    for (name, loaded), quality in zip(variants.items(), [None, *compare_quality(
            reference, list(variants.values())[1:], prompts, max_tokens)]):
        metrics = bench.run_rounds([workload], config, model=loaded)[-1]
        rows.append({"weights": name, "output_throughput": metrics.output_throughput,
                     "agreement": 1.0 if quality is None else quality.agreement,
                     "mean_kl": 0.0 if quality is None else quality.mean_kl})
    return rows


def roofline(model: str, hardware: HardwareProfile | str, batches: Sequence[int], context_len: int,
             dtype: str = "bfloat16") -> list[dict[str, Any]]:
    """Decode throughput by batch size B at `context_len` cached tokens per request: the simulator's (the
    cost model's price of the decode step) against the roofline ceiling, the lower of
    - memory: B tokens per (weights + B x context x KV bytes per token) / memory bandwidth, and
    - compute: peak FLOP/s / 2 FLOPs per parameter per token.
    The ceiling leaves out attention's arithmetic and every overhead, so the simulated curve stays under
    it. Both flatten as B grows, because each request's KV is read once per token however large the batch:
    past that knee a bigger batch stops paying, and only fewer bytes (an fp8 KV cache, fewer KV heads,
    shorter contexts) or a faster device raise the floor."""
    arch, profile = resolve_model(model), resolve_hardware(hardware)
    cost_model = Simulator(arch, profile, EngineConfig(num_kv_blocks=1), dtype=dtype).cost_model
    weight_bytes = arch.weight_bytes(dtype_bytes(dtype))
    kv_bytes = context_len * arch.kv_bytes_per_token(dtype_bytes(dtype))
    compute_ceiling = profile.peak_flops[dtype] / (2 * arch.num_params)
    rows = []
    for b in batches:
        step_s = cost_model.step_time(BatchShape.decode(b, context_len))
        memory_ceiling = b * profile.memory_bandwidth / (weight_bytes + b * kv_bytes)
        rows.append({"batch": b, "step_ms": 1000 * step_s, "simulated_tok_s": b / step_s,
                     "ceiling_tok_s": min(memory_ceiling, compute_ceiling)})
    return rows


# ---- the diagram ----


def sweep_loop():
    """Lesson 7: the simulator sweeps the grid, the SLO picks from the front, the engine checks a few points."""
    fig, ax = canvas(11, 3.2, (0, 12), (1, 4.2))
    steps = [("grid.yaml\nknob -> values\n(hundreds of points)", COLORS[3]),
             ("simulator\nevery point, seconds each\n(calibrated or GPU profile)", COLORS[0]),
             ("Pareto front\nthroughput vs latency;\ngoodput under the SLO", COLORS[2]),
             ("engine\nmeasures a few points\n(--measure-front)", COLORS[1]),
             ("trust the pick?\nSpearman rho of\nsimulated vs measured", COLORS[4])]
    boxes = [box(ax, 1.2 + 2.4 * i, 2.2, text, color, fontsize=8) for i, (text, color) in enumerate(steps)]
    for a, b in zip(boxes, boxes[1:]):
        arrow(ax, a, b)
    arrow(ax, boxes[-1], boxes[0], "rho low: fix the profile, not the pick", rad=0.25, offset=(0, 1.2))
    ax.set_title("serving-lab sweep: simulate everything, measure what you will deploy", fontsize=11)
    fig.tight_layout()
    return fig


# ---- the demo (serving-lab demo) ----

DEMO_PRESETS = {  # notebook 07's fast CPU sweep: six requests in six, three, two and one waves
    "full": dict(grid={"max_num_seqs": [1, 2, 3, 6]}, workload="synthetic:6:32:8", repeats=2,
                 gpu_grid={"max_num_seqs": [8, 32, 128, 256], "max_num_batched_tokens": [256, 1024, 4096]},
                 gpu_workload="synthetic:150:512:128:60"),
    "fast": dict(grid={"max_num_seqs": [1, 2]}, workload="synthetic:2:8:2", repeats=1,
                 gpu_grid={"max_num_seqs": [128], "max_num_batched_tokens": [256, 1024]},  # the full grid's picks
                 gpu_workload="synthetic:150:512:128:60"),
}
SLOS = (SLO(ttft_ms=150, tpot_ms=20, label="first_token"), SLO(ttft_ms=500, tpot_ms=8.5, label="smooth"))


def demo(context: DemoContext) -> DemoReport:
    """A `max_num_seqs` sweep in the simulator with every point measured on the engine too
    (`sweep`), and how well the simulator ranks the points (Spearman's rho); then a GPU sweep, where only
    the simulator can go: its Pareto front, and the point each of two SLOs picks (`slo_picks`), marked on it.
    The SLOs pull opposite ways (a fast first token against a smooth stream), so they pick different budgets."""
    p = context.preset(DEMO_PRESETS)
    result = sweep(p["grid"], p["workload"], context.profile, measure=True, loaded=context.model,
                          repeats=p["repeats"])
    simulated = {r["point"]: r for r in result.simulated()}
    rows = [row for m in result.measured() for row in (m, simulated[m["point"]])]  # (measured, simulated) pairs
    gpu = sweep(p["gpu_grid"], p["gpu_workload"], GPU.hardware, model=GPU.arch, slos=SLOS)
    labels = tuple(p["grid"])  # the knobs: each row carries its point's values
    comparison = side_by_side(rows, labels, ("output_throughput", "mean_ttft_ms"))
    figure, (what_if,) = plot_comparison(comparison, labels, f"a sweep of {p['workload']} on the engine and in "
                                         "the simulator")
    for on_front, style in ((False, dict(color="lightgray")), (True, dict(color="tab:red"))):
        points = [r for r in gpu.simulated() if r["on_front"] == on_front]
        what_if.scatter([r["p99_itl_ms"] for r in points], [r["output_throughput"] for r in points], s=14,
                        label="Pareto front" if on_front else "dominated", **style)
    picks = slo_picks(gpu, SLOS)
    by_point = {r["point"]: r for r in gpu.simulated()}
    knobs = list(p["gpu_grid"])
    for pick, marker in zip(picks, ("*", "P")):
        row = by_point[pick["best point"]]
        what_if.scatter([row["p99_itl_ms"]], [row["output_throughput"]], s=150, marker=marker, facecolors="none",
                        edgecolors="black", label=f"{pick['slo']} SLO picks " + "/".join(str(row[k]) for k in knobs))
    what_if.set(xscale="log", xlabel="p99 ITL (ms)", ylabel="output tokens/s")
    what_if.set_title(f"{gpu_name()}: {len(gpu.simulated())} points", fontsize=9)
    what_if.legend(fontsize=6, title="/".join(knobs), title_fontsize=6)
    rho = result.agreement["rho"]
    return DemoReport(comparison, labels, figure, notes=[
        f"rank agreement (Spearman's rho of output throughput, simulated vs measured): {rho:.2f} "
        f"over {len(result.measured())} points",
        f"GPU what-if, {gpu_name()}: {p['gpu_workload']}, {len(gpu.simulated())} points; best goodput per SLO: " + "; ".join(
            f"{pick['slo']} (TTFT {pick['ttft_ms']:g} ms, TPOT {pick['tpot_ms']:g} ms): {pick['best point']}, "
            f"{pick['goodput']:.2f} req/s" for pick in picks)
        + ("" if len({pick["best point"] for pick in picks}) > 1 else " (one point: no trade-off in this grid)"),
    ])
