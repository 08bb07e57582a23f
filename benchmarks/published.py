"""The simulator against published serving measurements: fit the GPU profiles' fractions, then validate.

    python benchmarks/published.py            simulate every row of published_rows.json with the built-in
                                              profiles; write the table into RESULTS.md
    python benchmarks/published.py --fit      the same simulations, then fit each GPU's fractions and
                                              overheads on the rows marked "fit" (scipy least squares on
                                              log(simulated / published)), write sim/data/gpu_fit.json,
                                              and write the table for the fitted profiles
    python benchmarks/published.py --fit-by-source
                                              fit on one source (TensorRT-LLM 0.14) with bounded, shared
                                              terms and judge on the others (NIM, vLLM): a candidate written
                                              to benchmarks/gpu_fit_by_source.json, never to gpu_fit.json
                                              (benchmarks/fit_by_source.py, which says how)
    --only SUBSTRING                          only rows whose id contains SUBSTRING (repeatable)
    --all                                     also the held-out offline rows with >= 2000 output tokens, left
                                              out by default because a 2000-step wave of ~1000 requests takes
                                              minutes of the core scheduler's Python per row

How a published setup becomes a simulation
- offline rows (trtllm-bench throughput: every request queued at once, uniform lengths): the engine
  reserves each request's whole sequence on admission (TensorRT-LLM's default GUARANTEED_NO_EVICT capacity
  policy: `kv_allocation="contiguous_exact"`), max_num_seqs = MAX_NUM_SEQS, max_num_batched_tokens = 8192,
  max_model_len = input + output, no prefix caching (random prompts). TensorRT-LLM gives the KV cache
  kv_cache_free_gpu_mem_fraction of the memory left after weights and activations; the equivalent
  gpu_memory_utilization is (W + A + f (M - W - A)) / M. The published runs use thousands of requests to
  reach steady state. With uniform lengths, every request queued at once and whole sequences reserved,
  the engine runs in waves of C requests (C: how many fit at once, or max_num_seqs), each wave like the
  last, so one wave of C requests gives the steady-state throughput: output / duration.
- concurrency-1 rows (NIM behind HTTP): requests one at a time; TTFT includes the profile's fitted
  front-end latency (`Simulator(frontend_latency_s=...)`); ITL is the mean decode step.

Why the fit can replay recorded batches: with every request queued at time 0 (or one at a time), the
scheduler's decisions do not depend on step times, so a run's batches are the same under any profile, and
its duration is the sum of the step times of those batches. The fit prices the recorded batches with
candidate fractions (`step_seconds`, the cost model's formula vectorised); the table is then rebuilt from
the fitted profiles the same way, which equals running the Simulator again
(tests/sim/test_published.py checks that on a row).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import least_squares

from core.arch_config import ArchConfig
from core.config import EngineConfig
from core.workload import Workload
from sim.cost_model import BatchShape, CostModel, model_weight_bytes
from sim.executor import CostModelTimer
from sim.hardware import FIT_PATH, FITTED_FIELDS, HardwareProfile, dtype_bytes
from sim.simulator import Simulator

HERE = Path(__file__).parent
ROWS_PATH = HERE / "published_rows.json"
RESULTS_PATH = HERE / "RESULTS.md"
MAX_NUM_SEQS = 1024
MAX_NUM_BATCHED_TOKENS = 8192
CONCURRENCY_1_REQUESTS = 1  # identical requests one at a time: one gives the same means
WITHIN = 0.15  # the goal: |simulated / published - 1| <= 15%
TABLE_START, TABLE_END = "<!-- published:start -->", "<!-- published:end -->"


@dataclass(frozen=True)
class Row:
    id: str
    source: str
    version: str
    metric: str
    value: float
    fit: bool
    setup: dict[str, Any]

    @property
    def gpu(self) -> str:
        return self.setup["gpu"]


def load_rows(path: Path = ROWS_PATH) -> list[Row]:
    data = json.loads(path.read_text())
    return [Row(r["id"], r["source"], r["version"], r["metric"], r["value"], r["fit"], r["setup"])
            for r in data["rows"]]


# ---- one row, simulated ------------------------------------------------------------------------------

class RecordingTimer(CostModelTimer):
    """Prices steps like `CostModelTimer` and keeps every step's `BatchShape` for the fit."""

    def __init__(self, cost_model: CostModel) -> None:
        super().__init__(cost_model)
        self.shapes: list[BatchShape] = []

    def step_time(self, output: Any) -> float:
        query_lens, context_lens = output.batch_shape
        rows = sum(1 for s in output.scheduled if s.needs_logits)
        self.shapes.append(BatchShape(query_lens, context_lens, num_logit_rows=rows))
        return super().step_time(output)


@dataclass
class Run:
    """One simulated run: its batches, and the output tokens it produced."""

    shapes: list[BatchShape]
    output_tokens: int
    ttft_steps: list[int] = field(default_factory=list)  # concurrency-1: index of each request's first step


@dataclass
class Simulated:
    row: Row
    runs: list[Run]
    value: float  # the simulated metric, in the row's unit


def engine_config(row: Row, arch: ArchConfig, hw: HardwareProfile) -> EngineConfig:
    s = row.setup
    base = EngineConfig(max_num_seqs=MAX_NUM_SEQS, max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
                        max_model_len=s["input_len"] + s["output_len"], enable_prefix_caching=False,
                        kv_allocation="contiguous_exact")
    fraction = s.get("kv_cache_free_gpu_mem_fraction")
    if fraction is None:
        return base
    tp = s["tensor_parallel_size"]
    weights = model_weight_bytes(arch, s["dtype"], hw) / tp
    activations = arch.peak_activation_bytes(MAX_NUM_BATCHED_TOKENS, MAX_NUM_SEQS,
                                             dtype_bytes(CostModel(arch, hw, s["dtype"]).activation_dtype))
    memory = hw.memory_bytes
    used = weights + activations
    utilization = min(1.0, (used + fraction * max(memory - used, 0.0)) / memory)
    return replace(base, gpu_memory_utilization=utilization)


def make_simulator(row: Row, hw: HardwareProfile, frontend_latency_s: float = 0.0) -> Simulator:
    s = row.setup
    arch = ArchConfig.named(s["model"])
    return Simulator(arch, hw, engine_config(row, arch, hw), dtype=s["dtype"],
                     tensor_parallel_size=s["tensor_parallel_size"], kv_cache_dtype=s["kv_cache_dtype"],
                     frontend_latency_s=frontend_latency_s)


def _recorded_run(sim: Simulator, workloads: list[Workload]) -> tuple[Run, list[Any]]:
    timer = RecordingTimer(sim.cost_model)  # type: ignore[arg-type]
    sim.step_timer = timer
    metrics = sim.run_rounds(workloads)
    return Run(timer.shapes, sum(m.total_output_tokens for m in metrics)), metrics


def simulate(row: Row, hw: HardwareProfile, frontend_latency_s: float = 0.0) -> Simulated:
    s = row.setup
    isl, osl = s["input_len"], s["output_len"]
    if s["mode"] == "offline":
        sim = make_simulator(row, hw)
        blocks_per_request = -(-(isl + osl) // sim.config.block_size)
        concurrency = max(1, min(MAX_NUM_SEQS, sim.num_kv_blocks // blocks_per_request))
        run, metrics = _recorded_run(sim, [Workload.synthetic(concurrency, isl, osl, seed=row_seed(row))])
        return Simulated(row, [run], run.output_tokens / metrics[0].duration)
    sim = make_simulator(row, hw, frontend_latency_s)
    workloads = [Workload.synthetic(1, isl, osl, seed=row_seed(row) + i) for i in range(CONCURRENCY_1_REQUESTS)]
    run, metrics = _recorded_run(sim, workloads)
    key = {"mean_ttft_ms": "mean_ttft_ms", "mean_itl_ms": "mean_itl_ms"}[row.metric]
    return Simulated(row, [run], sum(getattr(m, key) for m in metrics) / len(metrics))


def slow(row: Row) -> bool:
    """A held-out offline row with >= 2000 output tokens: skipped unless --all (see the module docstring)."""
    return not row.fit and row.setup["mode"] == "offline" and row.setup["output_len"] >= 2000


def row_seed(row: Row) -> int:
    return sum(map(ord, row.id)) % 10_000  # deterministic, different per row


# ---- pricing recorded batches with candidate terms -----------------------------------------------------

@dataclass(frozen=True)
class StepFeatures:
    """Per step of one run: what the cost model multiplies by the profile's rates (totals over tp devices)."""

    linear_flops: np.ndarray
    attention_flops: np.ndarray
    bytes: np.ndarray
    tokens: np.ndarray
    seqs: np.ndarray
    blocks: np.ndarray
    kv_bytes: np.ndarray  # attention's share of `bytes` (the KV cache read and written): combine="kernels" splits it


def features(shapes: list[BatchShape], model: CostModel) -> StepFeatures:
    costs = [model.breakdown(shape) for shape in shapes]
    columns = [np.array([getattr(c, name) for c in costs], dtype=float) for name in (
        "linear_flops", "attention_flops", "bytes", "num_tokens", "num_seqs", "num_blocks")]
    return StepFeatures(*columns, np.array([c.kv_read_bytes + c.kv_write_bytes for c in costs], dtype=float))


def step_seconds(f: StepFeatures, model: CostModel, hw: HardwareProfile) -> np.ndarray:
    """The cost model's step time for every recorded step, for profile `hw`, combined the profile's way
    (`hw.combine`: one max over the step, the sum, or the linear layers and attention each on its own max)."""
    tp = model.tensor_parallel_size
    linear = f.linear_flops / (hw.matmul_flops(model.dtype) * tp)
    attention = f.attention_flops / (hw.flops_for(model.activation_dtype) * hw.attention_efficiency * tp)
    memory = f.bytes / (hw.effective_bandwidth * tp)
    overhead = (hw.step_overhead_s + hw.per_seq_overhead_s * f.seqs + hw.per_token_overhead_s * f.tokens
                + hw.per_block_overhead_s * f.blocks)
    comm = 0.0
    if tp > 1:
        arch, a = model.arch, dtype_bytes(model.activation_dtype)
        comm = 2 * arch.num_layers * (hw.interconnect_latency_s + 2 * (tp - 1) / tp * f.tokens * arch.hidden_size
                                      * a / hw.allreduce_bandwidth)
    if hw.combine == "kernels":
        kv = f.kv_bytes / (hw.effective_bandwidth * tp)
        core = np.maximum(linear, memory - kv) + np.maximum(attention, kv)
    elif hw.combine == "sum":
        core = linear + attention + memory
    else:
        core = np.maximum(linear + attention, memory)
    return core + overhead + comm


@dataclass
class Prepared:
    """A simulated row with its runs turned into features, ready to be re-priced."""

    simulated: Simulated
    model: CostModel
    feats: list[StepFeatures]


def prepare(simulated: Simulated, hw: HardwareProfile) -> Prepared:
    sim = make_simulator(simulated.row, hw)
    model = sim.cost_model
    assert isinstance(model, CostModel)
    return Prepared(simulated, model, [features(run.shapes, model) for run in simulated.runs])


def predict(p: Prepared, hw: HardwareProfile, frontend_latency_s: float) -> float:
    """The row's metric for profile `hw`, from the recorded batches."""
    row = p.simulated.row
    if row.setup["mode"] == "offline":
        return p.simulated.runs[0].output_tokens / float(step_seconds(p.feats[0], p.model, hw).sum())
    times = step_seconds(p.feats[0], p.model, hw)
    prefill = np.array([s.num_tokens > 1 for s in p.simulated.runs[0].shapes])
    if row.metric == "mean_ttft_ms":
        return 1e3 * (frontend_latency_s + float(times[prefill].mean()))
    return 1e3 * float(times[~prefill].mean())


# ---- the fit -----------------------------------------------------------------------------------------

# name, lower, upper, initial
TERMS = (("matmul_16", 0.15, 1.0, 0.6), ("matmul_fp8", 0.15, 1.0, 0.5), ("attention_efficiency", 0.05, 1.0, 0.4),
         ("bandwidth_efficiency", 0.3, 1.0, 0.8), ("step_overhead_s", 0.0, 0.02, 1e-3),
         ("per_seq_overhead_s", 0.0, 50e-6, 5e-6), ("interconnect_latency_s", 1e-6, 200e-6, 10e-6),
         ("interconnect_efficiency", 0.02, 1.0, 0.5), ("frontend_latency_s", 0.0, 0.5, 0.0))


def apply_terms(hw: HardwareProfile, terms: dict[str, float]) -> HardwareProfile:
    matmul = dict(hw.matmul_efficiency)
    for dtype in ("bfloat16", "float16"):
        if "matmul_16" in terms:
            matmul[dtype] = terms["matmul_16"]
    if "matmul_fp8" in terms and "fp8" in hw.peak_flops:
        matmul["fp8"] = terms["matmul_fp8"]
    plain = {k: v for k, v in terms.items() if k in {f.name for f in hw.__dataclass_fields__.values()}}
    return replace(hw, matmul_efficiency=matmul, **plain)


def fit_gpu(name: str, prepared: list[Prepared], hw: HardwareProfile) -> dict[str, float]:
    """Least squares on log(predicted / published) over the GPU's in-fit rows; terms no row informs stay out."""
    rows = [p for p in prepared if p.simulated.row.fit]
    dtypes = {p.model.dtype for p in rows}
    used = [t for t in TERMS if not (
        (t[0] == "matmul_16" and not dtypes & {"bfloat16", "float16"})
        or (t[0] == "matmul_fp8" and "fp8" not in dtypes)
        or (t[0].startswith("interconnect") and all(p.model.tensor_parallel_size == 1 for p in rows))
        or (t[0] == "frontend_latency_s" and not any(p.simulated.row.metric == "mean_ttft_ms" for p in rows)))]
    names = [t[0] for t in used]
    lower, upper, x0 = (np.array([t[i] for t in used]) for i in (1, 2, 3))
    scale = np.maximum(np.abs(x0), 1e-6)

    def residuals(x: np.ndarray) -> np.ndarray:
        terms = dict(zip(names, x * scale, strict=True))
        candidate = apply_terms(hw, terms)
        front = terms.get("frontend_latency_s", 0.0)
        return np.array([math.log(predict(p, candidate, front) / p.simulated.row.value) for p in rows])

    result = least_squares(residuals, x0 / scale, bounds=(lower / scale, upper / scale), method="trf")
    print(f"{name}: fitted {len(names)} terms on {len(rows)} rows, rms log error {np.sqrt(np.mean(result.fun ** 2)):.3f}",
          file=sys.stderr)
    return dict(zip(names, (result.x * scale).tolist(), strict=True))


def fit_all(prepared: list[Prepared]) -> dict[str, dict[str, Any]]:
    by_gpu: dict[str, list[Prepared]] = {}
    for p in prepared:
        by_gpu.setdefault(p.simulated.row.gpu, []).append(p)
    fitted: dict[str, dict[str, Any]] = {}
    for gpu in sorted(by_gpu):
        hw = HardwareProfile.named(gpu)
        terms = fit_gpu(hw.name, by_gpu[gpu], _unfitted(hw))
        fitted[hw.name] = {"terms": terms, "rows": by_gpu[gpu]}
    return fitted


def _unfitted(hw: HardwareProfile) -> HardwareProfile:
    """`hw` with the fractions at the fit's starting point (so a re-fit never depends on the last one)."""
    return replace(hw, matmul_efficiency={}, attention_efficiency=1.0, bandwidth_efficiency=1.0,
                   interconnect_efficiency=1.0)


def fit_json(fitted: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """sim/data/gpu_fit.json: per GPU the fitted terms, and which rows they came from; GPUs with too few
    rows borrow (the H200's 16-bit matmul fraction is the H100's: same chip; the L40S's 16-bit one is its
    FP8 one; the B200 takes the H100's terms whole)."""
    out: dict[str, Any] = {}
    h100 = fitted.get("H100-SXM", {}).get("terms", {})
    for name, entry in fitted.items():
        terms = dict(entry["terms"])
        borrowed = []
        if "matmul_16" not in terms:
            source = h100 if name == "H200" else terms
            key = "matmul_16" if name == "H200" else "matmul_fp8"
            if key in source:
                terms["matmul_16"] = source[key]
                borrowed.append("16-bit matmul fraction from " + ("H100-SXM" if name == "H200" else "its FP8 one"))
        out[name] = _json_entry(terms, entry["rows"], borrowed)
    if h100:
        out["B200"] = _json_entry(dict(h100), [], ["every term from H100-SXM: no bf16/fp8 Llama-3.1 rows for B200"])
    return out


def _json_entry(terms: dict[str, float], rows: list[Prepared], borrowed: list[str]) -> dict[str, Any]:
    entry: dict[str, Any] = {}
    matmul = {}
    if "matmul_16" in terms:
        matmul.update(bfloat16=round(terms["matmul_16"], 4), float16=round(terms["matmul_16"], 4))
    if "matmul_fp8" in terms:
        matmul["fp8"] = round(terms["matmul_fp8"], 4)
    entry["matmul_efficiency"] = matmul
    for key in ("attention_efficiency", "bandwidth_efficiency", "interconnect_efficiency"):
        if key in terms:
            entry[key] = round(terms[key], 4)
    for key in ("step_overhead_s", "per_seq_overhead_s", "interconnect_latency_s", "frontend_latency_s"):
        if key in terms:  # a term the fit drove to its zero bound is stored as 0, not as 1e-29
            entry[key] = float(f"{terms[key]:.4g}") if terms[key] >= 1e-9 else 0.0
    entry["provenance"] = {
        "fit": "benchmarks/published.py --fit: scipy least_squares on log(simulated / published)",
        "rows_in_fit": [p.simulated.row.id for p in rows if p.simulated.row.fit],
        "rows_held_out": [p.simulated.row.id for p in rows if not p.simulated.row.fit],
        "borrowed": borrowed,
    }
    return entry


# ---- the table ---------------------------------------------------------------------------------------

def frontend_latency_for(hw: HardwareProfile) -> float:
    fits = json.loads(FIT_PATH.read_text()) if FIT_PATH.is_file() else {}
    return fits.get(hw.name, {}).get("frontend_latency_s", 0.0)


def table(results: list[tuple[Row, float]]) -> str:
    lines = ["| row | setup | published | simulated | ratio | in fit |", "| --- | --- | --- | --- | --- | --- |"]
    for row, value in results:
        s = row.setup
        setup = (f"{s['model']}, {s['gpu']}, TP{s['tensor_parallel_size']}, {s['dtype']} (KV {s['kv_cache_dtype']}), "
                 f"{s['input_len']}/{s['output_len']}, {s['mode']}")
        lines.append(f"| {row.id} | {setup} | {row.value:,.2f} {row.metric} | {value:,.2f} | {value / row.value:.2f} | "
                     f"{'yes' if row.fit else 'held out'} |")
    return "\n".join(lines)


def summary(results: list[tuple[Row, float]]) -> str:
    out = []
    for label, wanted in (("in the fit", True), ("held out", False)):
        part = [(r, v) for r, v in results if r.fit == wanted]
        if not part:
            continue
        errors = [abs(v / r.value - 1) for r, v in part]
        worst_row, worst = max(zip((r for r, _ in part), errors, strict=True), key=lambda x: x[1])
        out.append(f"- {label}: {sum(e <= WITHIN for e in errors)} of {len(part)} within 15%, "
                   f"{sum(e <= 0.30 for e in errors)} within 30%; worst {worst_row.id} ({worst:+.0%} off)")
    return "\n".join(out)


def write_marked_table(path: Path, start: str, end: str, text: str, new_section: str) -> None:
    """Put `text` between the `start` and `end` markers of `path`, or, where they are absent, append
    `new_section` (which holds them): a rerun replaces its own table and nothing else."""
    results = path.read_text()
    if start in results:
        head, rest = results.split(start, 1)
        results = head + start + "\n" + text + "\n" + end + rest.split(end, 1)[1]
    else:
        results = results.rstrip("\n") + "\n\n" + new_section
    path.write_text(results)


def write_results(text: str) -> None:
    write_marked_table(RESULTS_PATH, TABLE_START, TABLE_END, text,
                       f"## The simulator against published measurements (issue 15)\n\n{TABLE_START}\n{text}\n{TABLE_END}\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit", action="store_true", help="fit the GPU profiles and write sim/data/gpu_fit.json")
    parser.add_argument("--fit-by-source", action="store_true",
                        help="fit on TensorRT-LLM's rows, judge on the other sources (benchmarks/fit_by_source.py)")
    parser.add_argument("--only", action="append", default=[], help="rows whose id contains this (repeatable)")
    parser.add_argument("--all", action="store_true", help="also the slow held-out rows (>= 2000 output tokens)")
    parser.add_argument("--no-write", action="store_true", help="print the table, leave RESULTS.md alone")
    args = parser.parse_args(argv)
    if args.fit_by_source:
        from benchmarks import fit_by_source  # imported here: it builds on this module

        fit_by_source.main(["--no-write"] if args.no_write else [])
        return
    rows = [r for r in load_rows() if (not args.only or any(o in r.id for o in args.only))
            and (args.all or args.only or not slow(r))]
    prepared = []
    for i, row in enumerate(rows):
        hw = HardwareProfile.named(row.gpu)
        simulated = simulate(row, hw, frontend_latency_for(hw))
        prepared.append(prepare(simulated, hw))
        print(f"[{i + 1}/{len(rows)}] {row.id}: {simulated.value:,.2f} vs {row.value:,.2f}", file=sys.stderr)
    if args.fit:
        FIT_PATH.parent.mkdir(parents=True, exist_ok=True)
        FIT_PATH.write_text(json.dumps(fit_json(fit_all(prepared)), indent=1) + "\n")
        print(f"wrote {FIT_PATH}", file=sys.stderr)
    results = []
    for p in prepared:
        hw = HardwareProfile.from_dict(_fitted_profile(p.simulated.row.gpu).to_dict())
        results.append((p.simulated.row, predict(p, hw, frontend_latency_for(hw))))
    text = summary(results) + "\n\n" + table(results)
    print(text)
    if not args.no_write and not args.only:
        write_results(text)


def _fitted_profile(gpu: str) -> HardwareProfile:
    """The built-in profile with the terms now in FIT_PATH (re-read: `--fit` may just have written them)."""
    hw = HardwareProfile.named(gpu)
    fits = json.loads(FIT_PATH.read_text()) if FIT_PATH.is_file() else {}
    fit = fits.get(hw.name)
    if fit is None:
        return hw
    return replace(hw, **{k: v for k, v in fit.items() if k in FITTED_FIELDS})


if __name__ == "__main__":
    main()
