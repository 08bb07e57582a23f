"""The engine-and-simulator pairing: the two sides (`Sides`), one workload run on both (`run_pair`, `paired_rows`
for many `Job`s, `measured_runs` for the engine's interleaved repeats), the rows they return (`metrics_row`),
how far the machine ran from its profile (`machine_slowdown`), and the checks and tables applied to the rows.

Fidelity, the sweep's measured points, the capstone report and every lesson's experiment (the course)
compare through it, so all of them compare the same way; the command line prints its tables (`format_table`).

Rows are plain dicts: `RunMetrics` fields plus `side` ("measured" | "simulated") and, on simulated rows,
`*_err_pct`, the simulated number's error relative to the measured one. The engine is only imported when a
measured side is asked for, so simulator-only sweeps run without torch.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from statistics import median
from typing import Any

from core.arch_config import ArchConfig
from core.config import EngineConfig
from core.metrics import RunMetrics, relative_error
from core.workload import Workload
from sim.cost_model import BatchShape, CostModel
from sim.hardware import HardwareProfile
from sim.simulator import Simulator, resolve_model

COMPARED = ("output_throughput", "mean_ttft_ms", "mean_itl_ms", "mean_e2el_ms", "duration")
POLICY_COUNTS = ("num_steps", "num_preemptions", "completed")


@dataclass(frozen=True)
class Sides:
    """Which model the engine serves and which profile the simulator prices it with.

    `model`: a `LoadedModel` (or None to load the default), used only for measured rows; `hardware`: a
    profile or name (None: this machine's calibrated profile); `measure=False` skips the engine.
    `arch`: the model the simulator prices (an `ArchConfig` or a name such as "llama-3.1-8b"; None: the
    engine's model, or SmolLM2-135M); `dtype`: None lets the simulator choose (a calibrated profile's own
    dtype, else bfloat16). A GPU what-if is `Sides(arch="llama-3.1-8b", hardware="h100-sxm", measure=False)`."""

    model: Any = None
    hardware: HardwareProfile | str | None = None
    measure: bool = True
    repeats: int = 1
    arch: ArchConfig | str | None = None
    dtype: str | None = None
    kv_cache_dtype: str = "auto"  # what the engine's KV cache stores ("auto": the model's dtype), priced alike

    def simulated_arch(self) -> ArchConfig:
        """The model the simulator prices: `arch`, else the engine's model, else the default."""
        if self.arch is None and getattr(self.model, "arch", None) is not None:
            return self.model.arch
        return resolve_model(self.arch)

    def simulator(self, config: EngineConfig) -> Simulator:
        kv_cache_dtype = None if self.kv_cache_dtype == "auto" else self.kv_cache_dtype
        return Simulator(self.simulated_arch(), self.hardware, config, dtype=self.dtype, kv_cache_dtype=kv_cache_dtype)

    def cost_model(self, block_size: int = EngineConfig.block_size) -> CostModel:
        """The step-time model the simulator of these sides uses (same model, profile and dtype)."""
        return self.simulator(EngineConfig(block_size=block_size, num_kv_blocks=1)).cost_model


def run_pair(workload: Workload, config: EngineConfig, sides: Sides, *, warmup: Workload | None = None,
             **labels: Any) -> list[dict[str, Any]]:
    """Run one workload and config on both sides; returns [measured row, simulated row] (or just simulated).

    `warmup`, when given, is served first on the same engine and not measured (a warm prefix cache). The
    engine runs `sides.repeats` times and the fastest run is kept, as calibration keeps the fastest step:
    on a shared machine other processes only ever slow a run down."""
    return paired_rows([Job(workload, config, labels, warmup=(warmup,) if warmup else ())], sides)


def machine_slowdown(measured: RunMetrics, sides: Sides) -> float:
    """How much slower the machine ran than its profile says: the median, over a measured run's steps, of
    (measured step time / the cost model's price of that very batch shape). About 1 when the machine is in
    the state it was calibrated in; clearly above 1 when other programs were using the cores meanwhile,
    clearly below 1 when the machine now runs faster than when it was calibrated. Either way absolute
    simulated-vs-measured errors then say nothing about the simulator. (Every row of a step is priced as
    needing logits: a mid-prompt chunk is priced one lm_head row too high, a small bias.)"""
    return _slowdown(measured.steps, sides)


def prefill_slowdown(measured: RunMetrics, sides: Sides) -> float | None:
    """`machine_slowdown` over the steps that ran prompt tokens only (None: no such step). TTFT is made of
    these steps, and the median over all steps can hide them behind many decode steps: prefills that ran
    off-profile (load that came and went with them, or a fit that prices prompt chunks off) show only here."""
    steps = [s for s in measured.steps if any(n > 1 for n in s.query_lens)]
    return _slowdown(steps, sides) if steps else None


def _slowdown(steps: list[Any], sides: Sides) -> float:
    cost_model = sides.cost_model()
    return median(s.duration / cost_model.step_time(BatchShape.from_step(s)) for s in steps)


def drift_note(slowdown: float, busy: float = 1.15) -> str | None:
    """Why a measurement cannot be judged against the profile (None when it can): the engine ran more than
    `busy` times slower than the profile predicts (a busy machine), or more than `busy` times faster (the
    profile is stale)."""
    if slowdown > busy:
        return f"the engine ran {slowdown:.2f}x slower than its profile predicts (a busy machine)"
    if slowdown < 1 / busy:
        return (f"the engine ran {1 / slowdown:.2f}x faster than its profile predicts (the profile is stale: "
                "recalibrate with serving_lab.calibrate.calibrate(model))")
    return None


def drift_notes(measured: dict[str, Any], busy: float = 1.15) -> str | None:
    """`drift_note` for a measured row: its `slowdown` over all steps, then its `prefill_slowdown`."""
    note = drift_note(measured.get("slowdown", 1.0), busy)
    prefill = measured.get("prefill_slowdown")
    if note is None and prefill is not None and (prefill_note := drift_note(prefill, busy)):
        note = f"its prefill steps: {prefill_note}"
    return note


def error_check(rows: Iterable[dict[str, Any]], fields: Iterable[str], tolerance_pct: float = 35.0,
                busy: float = 1.15) -> tuple[list[str], list[str]]:
    """Check every (measured, simulated) pair: each `field` simulated within `tolerance_pct` of measured.

    Returns (problems, skipped). A pair whose measured run has a `slowdown` beyond `busy` either way (see
    `drift_note`) is skipped and listed, not judged. Notebooks assert `not problems` and print `skipped`."""
    fields = list(fields)
    problems, skipped = [], []
    for measured, simulated in pairs(rows):
        label = ", ".join(f"{k}={v}" for k, v in measured.items() if k not in _NOT_LABELS and not _is_metric(k))
        note = drift_notes(measured, busy)
        if note:
            skipped.append(f"{label}: skipped, {note}")
            continue
        for field in fields:
            error = simulated[f"{field}_err_pct"]
            if not abs(error) <= tolerance_pct:
                problems.append(f"{label}: {field} simulated {simulated[field]:.4g} vs measured "
                                f"{measured[field]:.4g} ({error:+.1f}%, tolerance {tolerance_pct:g}%)")
    return problems, skipped


_NOT_LABELS = {"side", "metrics", "slowdown", "prefill_slowdown", "repeat_spread_pct"}


def _is_metric(key: str) -> bool:
    return key in RunMetrics.__dataclass_fields__ or key.endswith("_err_pct")


def metrics_row(metrics: RunMetrics, side: str, labels: dict[str, Any], reference: RunMetrics | None = None
                ) -> dict[str, Any]:
    """One row: the labels, `side`, the metrics' scalar fields and the `RunMetrics` itself under "metrics";
    with a measured `reference`, the `*_err_pct` of each `COMPARED` field."""
    row = {**labels, "side": side, **metrics.to_dict(), "metrics": metrics}
    if reference is not None:
        for key in COMPARED:
            row[f"{key}_err_pct"] = relative_error(getattr(metrics, key), getattr(reference, key))
    return row


def pairs(rows: Iterable[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(measured, simulated) row pairs, in order."""
    rows = list(rows)
    return [(m, s) for m, s in zip(rows, rows[1:]) if m["side"] == "measured" and s["side"] == "simulated"]


def same_policy(measured: RunMetrics, simulated: RunMetrics) -> bool:
    """True when the shared core made the same decisions on both sides: same steps, same batch shapes in
    the same order, same preemptions. Holds whenever arrivals do not depend on timing (all at once)."""
    return (all(getattr(measured, k) == getattr(simulated, k) for k in POLICY_COUNTS)
            and [(s.query_lens, s.context_lens) for s in measured.steps]
            == [(s.query_lens, s.context_lens) for s in simulated.steps])


def format_table(rows: Iterable[dict[str, Any]], columns: Iterable[str]) -> str:
    """A plain-text table of `columns` (missing values blank; `*_err_pct` columns as signed percents)."""
    columns = list(columns)
    cells = [[_cell(row.get(c), c) for c in columns] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(columns, widths)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(v.rjust(w) for v, w in zip(r, widths)) for r in cells]
    return "\n".join(lines)


def _cell(value: Any, column: str) -> str:
    if value is None:
        return ""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if column.endswith("_err_pct"):
        return f"{value:+.1f}%"
    if isinstance(value, int):
        return str(value)
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"


@dataclass(frozen=True)
class Job:
    """One configuration of an experiment: what to run, how to label its rows, whether to measure."""

    workload: Workload
    config: EngineConfig
    labels: dict[str, Any]
    measure: bool = True
    warmup: tuple[Workload, ...] = ()  # served first on the same engine (not measured): a warm prefix cache

    def run_measured(self, sides: Sides) -> RunMetrics:
        # The engine (torch) is imported only where a measured side needs it: simulator-only sweeps run without.
        from ref_engine import bench

        return bench.run_rounds([*self.warmup, self.workload], self.config, model=sides.model,
                                kv_cache_dtype=sides.kv_cache_dtype)[-1]

    def run_simulated(self, sides: Sides) -> RunMetrics:
        return sides.simulator(self.config).run_rounds([*self.warmup, self.workload])[-1]


def measured_runs(jobs: list[Job], sides: Sides) -> dict[int, list[RunMetrics]]:
    """Job index -> its engine runs: every measured job once, then every one again (`sides.repeats`
    rounds), so a burst of load from another process slows one run of a job rather than all of them."""
    runs: dict[int, list[RunMetrics]] = {}
    if sides.measure:
        for _ in range(sides.repeats):
            for i, job in enumerate(jobs):
                if job.measure:
                    runs.setdefault(i, []).append(job.run_measured(sides))
    return runs


def paired_rows(jobs: list[Job], sides: Sides, simulate: Any = None) -> list[dict[str, Any]]:
    """[measured row, simulated row] per job, as `run_pair` makes them, with the engine's repeats
    interleaved (`measured_runs`) and the fastest run of each kept. `simulate(job)` returns
    (RunMetrics, extra columns for the simulated row); by default the sides' simulator runs the workload."""
    runs = measured_runs(jobs, sides)
    rows = []
    for i, job in enumerate(jobs):
        simulated, extra = simulate(job) if simulate else (job.run_simulated(sides), {})
        fastest = min(runs[i], key=lambda m: m.duration) if i in runs else None
        if fastest is not None:
            slowest = max(m.duration for m in runs[i])
            rows.append({**metrics_row(fastest, "measured", job.labels), "slowdown": machine_slowdown(fastest, sides),
                         "prefill_slowdown": prefill_slowdown(fastest, sides),
                         "repeat_spread_pct": 100.0 * (slowest / fastest.duration - 1)})  # the runs' disagreement
        rows.append({**metrics_row(simulated, "simulated", job.labels, reference=fastest), **extra})
    return rows
