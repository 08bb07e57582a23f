"""Calibration: measure the real engine on a grid of batch shapes and fit this machine's `HardwareProfile`.

A profile from a datasheet says what a chip could do; a calibrated one says what *our engine* does on it,
Python overheads included. We run small workloads chosen so the engine's steps cover the shapes the
lessons care about (decode at several batch sizes and context lengths, prefill chunks of several sizes,
mixed steps), log every step (`StepRecord`: its batch shape and wall time), and fit the cost model's
"sum" form (sim/cost_model.py):

    step time = step_overhead + per_seq * N + per_block * blocks
                + linear FLOPs / F + attention FLOPs / (F * attention_efficiency)
                + (bytes + packing_passes * weight bytes packed) / BW

which is linear in the unknowns (the overheads, 1/F, 1/(F * attention_efficiency) and packing_passes / BW),
so non-negative least squares fits them. Attention gets its own rate because our pure-torch attention
(masks, softmax, block gathers) runs far below the matmul rate, and long prompts are mostly attention.
The packing term is the weight pass a CPU GEMM of two or more rows adds over a one-row GEMV (sim/cost_model.py):
without it a speculative verify (a few rows of one request) was priced 20-25% low, and batch 1 15% high. On a
CPU compute and memory traffic do not overlap well, so the sum is also the better physics.

Two unknowns are not fitted, because the grid cannot tell them from others. BW is measured by a copy
micro-benchmark in the engine's device memory (device to device and synchronised on a GPU): every step reads all the weights, so a fitted BW would trade off freely against the
step overhead (the fit cannot tell "538 MB at 27 GB/s" from "20 ms of Python"). And the per-token overhead
is left at 0: linear FLOPs are 2 x parameters per token, so a per-token cost and 1/F are the same column
(an earlier fit that had both put everything on the overhead and read F as 1e30 FLOP/s). Without it F reads
as what it is, the engine's effective matmul rate. The fitted numbers are the *effective* ones that predict
this engine, not the chip's peak, and the profile says so.

The profile is valid only for what it was measured on: it records device, dtype, threads, torch version,
model, attention path and date, and the fit error per calibration point. It also records how steady the
machine was while the grid ran (`steadiness`): a fit taken while another program was using the cores prices
this machine wrongly (on a 2-core CPU with one core busy, it priced a speculative verify step above the
tokens it emits), so such a profile is saved flagged `steady: false`, notebooks skip the claims that rest
on it, and `load_or_calibrate` refits it once it is an hour old. `serving-lab calibrate` runs it and saves the
profile where `load_calibrated_profile()` finds it.

Tensor parallelism on a CPU. A CPU profile also records the machine's cores and the threads it was measured
on (the tensor-parallel ranks share those cores, `HardwareProfile.tensor_parallel_rate`), and this machine's
gloo all-reduce among `ALLREDUCE_WORLD_SIZES` processes, fitted to latency + bytes / bus bandwidth
(serving_lab/collectives.py; a few seconds, most of it the processes' start-up). A profile saved before it
had these gains them on its next load, without a refit (`with_measured_allreduce`).

Lesson: lessons/01-continuous-batching.md (the cost of a step).
"""

from __future__ import annotations

import datetime
import math
import platform
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from scipy.optimize import nnls

from core.arch_config import ArchConfig
from core.config import EngineConfig
from core.math_utils import cdiv
from core.metrics import RunMetrics, StepRecord
from core.workload import Workload
from serving_lab.collectives import fit_allreduce, measure_allreduce
from serving_lab.time_slice import measure_time_slice
from sim.cost_model import ROOFLINE_FEATURE_NAMES, ROOFLINE_UNKNOWNS, BatchShape, CostModel
from sim.hardware import HardwareProfile, dtype_bytes

# What the fit solves for; a saved profile fitted to another form is stale (load_or_calibrate refits).
FIT_FORM = "sum; overheads per step, seq, block; flops; attention; weight packing passes"

# (name, number of requests, prompt length, output length, token budget, block size or None for the
# calibration's); every request arrives at once. Decode points: B requests decode together at context ~prompt
# length. Prefill points: one prompt, one token out, in chunks of the budget. The last two decode points hold
# the same tokens in 1-token and 128-token blocks (lesson 2 sweeps that range): without them every row's
# blocks grow with its context, and the fit could not tell a per-block cost from a per-context-token one.
# The products stay small enough for a 2-core CPU in about a minute and a half.
CALIBRATION_GRID: tuple[tuple[str, int, int, int, int, int | None], ...] = (
    ("decode", 1, 64, 12, 512, None), ("decode", 4, 64, 12, 512, None), ("decode", 16, 64, 12, 1024, None),
    ("decode", 32, 64, 8, 2048, None), ("decode", 64, 32, 8, 2048, None),
    ("decode", 1, 512, 12, 512, None), ("decode", 8, 512, 8, 4096, None), ("decode", 2, 1536, 8, 2048, None),
    ("prefill", 1, 16, 1, 16, None), ("prefill", 1, 64, 1, 64, None), ("prefill", 1, 256, 1, 256, None),
    ("prefill", 1, 1024, 1, 1024, None), ("prefill", 1, 1024, 1, 256, None),
    ("mixed", 12, 300, 16, 128, None),
    ("decode", 8, 256, 8, 2048, 1), ("decode", 8, 256, 8, 2048, 128),
)

# The unknowns the fit solves for: all of the sum form's but the per-token overhead (the same column as
# 1/FLOP/s, see the module docstring) and 1/BW (measured).
FITTED = tuple(u for u in ROOFLINE_UNKNOWNS if u not in ("per_token_overhead_s", "seconds_per_byte"))

# The tensor-parallel degrees whose all-reduce a CPU calibration measures: those the course runs on its 2-core
# machine (3 ranks oversubscribe it). One start-up of 3 processes for both.
ALLREDUCE_WORLD_SIZES = (2, 3)

# Rows of CALIBRATION_GRID timed again when a saved profile over `REFIT_AFTER_S` old is loaded and around each fidelity case
# (decode 4 x 64, prefill 1 x 256: about a second each), and the relative change in their time beyond which
# the profile counts as stale.
DRIFT_PROBE = (1, 10)
DRIFT_TOLERANCE = 0.10

# A profile fitted less than this long ago is used as it is (`load_or_calibrate`): within an hour a shared
# machine's speed moves back and forth by tens of percent (the drift probe moved x0.70-x1.32 between fidelity
# cases minutes apart), so a refit would be no better than the fit, and the CI run's notebooks share one.
REFIT_AFTER_S = 60 * 60

# Bounds of a steady calibration (see `steadiness`), from the course machine (2 cores). Beside other short
# jobs a calibration's repeats disagreed by 9% (median) and its threads waited for a core 6% of the time,
# and the fit was as good as ever (11.6% mean error); beside busy test processes or a `while True: pass`,
# they waited 36-70% of the time, the repeats disagreed by 6-20%, and the fits were 28-77% off. The wait is
# the sharp signal; the spread catches load that comes and goes, and steal by a hypervisor, which the
# wait cannot see.
STEADY_SPREAD_PCT = 20.0
STEADY_CPU_WAIT_PCT = 15.0
# The largest mean |error| over the grid's steps of a fit taken on a steady machine that calibration saves
# (`check_fit_error`). Steady CPU fits in benchmarks/RESULTS.md came out 8-17% off, twice the bound's margin
# below it; a steady fit beyond it means the cost model's form does not describe the device (on a GPU, where
# calibrated profiles are preferred over the datasheets, it would become every notebook's simulated side). A
# fit taken on a busy machine is judged by `steadiness` instead, as before: beside busy test processes or a
# busy loop fits were 28-77% off; such a profile is saved flagged unsteady, the claims that rest on it are
# skipped and it is refit after an hour, so the notebooks still run on a busy machine.
MAX_FIT_MEAN_ERROR_PCT = 35.0
# What a user can do when a measurement ran on a busy machine; printed with every busy-machine warning.
BUSY_MACHINE_REMEDY = ("to get trustworthy numbers, close other CPU-heavy work (another notebook, a build, a "
                       "browser tab playing video), set OMP_WAIT_POLICY=PASSIVE so idle PyTorch threads stop spinning "
                       "on the cores, and rerun")


@dataclass(frozen=True)
class CalibrationPoint:
    kind: str
    shape: BatchShape
    measured_s: float
    predicted_s: float

    @property
    def error_pct(self) -> float:
        return 100.0 * (self.predicted_s - self.measured_s) / self.measured_s


class CalibrationError(RuntimeError):
    """A calibration whose fit is too far off its measurements to be saved (`MAX_FIT_MEAN_ERROR_PCT`)."""


def grid_workloads(seed: int = 0, block_size: int = EngineConfig.block_size) -> list[tuple[str, Workload, EngineConfig]]:
    """The calibration runs: a workload and an engine config for each grid row (`block_size` where the row
    does not set its own)."""
    runs = []
    for i, (kind, n, prompt, output, budget, row_block_size) in enumerate(CALIBRATION_GRID):
        workload = Workload.synthetic(n, prompt_len=prompt, output_len=output, seed=seed + i, name=kind)
        bs = row_block_size or block_size
        runs.append((kind, workload, EngineConfig(max_num_seqs=max(n, 1), max_num_batched_tokens=budget, block_size=bs,
                                                  num_kv_blocks=2 + n * (prompt + output) // bs + n)))
    return runs


def run_grid(model: Any, seed: int = 0, repeats: int = 2, rows: Sequence[int] | None = None,
             block_size: int = EngineConfig.block_size, progress: bool = False) -> list[list[RunMetrics]]:
    """Run the grid's workloads (`rows`: which, default all) on the real engine (`model`: a `LoadedModel`),
    `repeats` passes over the whole grid; returns every run, one list per workload.

    Passes, not repeats back to back: a machine that slows down for a minute then slows one repeat of
    many rows, each of which keeps its other repeat (the fit takes the faster), instead of both repeats of
    the few rows it ran meanwhile. One throw-away run first, so one-time costs (allocations, first-call
    dispatch) stay out of the fit. `progress`: a progress bar (a calibration takes ~2 minutes)."""
    # The engine and torch are imported only where the engine runs: fitting, loading and checking profiles
    # (fidelity, the simulator's defaults) work without torch.
    from tqdm import tqdm

    from ref_engine import bench

    runs = grid_workloads(seed, block_size)
    chosen = [runs[i] for i in (range(len(runs)) if rows is None else rows)]
    with tqdm(total=1 + repeats * len(chosen), desc=f"engine runs ({repeats} passes)", unit="run",
              disable=not progress) as bar:
        bench.run(runs[0][1], runs[0][2], model=model)
        bar.update()
        passes = []
        for _ in range(repeats):
            passes.append([])
            for _, workload, config in chosen:
                passes[-1].append(bench.run(workload, config, model=model))
                bar.update()
    return [list(repeated) for repeated in zip(*passes)]


def fastest_runs(runs: list[list[RunMetrics]]) -> list[RunMetrics]:
    """The fastest whole run of each workload: other processes on a shared machine only ever slow a run
    down. (Whole runs, not the fastest of each step: per-step minima are biased below any real run, and
    the measured side of every experiment keeps its fastest run too.)"""
    return [min(repeats, key=lambda m: m.duration) for repeats in runs]


def measure_grid(model: Any, seed: int = 0, repeats: int = 2, rows: Sequence[int] | None = None) -> list[RunMetrics]:
    """The fastest of `repeats` runs of each of the grid's workloads (`run_grid`, `fastest_runs`)."""
    return fastest_runs(run_grid(model, seed, repeats, rows))


def cpu_clock() -> tuple[float, float] | None:
    """Seconds this process's threads have run on a core and waited, ready, for one (summed over threads,
    from Linux's /proc/self/task/*/schedstat); None where the kernel does not report them.

    The wait is time the scheduler gave the cores to someone else: other programs, or more of our own
    threads than there are cores. Threads that exit between two readings take their counts with them."""
    import glob

    run = wait = 0
    paths = glob.glob("/proc/self/task/*/schedstat")
    for path in paths:
        try:
            with open(path) as f:
                fields = f.read().split()
        except OSError:  # the thread exited since the listing
            continue
        run, wait = run + int(fields[0]), wait + int(fields[1])
    return (run / 1e9, wait / 1e9) if paths else None


def steadiness(runs: list[list[RunMetrics]], cpu_before: tuple[float, float] | None,
               cpu_after: tuple[float, float] | None) -> dict[str, Any]:
    """How steady the machine was while `runs` (every repeat of every grid workload) were measured, as
    provenance fields: `repeat_spread_pct` (the median over workloads of slowest / fastest repeat - 1, in
    %), `cpu_wait_pct` (of the time our threads were ready to run, the share they waited for a core, in %,
    between the two `cpu_clock` readings; None where unknown) and `steady` (both within their bounds,
    `STEADY_SPREAD_PCT` and `STEADY_CPU_WAIT_PCT`).

    Two signals because each misses a case: load that comes and goes makes repeats disagree, while a
    program holding one core for the whole calibration slows every repeat alike, and only the wait shows
    it."""
    spreads = [max(m.duration for m in repeats) / min(m.duration for m in repeats) - 1
               for repeats in runs if len(repeats) > 1]
    spread_pct = 100 * float(np.median(spreads)) if spreads else None
    wait_pct = None
    if cpu_before is not None and cpu_after is not None:
        ran, waited = (after - before for after, before in zip(cpu_after, cpu_before))
        wait_pct = 100 * waited / (ran + waited) if ran + waited > 0 else None
    steady = ((spread_pct is None or spread_pct <= STEADY_SPREAD_PCT)
              and (wait_pct is None or wait_pct <= STEADY_CPU_WAIT_PCT))
    return {"repeat_spread_pct": None if spread_pct is None else round(spread_pct, 1),
            "cpu_wait_pct": None if wait_pct is None else round(wait_pct, 1), "steady": steady}


def unsteady_fit(profile: HardwareProfile) -> str | None:
    """Why `profile`'s fitted numbers do not describe this machine in a steady state (None when they do):
    it was calibrated while the machine was unsteady, or before calibration recorded steadiness. Profiles
    that were not calibrated here (datasheets) are fixed numbers, never unsteady."""
    if profile.source != "calibrated":
        return None
    p = profile.provenance
    if "steady" not in p:
        return f"profile {profile.name!r} does not record how steady the machine was when it was fitted"
    if p["steady"]:
        return None
    return (f"profile {profile.name!r} was fitted on a busy machine (repeats of its calibration runs disagreed by "
            f"{_pct(p.get('repeat_spread_pct'))} median, bound {STEADY_SPREAD_PCT:g}%; its threads waited for a core "
            f"{_pct(p.get('cpu_wait_pct'))} of the time, bound {STEADY_CPU_WAIT_PCT:g}%)")


def _pct(value: float | None) -> str:
    return "an unknown share" if value is None else f"{value:g}%"


def fastest_on(device: Any, operation: Callable[[], object], repeats: int) -> float:
    """Seconds of the fastest of `repeats` runs of `operation` on `device`, after one warm-up run (one-time
    costs: a CUDA context's lazy setup, kernel selection, page faults). Each run is timed between
    synchronisations: a GPU's kernels run asynchronously, so the clock would otherwise read launch time."""
    from ref_engine.runner import synchronize

    operation()
    best = float("inf")
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        operation()
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    return best


def measure_copy_bandwidth(device: Any = "cpu", num_bytes: int = 256 << 20, repeats: int = 5) -> float:
    """Bytes read + written per second by a large tensor copy within `device`'s memory (the best of a few).

    On a GPU the copy is device to device: a copy in host memory would measure the host's DRAM instead of
    the device's."""
    import torch

    device = torch.device(device)
    src = torch.ones(num_bytes // 4, device=device)
    dst = torch.empty_like(src)
    return 2 * num_bytes / fastest_on(device, lambda: dst.copy_(src), repeats)


def measure_matmul_rate(device: Any, dtype: Any, n: int = 4096, repeats: int = 5) -> float:
    """FLOP/s of an n x n x n matrix product on `device` in `dtype` (the best of a few): the chip's
    achievable matmul rate, which a GPU calibration records beside the engine's effective one.

    Not measured on a CPU calibration: a CPU without bf16 instructions takes minutes for one such product
    (benchmarks/machine.py sizes it down there)."""
    import torch

    device = torch.device(device)
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    return 2 * n**3 / fastest_on(device, lambda: a @ b, repeats)


def device_memory_bytes(device: Any) -> float:
    """The device memory a calibrated profile records: a GPU's total, as the driver reports it (what the
    datasheet profiles hold, nvidia-smi's number), so the simulator sizes the KV pool by the engine's rule.
    0 on a CPU: its pool is the fixed `CPU_KV_CACHE_MEMORY` (core/kv_sizing.py), and the simulator gives the
    pool rule no device memory for a CPU profile, so no number here would be read."""
    import torch

    device = torch.device(device)
    return float(torch.cuda.get_device_properties(device).total_memory) if device.type == "cuda" else 0.0


def with_measured_allreduce(profile: HardwareProfile, world_sizes: Sequence[int] = ALLREDUCE_WORLD_SIZES,
                            cores: int | None = None) -> HardwareProfile:
    """`profile` (a CPU's) with this machine's tensor-parallel terms: `cores` (None: the engine's `cpu_cores()`), `threads`
    (the threads it was measured on, from its provenance), and the gloo all-reduce measured among each of
    `world_sizes` processes, fitted (`measured_allreduce`; the interconnect terms get the 2-process fit, a
    point-to-point exchange of the buffer, which pipeline stages and KV transfers between ranks price), and
    the OS's time slice (`scheduler_slice_s`, serving_lab/time_slice.py: two processes spin on one core for
    0.5 s, ~0.6 s in all), which decides whether ranks that do not fit the cores take turns.
    `world_sizes=()` measures nothing."""

    if cores is None:
        from ref_engine.distributed.parallel_state import cpu_cores

        cores = cpu_cores()
    measured = measure_allreduce(world_sizes, cores=cores) if world_sizes else {}
    slice_s = (measure_time_slice() or 0.0) if world_sizes else profile.scheduler_slice_s
    fits = [fit_allreduce(timings) for timings in measured.values()]
    pair = next((fit for fit in fits if fit.world_size == 2), None)
    return replace(
        profile, cores=cores, threads=profile.provenance["threads"], scheduler_slice_s=slice_s,
        measured_allreduce={fit.world_size: [fit.latency_s, fit.bus_bandwidth] for fit in fits},
        interconnect_latency_s=pair.latency_s if pair else profile.interconnect_latency_s,
        interconnect_bandwidth=pair.bus_bandwidth if pair else profile.interconnect_bandwidth,
        provenance={**profile.provenance, "allreduce": {
            "transport": "gloo, one process per rank", "date": datetime.date.today().isoformat(),
            # keyed by str(world size), as JSON would
            "fit_mean_abs_error_pct": {str(fit.world_size): fit.mean_abs_error_pct for fit in fits}}})


def fit_profile(arch: ArchConfig, steps: list[tuple[str, BatchShape, float]], *, dtype: str, memory_bandwidth: float,
                memory_bytes: float = 0.0, name: str = "calibrated", provenance: dict[str, Any] | None = None
                ) -> tuple[HardwareProfile, list[CalibrationPoint]]:
    """Fit the overheads and the effective FLOP/s of the sum form to measured steps (kind, shape with its
    blocks counted, seconds), with the memory bandwidth given (measured separately) and the device's memory
    (`device_memory_bytes`); returns the profile and per-point errors.

    A quantized engine (`dtype` "int8" or "int4") runs its activations, KV cache and attention in the engine's
    dtype (provenance "dtype", e.g. float32): the profile then keys the one fitted rate under both, so the cost
    model counts those bytes at their real width and prices attention against the same rate as in the fit."""
    if len(steps) < len(FITTED):
        raise ValueError(f"need at least {len(FITTED)} measured steps to fit, got {len(steps)}")
    around = (provenance or {}).get("dtype")
    keys = [dtype] + ([around] if around and around != dtype and dtype_bytes(dtype) < 2 else [])
    # Any positive rates will do for building features: roofline_features does not depend on them.
    probe = HardwareProfile(name="probe", peak_flops=dict.fromkeys(keys, 1.0), memory_bandwidth=1.0, memory_bytes=0,
                            combine="sum", provenance={"dtype": around} if around else {})
    features_of = CostModel(arch, probe, dtype=dtype).roofline_features
    shapes = [shape for _, shape, _ in steps]
    features = np.array([features_of(shape) for shape in shapes])
    X = features[:, [ROOFLINE_UNKNOWNS.index(u) for u in FITTED]]
    bytes_moved = features[:, ROOFLINE_FEATURE_NAMES.index("bytes_per_device")]  # a known price: 1 / BW
    y = np.array([seconds for _, _, seconds in steps])
    memory_s = bytes_moved / memory_bandwidth
    # Weight rows by 1/time so that small (decode) steps count as much as big prefills (the fit then
    # minimises relative error, which is what every lesson reports), and by 1/(steps of its kind) so that
    # the few prefill steps weigh as much as the many decode steps.
    kinds = [kind for kind, _, _ in steps]
    w = 1.0 / (y * np.array([kinds.count(kind) for kind in kinds]))
    coef, _ = nnls(X * w[:, None], (y - memory_s) * w)
    fitted = dict(zip(FITTED, coef))
    tiny = 1e-30  # 1/F fitted to 0 would mean compute is never the bottleneck: an effectively infinite rate
    s_per_flop = max(fitted["seconds_per_flop"], tiny)
    profile = HardwareProfile(
        name=name, peak_flops=dict.fromkeys(keys, 1.0 / s_per_flop),
        attention_efficiency=s_per_flop / max(fitted["seconds_per_attention_flop"], tiny),
        memory_bandwidth=memory_bandwidth, memory_bytes=memory_bytes, step_overhead_s=fitted["step_overhead_s"],
        per_seq_overhead_s=fitted["per_seq_overhead_s"], per_block_overhead_s=fitted["per_block_overhead_s"],
        weight_packing_passes=fitted["seconds_per_packed_byte"] * memory_bandwidth,
        combine="sum", source="calibrated",
        notes="Effective rates and overheads of ref_engine on this machine (not the chip's peak); valid only "
              "for the device, dtype, threads and model in provenance.",
        provenance=dict(provenance or {}))
    predicted = X @ coef + memory_s
    points = [CalibrationPoint(kind, shape, float(m), float(p))
              for (kind, _, _), shape, m, p in zip(steps, shapes, y, predicted)]
    errors = np.abs([p.error_pct for p in points])
    profile.provenance.update(fit_mean_abs_error_pct=round(float(errors.mean()), 2),
                              fit_p90_abs_error_pct=round(float(np.percentile(errors, 90)), 2),
                              num_points=len(points))
    return profile, points


def grid_shape(step: StepRecord, block_size: int) -> BatchShape:
    """A measured step's shape, its KV blocks counted at the block size its grid row ran with."""
    blocks = sum([cdiv(c + q, block_size) for q, c in zip(step.query_lens, step.context_lens)])
    return replace(BatchShape.from_step(step), num_blocks_touched=blocks)


def calibrate(model: Any = None, config: EngineConfig | None = None, *, dtype: str = "float32",
              quantization: str | None = None, save: bool = True, seed: int = 0, verbose: bool = True,
              threads: int | None = None, allreduce_world_sizes: Sequence[int] = ALLREDUCE_WORLD_SIZES
              ) -> HardwareProfile:
    """Measure this machine with the real engine and return (and by default save) its fitted profile.

    `model`: a path, None for the default SmolLM2, or a `LoadedModel`. `quantization="int8"` (or "int4") measures
    that engine (a float32 `LoadedModel` is quantized first) and fits a profile whose rates are keyed
    "int8" ("int4"), the dtype the simulator prices it as (1-byte weights; 0.625 bytes a weight for int4).
    `config` only contributes its `block_size` (the grid sets the other knobs per point). `threads`: measure on that many torch threads
    (the count is restored after) and name the profile for them, so it is saved beside the default one
    (`calibrated_profile_name`); None: the threads as they are, the default name. On a CPU it also measures the
    all-reduce among `allreduce_world_sizes` processes (`with_measured_allreduce`; () skips it). On a GPU the
    profile records the device's memory and its own matmul rate. A fit on a steady machine off its steps by
    more than `MAX_FIT_MEAN_ERROR_PCT` on average is not saved: `save=True` raises `CalibrationError`."""
    import torch

    from ref_engine.model.quantization import KERNELS

    loaded = engine_model(model, dtype, quantization)
    numerics = quantization or dtype  # the simulator's dtype for this engine
    block_size = (config or EngineConfig()).block_size
    device = next(loaded.model.parameters()).device
    with torch_threads(threads):
        cpu_before = cpu_clock()
        if verbose:
            print(f"calibrating this machine: the engine runs {len(CALIBRATION_GRID)} workloads twice (~2 min)")
        runs = run_grid(loaded, seed, block_size=block_size, progress=True)
        steadiness_fields = steadiness(runs, cpu_before, cpu_clock())
        bandwidth = measure_copy_bandwidth(device)
        num_threads = torch.get_num_threads()
    fastest = fastest_runs(runs)
    steps = [(kind, grid_shape(step, row_block_size or block_size), step.duration)
             for (kind, *_, row_block_size), run in zip(CALIBRATION_GRID, fastest) for step in run.steps]
    provenance = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or platform.machine(),
        "device_type": device.type, "dtype": dtype, "quantization": quantization, "threads": num_threads,
        "torch": torch.__version__, "model": loaded.model_id, "attention": "ref_engine pure-torch paged attention",
        "block_size": block_size, "date": datetime.date.today().isoformat(),
        "fitted_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "fit_form": FIT_FORM,
        "kernel": KERNELS[quantization],
        **steadiness_fields,
    }
    if device.type == "cuda":  # the chip's own matmul rate, beside the engine's effective one the fit finds
        provenance["device_matmul_flops"] = measure_matmul_rate(device, next(loaded.model.parameters()).dtype)
    profile, points = fit_profile(loaded.arch, steps, dtype=numerics, memory_bandwidth=bandwidth,
                                  memory_bytes=device_memory_bytes(device),
                                  name=calibrated_profile_name(device.type, numerics, threads), provenance=provenance)
    if verbose:
        print(format_fit(points))
        print(f"mean |error| {profile.provenance['fit_mean_abs_error_pct']}%, "
              f"p90 {profile.provenance['fit_p90_abs_error_pct']}% over {len(points)} steps")
    if save:
        check_fit_error(profile)  # before the all-reduce's processes, and before anything is written
    profile.provenance["drift_probe_s"] = [fastest[i].duration for i in DRIFT_PROBE]
    if device.type == "cpu":
        profile = with_measured_allreduce(profile, allreduce_world_sizes)
    unsteady = unsteady_fit(profile)
    if unsteady:  # said even when not verbose: every claim that rests on this fit will be skipped
        print(f"warning: {unsteady}; claims that rest on it are skipped"
              + (", and load_or_calibrate refits it once it is an hour old" if save else "")
              + f"; {BUSY_MACHINE_REMEDY} (`serving-lab calibrate` refits at once)")
    if save:
        path = profile.save()
        if verbose:
            print(f"saved {path}")
    return profile


def check_fit_error(profile: HardwareProfile) -> None:
    """CalibrationError when `profile` was fitted on a steady machine and is off its measured steps by more
    than `MAX_FIT_MEAN_ERROR_PCT` on average: it would misprice every simulated step, and nothing flags it (a
    fit on a busy machine is saved flagged unsteady, see `MAX_FIT_MEAN_ERROR_PCT`)."""
    error = profile.provenance["fit_mean_abs_error_pct"]
    if error <= MAX_FIT_MEAN_ERROR_PCT or unsteady_fit(profile):
        return
    raise CalibrationError(
        f"calibration of {profile.name!r} not saved: its fit is {error:g}% off the measured steps on average "
        f"(mean |error|), beyond the bound of {MAX_FIT_MEAN_ERROR_PCT:g}% for a fit on a steady machine, so the "
        "cost model's form does not describe this device (calibrate(..., verbose=True) prints each step's error)")


def time_drift_probe(loaded: Any, seed: int = 0) -> list[float]:
    """Seconds the engine takes now for the `DRIFT_PROBE` grid runs, measured as calibration measured them
    (after a throw-away run, the fastest of two), so that now / then compares like with like."""
    return [run.duration for run in measure_grid(loaded, seed, rows=DRIFT_PROBE)]


def _probe_ratios(profile: HardwareProfile, loaded: Any) -> list[float] | None:
    """Now / then for each drift-probe run (None for a profile saved without probe times)."""
    then = profile.provenance.get("drift_probe_s")
    if not then:
        return None
    return [now / old for now, old in zip(time_drift_probe(loaded), then)]


def drift(profile: HardwareProfile, loaded: Any) -> float | None:
    """How far this machine's speed has moved since `profile` was calibrated: the largest |now / then - 1|
    over the drift probe's runs (None for a profile saved without probe times)."""
    ratios = _probe_ratios(profile, loaded)
    return None if ratios is None else max(abs(r - 1) for r in ratios)


def time_factor(profile: HardwareProfile, loaded: Any) -> float:
    """How many times as long this machine takes now as when `profile` was calibrated: the geometric mean
    of the drift probe's now / then (ValueError for a profile saved without probe times)."""
    ratios = _probe_ratios(profile, loaded)
    if ratios is None:
        raise ValueError(f"profile {profile.name!r} has no drift probe times; recalibrate it (serving_lab.calibrate)")
    return math.prod(ratios) ** (1 / len(ratios))


def engine_model(model: Any, dtype: str, quantization: str | None) -> Any:
    """The `LoadedModel` a calibration measures: `model` itself when its numerics match, a quantized copy of
    a float32 one, or the checkpoint at `model` (a path, or None for SmolLM2) loaded so."""
    from ref_engine.model.loader import LoadedModel, load_model, quantized

    if not isinstance(model, LoadedModel):
        return load_model(model, dtype=dtype, quantization=quantization)
    if model.quantization == quantization:
        return model
    if model.quantization is None:
        return quantized(model, quantization)
    raise ValueError(f"the model given is quantized ({model.quantization!r}); calibrating "
                     f"quantization={quantization!r} needs the float32 one")


def load_or_calibrate(model: Any = None, *, dtype: str = "float32", threads: int | None = None,
                      quantization: str | None = None) -> HardwareProfile:
    """This machine's profile, measuring it only when no saved one can serve (a calibration takes ~2 min):

    - none saved for this device, dtype and thread count, or one measured on another model, torch or
      kernel (`KERNELS`: the int8 engine changed kernels once), or fitted to another form of the cost model:
      calibrate;
    - saved less than `REFIT_AFTER_S` ago: used as it is, steady or not. A shared machine's speed moves
      by tens of percent within minutes and back, so a refit now would be no better than one taken
      minutes ago, and a busy machine is most likely still busy (a refit would be flagged again); every
      notebook would pay 2 minutes for nothing. Claims that rest on an unsteady fit are skipped, and runs
      measured in another state than the profile's are caught by their own slowdown (`course.claims`);
    - older, fitted on an unsteady machine (`unsteady_fit`): refit, whatever the probe says;
    - older and steady: the drift probe is timed again (a few seconds); beyond `DRIFT_TOLERANCE` of
      calibration time the machine has changed its state since (a laptop on battery, a new neighbour on
      the VM), so refit; within it, the profile as saved.

    A CPU profile saved before calibration measured the all-reduce gains it first (a few seconds, saved).

    `serving-lab calibrate` refits on demand. `threads`: the profile for that many torch threads (probed
    and calibrated on them, kept under a name of its own, see `calibrate`); the engines of a 1P+1D pair run
    one thread each. `quantization`: the int8 or int4 engine's profile (see `calibrate`)."""
    import torch

    from ref_engine.model.quantization import KERNELS

    loaded = engine_model(model, dtype, quantization)
    device_type = next(loaded.model.parameters()).device.type
    refit = {"dtype": dtype, "verbose": False, "threads": threads, "quantization": quantization}
    try:
        profile = HardwareProfile.named(calibrated_profile_name(device_type, quantization or dtype, threads))
    except ValueError:
        profile = None
    if (profile is None or profile.provenance.get("model") != loaded.model_id
            or profile.provenance.get("torch") != torch.__version__
            or profile.provenance.get("fit_form") != FIT_FORM
            or profile.provenance.get("kernel") != KERNELS[quantization]):
        print(f"calibrating this machine for {loaded.model_id} ({quantization or dtype}): the engine runs "
              f"{len(CALIBRATION_GRID)} workloads twice (~2 min, once; the profile is saved for every notebook "
              "and demo)")
        return calibrate(loaded, **refit)
    if device_type == "cpu" and not profile.cores:  # saved before calibration measured tensor parallelism's terms
        profile = with_measured_allreduce(profile)
        profile.save()
    elif device_type == "cpu" and not profile.scheduler_slice_s:  # saved before it measured the time slice
        profile = replace(profile, scheduler_slice_s=measure_time_slice() or 0.0)
        profile.save()
    unsteady = unsteady_fit(profile)
    age = fit_age_s(profile)
    if age is not None and age < REFIT_AFTER_S:
        if unsteady:
            print(f"using the saved profile as it is, though {unsteady}: it is {age / 60:.0f} min old and this "
                  f"machine is likely still busy (refit after {REFIT_AFTER_S // 60} min, or by `serving-lab calibrate`); "
                  f"{BUSY_MACHINE_REMEDY}")
        return profile
    if unsteady:
        print(f"the saved profile cannot be trusted: {unsteady}; recalibrating (~2 min)")
        return calibrate(loaded, **refit)
    with torch_threads(threads):
        moved = drift(profile, loaded)
    if moved is not None and moved <= DRIFT_TOLERANCE:
        return profile
    print("the saved profile is stale: " + ("it has no drift probe times" if moved is None else
          f"this machine's speed moved {100 * moved:.0f}% since it was calibrated") + "; recalibrating (~2 min)")
    return calibrate(loaded, **refit)


def fit_age_s(profile: HardwareProfile) -> float | None:
    """Seconds since `profile` was fitted (None for one saved without the time)."""
    fitted_at = profile.provenance.get("fitted_at")
    if not fitted_at:
        return None
    return (datetime.datetime.now(datetime.timezone.utc) - datetime.datetime.fromisoformat(fitted_at)).total_seconds()


def calibrated_profile_name(device_type: str, dtype: str, threads: int | None = None) -> str:
    """The saved profile's name: "calibrated-cpu-float32", or "calibrated-cpu-float32-1-threads" for one
    calibrated on a chosen thread count."""
    return f"calibrated-{device_type}-{dtype}" + (f"-{threads}-threads" if threads is not None else "")


@contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """Run the block on `threads` torch threads (None: as they are), restoring the count after."""
    import torch

    if threads is not None and threads < 1:
        raise ValueError(f"threads must be at least 1, got {threads}")
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def format_fit(points: list[CalibrationPoint]) -> str:
    """A table of measured vs predicted time per calibration point, for people."""
    lines = ["| kind | seqs | tokens | max context | measured ms | predicted ms | error % |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for p in points:
        lines.append(f"| {p.kind} | {p.shape.num_seqs} | {p.shape.num_tokens} | {max(p.shape.context_lens)} | "
                     f"{p.measured_s * 1e3:.1f} | {p.predicted_s * 1e3:.1f} | {p.error_pct:+.1f} |")
    return "\n".join(lines)
