"""`serving-lab sweep`: a grid of configurations through the simulator, a few of them through the engine,
the Pareto front, and how well the simulator ranks what the engine measured.

A sweep starts from a deployment manifest (the base) and a grid file: each key a knob (`KNOBS`, vLLM's
names), each value the list of settings to try. Every combination (a `Point`) runs in the simulator on the
same seeded workload, which takes a fraction of a second per point; the points the grid marks under
`measure:` (and, with `measure_front`, the simulated Pareto front) also run on the real engine. Why both:
the simulator is what makes a dense grid affordable, and the engine points are what make it trustworthy.
When their rankings agree (Spearman's rho near 1) the dense grid can be believed where it was not measured;
this is how Vidur (Agrawal et al., MLSys'24) searches configurations, and why lesson 7 reports rho.

Numerics are knobs too (`dtype`, `quantization`, `kv_cache_dtype`): a measured point off the float32 path
is also judged on the eval set (agreement and KL against float32, serving_lab/eval_set.py), so one table holds
speed and quality; the simulator leaves unpriced the paths its profile has no rate for (`Sweep.unpriced`).

The front is the set of points no other point beats on every axis at once: higher output throughput, lower
p99 inter-token latency, lower p99 TTFT. Which point on it is "best" depends on the SLO, so the sweep also
prints goodput (requests/s within the SLO, DistServe's definition) when one is given.

Results go to an output folder as they come: `points.jsonl` gets a line per finished point, so an
interrupted sweep resumes where it stopped (`sweep.json` in the folder records what the sweep was, and a
folder holding a different sweep is refused rather than mixed). The tidy table (`sweep.csv`, `sweep.json`)
is written at the end, each file to a temporary name first and renamed, so no half-written table is left.

Lesson: lessons/07-tuning-knobs.md (sweeping the knobs, the Pareto front, trusting a simulator's ranking).
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import math
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from core.config import DTYPES, KV_CACHE_DTYPES, QUANTIZATION_METHODS, EngineConfig
from core.metrics import RunMetrics
from serving_lab.manifest import Manifest, ManifestError, naming_keys, step_token_budget
from serving_lab.workload_spec import parse_workload
from sim.hardware import DTYPE_BYTES, HardwareProfile
from sim.simulator import Simulator, resolve_hardware


@dataclass(frozen=True)
class Knob:
    """One key a grid may sweep: where it goes (an `EngineConfig` field, or an argument of the simulator
    only), which values the one-device CPU engine can also run (None: any), and what it trades."""

    where: str  # "config" | "simulator"
    doc: str
    engine_values: tuple[Any, ...] | None = None


KNOBS: dict[str, Knob] = {
    "max_num_seqs": Knob("config", "most requests running at once (lesson 1: batch size against ITL)"),
    "max_num_batched_tokens": Knob("config", "the step's token budget (lesson 3: TTFT against ITL)"),
    "prefill_budget_tokens": Knob("config", "most prefill tokens in one step (lesson 3; the manifest's key)"),
    "decode_batch_max_tokens": Knob("config", "most decode rows in one step (lesson 3; the manifest's key)"),
    "long_prefill_token_threshold": Knob("config", "most prefill tokens one request gets per step (lesson 3)"),
    "max_num_partial_prefills": Knob("config", "most prompts mid-prefill at once (lesson 3)"),
    "block_size": Knob("config", "tokens per KV block (lesson 2: per-block cost against tail waste)"),
    "num_kv_blocks": Knob("config", "the KV pool in blocks, i.e. KV memory (lesson 2: preemption)"),
    "gpu_memory_utilization": Knob("config", "share of device memory for weights and KV (GPU profiles)"),
    "preemption_mode": Knob("config", "recompute or swap when the KV pool runs out (lesson 2)"),
    "scheduling_policy": Knob("config", "fcfs, priority or fair (lesson 3)"),
    "enable_chunked_prefill": Knob("config", "split long prompts over steps (lesson 3)"),
    "enable_prefix_caching": Knob("config", "reuse KV blocks of shared prefixes (lesson 4)"),
    "num_speculative_tokens": Knob("config", "draft tokens per step with prompt lookup, 0 = off (lesson 5)"),
    "acceptance_rate": Knob("simulator", "the simulator's assumed share of accepted draft tokens (lesson 5)"),
    "dtype": Knob("simulator", "weight and activation dtype priced (lesson 1: bytes per weight)",
                  engine_values=DTYPES),
    "quantization": Knob("simulator", "int8 or int4 weights (null: none), priced as the linear layers' dtype",
                         engine_values=(None, "int8", "int4")),
    "kv_cache_dtype": Knob("simulator", "KV-cache dtype priced, e.g. fp8 with bfloat16 weights",
                           engine_values=(None, *KV_CACHE_DTYPES)),
    "tensor_parallel_size": Knob("simulator", "GPUs one replica is split over (all-reduces per layer)",
                                 engine_values=(1,)),
    "pipeline_parallel_size": Knob("simulator", "pipeline stages of one replica (the bubble)", engine_values=(1,)),
}

# The metrics each row of the table carries (RunMetrics fields), the Pareto axes among them; the hit and
# acceptance rates say what prefix caching and speculation found in the workload (nan: no drafts).
TABLE_METRICS = ("output_throughput", "request_throughput", "mean_ttft_ms", "p99_ttft_ms", "mean_itl_ms",
                 "p99_itl_ms", "mean_tpot_ms", "p99_tpot_ms", "num_preemptions", "completed", "failed",
                 "prefix_cache_hit_rate", "draft_acceptance_rate")
MAXIMIZE = ("output_throughput",)
# A measured point off the float32 path is judged on this much of the eval set (serving_lab/eval_set.py).
EVAL_PROMPTS, EVAL_TOKENS = 24, 32
MINIMIZE = ("p99_itl_ms", "p99_ttft_ms")


@dataclass(frozen=True)
class SLO:
    """A service-level objective: every request's TTFT and TPOT within these bounds (None: unbounded). Its
    goodput goes in the table's `goodput` column, or `goodput_<label>` when several SLOs are compared."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    label: str = ""

    @property
    def column(self) -> str:
        return f"goodput_{self.label}" if self.label else "goodput"


@dataclass(frozen=True)
class Numerics:
    """A point's numeric path: what the linear layers compute in and what the KV cache stores. Every path
    but the float32 reference's changes the engine's outputs, so the eval set judges it."""

    dtype: str | None  # None: the simulator's choice (a calibrated profile's own), float32 on the engine
    quantization: str | None  # None, "int8" or "int4" (weight-only)
    kv_cache_dtype: str  # "auto": the model's dtype

    @property
    def priced_dtype(self) -> str | None:
        """The dtype the simulator prices the linear layers in."""
        return self.quantization or self.dtype

    @property
    def is_reference(self) -> bool:
        return (self.dtype or "float32") == "float32" and self.quantization is None and \
            self.kv_cache_dtype in ("auto", "float32")


@dataclass(frozen=True)
class Point:
    """One configuration of the grid: knob -> value, in the grid's key order."""

    knobs: tuple[tuple[str, Any], ...]

    @property
    def id(self) -> str:
        return " ".join(f"{name}={value}" for name, value in self.knobs) or "base"

    def get(self, name: str, default: Any = None) -> Any:
        return dict(self.knobs).get(name, default)

    def config(self, base: EngineConfig) -> EngineConfig:
        """The base config with this point's config knobs set (0 speculative tokens: speculation off)."""
        knobs = {name: value for name, value in self.knobs if KNOBS[name].where == "config"}
        k = knobs.pop("num_speculative_tokens", None)
        if k:
            knobs.update(num_speculative_tokens=k, speculative_method="ngram")
        elif k == 0:
            knobs["speculative_method"] = None
        budgets = {"prefill_budget_tokens", "decode_batch_max_tokens", "max_num_seqs"}
        if base.prefill_budget_tokens is not None and "max_num_batched_tokens" not in knobs and budgets & set(knobs):
            merged = {name: knobs.get(name, getattr(base, name)) for name in budgets}
            if merged["prefill_budget_tokens"] is not None:  # the manifest's rule: both budgets fit one step
                knobs["max_num_batched_tokens"] = step_token_budget(**merged)
        try:
            return replace(base, **knobs)
        except (ValueError, TypeError) as error:
            raise ManifestError(f"grid point {self.id}: {error}") from None


@dataclass(frozen=True)
class Grid:
    """A grid file: `knobs` (knob -> the values to try), `measure` (points to run on the engine too)."""

    knobs: dict[str, list[Any]]
    measure: tuple[Point, ...] = ()

    def points(self) -> list[Point]:
        names = list(self.knobs)
        return [Point(tuple(zip(names, values))) for values in itertools.product(*self.knobs.values())]


def parse_grid(data: Any, source: str = "grid") -> Grid:
    """A grid from its YAML data: a mapping of knobs to lists (a scalar is a list of one), plus an optional
    `measure:` list of mappings naming points of the grid. Anything else is a `ManifestError` naming it."""
    if not isinstance(data, dict) or not data:
        raise ManifestError(f"{source}: a grid is a mapping of knobs to lists of values, e.g. "
                            f"{{max_num_seqs: [8, 32]}}; got {data!r}")
    data = dict(data)
    marked = data.pop("measure", None) or []
    knobs: dict[str, list[Any]] = {}
    for name, values in data.items():
        if name not in KNOBS:
            raise ManifestError(f"{source}: {name!r} is not a knob; knobs: {', '.join(KNOBS)}")
        values = values if isinstance(values, list) else [values]
        if not values:
            raise ManifestError(f"{source}: {name}: an empty list of values (give at least one)")
        if len(set(map(repr, values))) != len(values):
            raise ManifestError(f"{source}: {name}: a value listed twice in {values!r}")
        knobs[name] = values
    if not knobs:
        raise ManifestError(f"{source}: the grid has no knobs (only `measure:`)")
    grid = Grid(knobs)
    measure = []
    for i, entry in enumerate(marked if isinstance(marked, list) else [marked]):
        if not isinstance(entry, dict) or not set(entry) <= set(knobs):
            raise ManifestError(f"{source}: measure[{i}]: a mapping of the grid's knobs, got {entry!r}")
        matches = [p for p in grid.points() if all(p.get(k) == v for k, v in entry.items())]
        if not matches:
            raise ManifestError(f"{source}: measure[{i}]: {entry!r} is no point of the grid")
        measure += [p for p in matches if p not in measure]
    return Grid(knobs, tuple(measure))


def load_grid(path: str | Path) -> Grid:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise ManifestError(f"{path}: cannot read the grid ({error.strerror})") from None
    except yaml.YAMLError as error:
        raise ManifestError(f"{path}: not valid YAML: {error}") from None
    return parse_grid(data, str(path))


@dataclass
class Sweep:
    """What to sweep: a base manifest, a grid, a workload spec (`workload_spec.WORKLOAD_SPEC`), a hardware
    profile for the simulator (None: this machine's calibrated one), and SLOs to report goodput at."""

    manifest: Manifest
    grid: Grid
    workload: str
    hardware: HardwareProfile | str | None = None
    slos: tuple[SLO, ...] = ()
    seed: int = 0

    def __post_init__(self) -> None:
        self.hardware = resolve_hardware(self.hardware)
        self._path_profiles: dict[str, HardwareProfile | None] = {}
        self.base = self.manifest.simulator_kwargs()
        self._workload = parse_workload(self.workload, self.seed)
        for point in self.grid.points():  # every point's config is valid before anything runs
            if not self.unpriced(point):
                self.simulator(point)

    def unpriced(self, point: Point) -> str | None:
        """Why the simulator leaves a point unpriced (None: it prices it): a calibrated CPU profile has the
        rate of the one numeric path it was measured on, so a grid sweeping numerics (dtype, quantization)
        gets blank simulated rows for the paths no profile prices (`profile_for`), which the engine can still
        measure (speed, and quality on the eval set). A manifest whose own numerics the profile cannot price is
        refused instead."""
        if self.profile_for(point) is not None:
            return None
        dtype = self.numerics(point).priced_dtype
        flag = "--quantization" if dtype in QUANTIZATION_METHODS else "--dtype"
        return (f"profile {self.hardware.name!r} has no rate for {dtype} (it knows "
                f"{', '.join(self.hardware.peak_flops)}), and this machine has no {dtype} calibration "
                f"(`serving-lab calibrate {flag} {dtype}` measures one)")

    def profile_for(self, point: Point) -> HardwareProfile | None:
        """The profile that prices `point`: the sweep's own, or, for a numeric path that one has no rate for,
        this machine's calibration of that path when the sweep's profile is this machine's calibration too
        (`serving-lab calibrate --quantization int4` saves "calibrated-cpu-int4": each path priced by its own
        measured rates); None when neither prices it."""
        dtype = self.numerics(point).priced_dtype
        if dtype in (None, self.numerics(Point(())).priced_dtype) or dtype in self.hardware.peak_flops \
                or dtype not in DTYPE_BYTES:  # an unknown dtype: `simulator` refuses it
            return self.hardware
        if dtype not in self._path_profiles:
            self._path_profiles[dtype] = path_calibration(self.hardware, dtype)
        return self._path_profiles[dtype]

    def spec(self) -> dict[str, Any]:
        """What identifies this sweep's results (a resumed sweep must match it)."""
        hardware = self.hardware
        paths = {profile.name: profile.provenance.get("fitted_at") for point in self.grid.points()
                 if (profile := self.profile_for(point)) is not None and profile is not hardware}
        return {"manifest": self.manifest.model_dump(mode="json"), "grid": self.grid.knobs,
                "workload": self.workload, "seed": self.seed, "slos": [vars(slo) for slo in self.slos],
                "hardware": {"name": hardware.name, "fitted_at": hardware.provenance.get("fitted_at"),
                             **({"paths": paths} if paths else {})}}

    def simulator(self, point: Point) -> Simulator:
        from sim.spec_decode import AcceptanceRate

        config = point.config(self.base["config"])
        speculating = config.speculative_method is not None
        rate = point.get("acceptance_rate")
        if speculating and rate is None:
            raise ManifestError(f"grid point {point.id}: speculation needs an `acceptance_rate` knob "
                                "(the simulator's assumption of the share of draft tokens accepted)")
        numerics = self.numerics(point)
        given = {"dtype": numerics.dtype, "quantization": numerics.quantization,
                 "kv_cache_dtype": None if numerics.kv_cache_dtype == "auto" else numerics.kv_cache_dtype}
        for name, value in given.items():
            if value is not None and value not in DTYPE_BYTES:
                raise ManifestError(f"grid point {point.id}: {name}: unknown dtype {value!r}; "
                                    f"known: {', '.join(DTYPE_BYTES)}")
        extra = {k: v for k, v in (("dtype", numerics.priced_dtype), ("kv_cache_dtype", given["kv_cache_dtype"]))
                 if v is not None}
        with naming_keys():
            try:
                return Simulator(self.base["model"], self.profile_for(point), config,
                                 tensor_parallel_size=point.get("tensor_parallel_size",
                                                                self.base["tensor_parallel_size"]),
                                 pipeline_parallel_size=point.get("pipeline_parallel_size", 1),
                                 acceptance=AcceptanceRate((rate,)) if speculating else None,
                                 draft_arch=self.base.get("draft_arch"), **extra)
            except ValueError as error:
                raise ManifestError(f"grid point {point.id}: {error}") from None

    def numerics(self, point: Point) -> Numerics:
        """The point's numeric path: its knobs, else the manifest's."""
        engine = self.manifest.engine
        return Numerics(point.get("dtype", engine.dtype), point.get("quantization", engine.quantization),
                        point.get("kv_cache_dtype", engine.kv_cache_dtype) or "auto")

    def simulate(self, point: Point) -> dict[str, Any]:
        if reason := self.unpriced(point):
            return {"point": point.id, **dict(point.knobs), "side": "simulated",
                    **dict.fromkeys(TABLE_METRICS), "unpriced": reason}
        simulator = self.simulator(point)
        metrics = simulator.run(self._workload)
        return self.row(point, "simulated", metrics, num_kv_blocks=simulator.num_kv_blocks)

    def row(self, point: Point, side: str, metrics: RunMetrics, **extra: Any) -> dict[str, Any]:
        row = {"point": point.id, **dict(point.knobs), "side": side,
               **{name: getattr(metrics, name) for name in TABLE_METRICS}, **extra}
        for slo in self.slos:
            row[slo.column] = metrics.goodput(slo.ttft_ms, slo.tpot_ms)
        return row

    def check_engine_can_run(self, point: Point) -> None:
        """A point the one-device CPU engine cannot honour (beyond what the manifest's `llm_kwargs` refuses)
        is refused before anything runs."""
        for name, value in point.knobs:
            allowed = KNOBS[name].engine_values
            if allowed is not None and value not in allowed:
                raise ManifestError(f"grid point {point.id}: the engine cannot run {name}={value!r} (it runs "
                                    f"{', '.join(map(repr, allowed))}); leave the point to the simulator")
        numerics = self.numerics(point)
        if numerics.quantization is not None and numerics.dtype not in (None, "float32"):
            raise ManifestError(f"grid point {point.id}: quantization={numerics.quantization} computes in float32 "
                                f"around its quantized products; the engine cannot run it with dtype={numerics.dtype}")

    def measure(self, points: Sequence[Point], repeats: int = 1, model: Any = None,
                eval_prompts: int = EVAL_PROMPTS, eval_tokens: int = EVAL_TOKENS) -> list[dict[str, Any]]:
        """The points on the engine (each `repeats` times, interleaved, the fastest kept), as table rows with
        the machine's `slowdown` against the profile (`pairing.machine_slowdown`). A point off the float32
        path (`Numerics`: dtype, quantization, KV-cache dtype) is judged on the eval set too (`agreement`,
        `mean_kl` against float32 on the first `eval_prompts` prompts, `eval_tokens` tokens each), once per
        path. `model`: a loaded float32 model to reuse."""
        from ref_engine.model.loader import load_model, quantized
        from serving_lab.calibrate import fastest_runs
        from serving_lab.eval_set import compare_quality
        from serving_lab.eval_set import eval_prompts as prompts
        from serving_lab.pairing import Job, Sides, machine_slowdown, measured_runs

        path = self.manifest.measured_llm_kwargs()["model"]  # refuses what the engine cannot run at all
        for point in points:
            self.check_engine_can_run(point)
        reference = model  # the float32 model, loaded once if needed
        rows = []
        for numerics in dict.fromkeys(map(self.numerics, points)):
            chosen = [p for p in points if self.numerics(p) == numerics]
            reference = reference or load_model(path)
            if numerics.dtype in (None, "float32"):  # the reference's weights, quantized in a copy if asked
                loaded = quantized(reference, numerics.quantization) if numerics.quantization else reference
            else:
                loaded = load_model(path, dtype=numerics.dtype)
            quality: dict[str, float] = {}
            if not numerics.is_reference:
                judged = compare_quality(reference, [loaded], prompts(eval_prompts), eval_tokens,
                                         kv_cache_dtype=numerics.kv_cache_dtype)[0]
                quality = {"agreement": judged.agreement, "mean_kl": judged.mean_kl}
            sides = Sides(model=loaded, hardware=self.profile_for(chosen[0]) or self.hardware, repeats=repeats,
                          arch=self.base["model"],
                          dtype=numerics.priced_dtype or "float32", kv_cache_dtype=numerics.kv_cache_dtype)
            jobs = [Job(self._workload, p.config(self.base["config"]), {}) for p in chosen]
            for point, fastest in zip(chosen, fastest_runs(list(measured_runs(jobs, sides).values()))):
                slowdown = None if self.unpriced(point) else machine_slowdown(fastest, sides)
                rows.append(self.row(point, "measured", fastest, slowdown=slowdown, **quality))
        return rows


def path_calibration(hardware: HardwareProfile, dtype: str) -> HardwareProfile | None:
    """This machine's saved calibration of the numeric path `dtype` ("calibrated-cpu-int4"), if `hardware` is
    one of this machine's calibrations (a "calibrated-<device>-..." profile) and that path's file exists."""
    from serving_lab.calibrate import calibrated_profile_name

    parts = hardware.name.split("-")
    if len(parts) < 3 or parts[0] != "calibrated":
        return None
    try:
        profile = HardwareProfile.named(calibrated_profile_name(parts[1], dtype))
    except ValueError:
        return None
    return profile if dtype in profile.peak_flops else None


def pareto_front(rows: Sequence[Mapping[str, Any]], maximize: Iterable[str] = MAXIMIZE,
                 minimize: Iterable[str] = MINIMIZE) -> list[int]:
    """Indices of the rows no other row dominates: at least as good on every axis and better on one."""
    maximize, minimize = tuple(maximize), tuple(minimize)

    def key(row: Mapping[str, Any]) -> tuple[float, ...]:  # larger is better on every axis
        return tuple(row[m] for m in maximize) + tuple(-row[m] for m in minimize)

    keys = [key(row) for row in rows]
    return [i for i, k in enumerate(keys)
            if not any(all(o >= s for o, s in zip(other, k)) and other != k for other in keys)]


def rank_agreement(measured: Sequence[Mapping[str, Any]], simulated: Sequence[Mapping[str, Any]],
                   metric: str = "output_throughput") -> dict[str, Any]:
    """Spearman's rho between the simulated and measured `metric` over the measured points the simulator
    priced, with the points (rho is NaN below 3 points: two points always rank the same or opposite)."""
    from scipy.stats import spearmanr

    by_point = {row["point"]: row for row in simulated}
    listed = [{"point": m["point"], "measured": m[metric], "simulated": by_point[m["point"]][metric]}
              for m in measured if by_point[m["point"]][metric] is not None]  # unpriced points rank nowhere
    rho = math.nan
    if len(listed) >= 3:
        rho = float(spearmanr([p["measured"] for p in listed], [p["simulated"] for p in listed]).statistic)
    return {"metric": metric, "rho": rho, "points": listed}


@dataclass
class SweepResult:
    rows: list[dict[str, Any]]  # one per (point, side): simulated for every point, measured for a few
    front: list[str]  # point ids on the simulated Pareto front
    agreement: dict[str, Any]  # rank_agreement over the measured points

    def simulated(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if r["side"] == "simulated"]

    def measured(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if r["side"] == "measured"]


def run_sweep(sweep: Sweep, out: str | Path | None = None, *, measure_front: bool = False, repeats: int = 1,
              model: Any = None, progress: bool = False, force: bool = False, jobs: int = 1) -> SweepResult:
    """Simulate every point (resuming from `out/points.jsonl` when `out` holds this sweep; `jobs` processes
    at once), measure the grid's marked points (and the simulated front with `measure_front`) on the engine,
    and write the table. The table does not depend on `jobs`: each point is simulated on its own."""
    from tqdm import tqdm

    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    folder = Path(out) if out is not None else None
    done = _resume(folder, sweep.spec(), force) if folder else {}
    points = sweep.grid.points()
    todo = [point for point in points if point.id not in done]
    log = (folder / "points.jsonl").open("a", encoding="utf-8") if folder else None
    try:
        bar = tqdm(total=len(points), initial=len(points) - len(todo), desc="sweep", unit="point",
                   disable=not progress)
        for row in simulate_points(sweep, todo, jobs):
            done[row["point"]] = row
            bar.update()
            if log:
                log.write(json.dumps(row) + "\n")
                log.flush()
        bar.close()
    finally:
        if log:
            log.close()
    simulated = [done[p.id] for p in points]
    priced = [row for row in simulated if "unpriced" not in row]
    front = [priced[i]["point"] for i in pareto_front(priced)]
    for row in simulated:
        row["on_front"] = row["point"] in front
    chosen = list(sweep.grid.measure)
    if measure_front:
        chosen += [p for p in points if p.id in front and p not in chosen]
    measured = sweep.measure(chosen, repeats, model) if chosen else []
    for row in measured:
        row["on_front"] = row["point"] in front
    result = SweepResult(simulated + measured, front, rank_agreement(measured, simulated))
    if folder:
        write_table(result, folder)
    return result


def simulate_points(sweep: Sweep, points: list[Point], jobs: int) -> Iterator[dict[str, Any]]:
    """The points' simulated rows as they finish: in this process, or in `jobs` fresh ("spawn") processes,
    which import no torch and leave the caller's threads alone."""
    if jobs == 1 or len(points) < 2:
        yield from map(sweep.simulate, points)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(sweep.simulate, point) for point in points]
        for future in as_completed(futures):
            yield future.result()


def _resume(folder: Path, spec: dict[str, Any], force: bool) -> dict[str, dict[str, Any]]:
    """The points `folder` already holds for this sweep; a folder of another sweep is refused (or, with
    `force`, emptied of it)."""
    spec_path = folder / "sweep-spec.json"
    if folder.exists() and not spec_path.exists() and any(folder.iterdir()) and not force:
        raise FileExistsError(f"{folder}: exists and holds no sweep; choose another --out or give --force")
    if spec_path.exists() and json.loads(spec_path.read_text()) != json.loads(json.dumps(spec)):
        if not force:
            raise FileExistsError(f"{folder}: holds a different sweep (another manifest, grid, workload, SLO or "
                                  "hardware profile); choose another --out, or --force to start it over")
        spec_path.unlink()
    if force or not spec_path.exists():
        (folder / "points.jsonl").unlink(missing_ok=True)
    folder.mkdir(parents=True, exist_ok=True)
    _write_atomically(spec_path, json.dumps(spec, indent=1))
    done = {}
    log = folder / "points.jsonl"
    if log.exists():
        for line in log.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:  # the line an interruption cut short
                continue
            done[row["point"]] = row
    return done


def write_table(result: SweepResult, folder: Path) -> None:
    """`sweep.csv` (the tidy table) and `sweep.json` (the table, the front and the rank agreement)."""
    columns = list(dict.fromkeys(k for row in result.rows for k in row))
    text = io.StringIO()
    writer = csv.DictWriter(text, columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(result.rows)
    _write_atomically(folder / "sweep.csv", text.getvalue())
    _write_atomically(folder / "sweep.json", json.dumps(
        {"rows": result.rows, "front": result.front, "rank_agreement": result.agreement}, indent=1))


def _write_atomically(path: Path, text: str) -> None:
    """Write to a temporary name in the same folder, then rename: a reader sees the old file or the new."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
