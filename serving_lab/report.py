"""`serving-lab report`: the capstone's before -> after throughput report, reproducible with one command.

Two deployment manifests (the baseline and the tuned one) serve the same seeded workload on the real
engine, `repeats` times each, interleaved (before, after, before, after, ...) so that a burst of load from
another program slows one run of each rather than all runs of one side; the simulator prices the same two
configurations on this machine's calibrated profile. The report states:

- the speed-up in output throughput, as the median of the per-repeat ratios with their range (a claim
  without its spread cannot be judged on a shared machine);
- every number twice, measured and simulated, with the simulator's error, and each side's `slowdown`
  (how much slower the engine ran than the profile predicts for its own steps: near 1 means the errors
  are the simulator's, well above 1 means the machine was busy);
- plots: output throughput, TTFT and ITL distributions, KV-cache usage over time, and the step timeline.

Files (`write_report`): `results.json` (validated against `serving_lab/schemas/report.schema.json`; runs
under `vllm bench serve`'s field names), the PNG plots, `report.md`, and `report.html`, which embeds the
plots as data URIs so that it opens in a browser with no server and no network. Everything is written to a
temporary folder next to `out` and renamed into place at the end, so an interrupted report leaves nothing
half-written; an existing `out` is replaced only with `force`.

Lesson: lessons/capstone.md (the assignment, the rubric and the worked example).
"""

from __future__ import annotations

import base64
import datetime
import json
import math
import os
import platform
import statistics
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from core.metrics import RunMetrics, relative_error
from serving_lab.calibrate import fastest_runs, load_or_calibrate
from serving_lab.folders import replaced_whole
from serving_lab.manifest import Manifest, load_manifest
from serving_lab.workload_spec import parse_workload
from sim.hardware import HardwareProfile
from sim.simulator import Simulator, resolve_hardware

SCHEMA_PATH = Path(__file__).parent / "schemas" / "report.schema.json"
SCHEMA_ID = "serving-lab/report/1"
SIDES = ("before", "after")
# The numbers the report compares, measured against simulated (RunMetrics fields, `vllm bench serve` names).
REPORTED = ("output_throughput", "request_throughput", "mean_ttft_ms", "p99_ttft_ms", "mean_itl_ms",
            "p99_itl_ms", "mean_tpot_ms", "mean_e2el_ms", "num_preemptions")
PLOTS = ("throughput.png", "latency.png", "kv_usage.png", "timeline.png")


@dataclass
class Configuration:
    """One side of the report: its manifest, the engine's runs (one per repeat) and the simulator's run."""

    name: str
    path: str
    manifest: Manifest
    measured: list[RunMetrics]
    simulated: RunMetrics
    slowdown: float | None = None

    def fastest(self) -> RunMetrics | None:
        return fastest_runs([self.measured])[0] if self.measured else None


@dataclass
class Report:
    """A finished report: the results document (`results.json`) and both sides' runs, for the plots."""

    results: dict[str, Any]
    sides: dict[str, Configuration]


def run_report(before: str | Path, after: str | Path, workload: str, *, hardware: HardwareProfile | str | None = None,
               repeats: int = 3, measure: bool = True, seed: int = 0, model: Any = None) -> Report:
    """Run both manifests (engine and simulator) on the workload.
    `measure=False` runs the simulator only (the pinned golden numbers of the worked example); `model`: a
    loaded model to reuse for the engine."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    manifests = {name: load_manifest(path) for name, path in zip(SIDES, (before, after))}
    parsed = parse_workload(workload, seed)
    loaded = None
    if measure:
        engines = {name: m.measured_llm_kwargs() for name, m in manifests.items()}  # refuses what it cannot run
        served = {(kwargs["model"], kwargs["dtype"], kwargs["quantization"], kwargs["kv_cache_dtype"])
                  for kwargs in engines.values()}
        if len(served) != 1:
            raise ValueError("before and after serve different models or numerics (engine.model, engine.dtype, "
                             f"engine.quantization, engine.kv_cache_dtype: {sorted(served, key=str)}); a "
                             "throughput report compares "
                             "configurations of one model on one numeric path (the simulator prices one "
                             "calibrated dtype): judge numerics with `serving-lab sweep`'s dtype points, which "
                             "the eval set scores")
        (path, dtype, quantization, kv_cache_dtype), = served
        from ref_engine.model.loader import load_model
        loaded = model if model is not None else load_model(path, dtype=dtype, quantization=quantization)
        if hardware is None:
            hardware = load_or_calibrate(loaded, dtype=dtype, quantization=quantization)
    profile = resolve_hardware(hardware)
    sides = {}
    for name, path in zip(SIDES, (before, after)):
        simulator = Simulator(hardware=profile, **manifests[name].simulator_kwargs())
        sides[name] = Configuration(name, str(path), manifests[name], [], simulator.run(parsed))
    if measure:
        from serving_lab.pairing import Job, Sides, machine_slowdown, measured_runs

        engine_sides = Sides(model=loaded, hardware=profile, repeats=repeats, kv_cache_dtype=kv_cache_dtype)
        jobs = [Job(parsed, engines[name]["config"], {}) for name in sides]
        for side, runs in zip(sides.values(), measured_runs(jobs, engine_sides).values()):
            side.measured = runs
            side.slowdown = machine_slowdown(side.fastest(), engine_sides)
    return Report(results_document(sides, workload, seed, profile, repeats if measure else 0), sides)


def results_document(sides: dict[str, Configuration], workload: str, seed: int, profile: HardwareProfile,
                     repeats: int) -> dict[str, Any]:
    """The report's data, JSON-ready: configurations, runs, speed-up, errors, machine and provenance."""
    runs: dict[str, Any] = {}
    for name, side in sides.items():
        fastest = side.fastest()
        runs[name] = {
            "manifest": side.path,
            "config": side.manifest.model_dump(mode="json"),
            "simulated": _scalars(side.simulated),
            "measured": [_scalars(m) for m in side.measured],
            "measured_best": _scalars(fastest) if fastest else None,
            "error_pct": ({k: _finite(relative_error(getattr(side.simulated, k), getattr(fastest, k)))
                           for k in REPORTED} if fastest else None),
            "slowdown": side.slowdown,
        }
    before, after = sides["before"], sides["after"]
    ratios = [a.output_throughput / b.output_throughput for b, a in zip(before.measured, after.measured)]
    return {
        "schema": SCHEMA_ID,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "workload": workload,
        "seed": seed,
        "repeats": repeats,
        "machine": machine(),
        "versions": versions(),
        "hardware_profile": {"name": profile.name, "provenance": _jsonable(profile.provenance)},
        "runs": runs,
        "speedup": {
            "simulated": after.simulated.output_throughput / before.simulated.output_throughput,
            "measured": ({"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
                          "per_repeat": ratios} if ratios else None),
        },
    }


def machine() -> dict[str, Any]:
    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "python": sys.version.split()[0]}


def versions() -> dict[str, str]:
    found = {}
    for package in ("serving-lab", "torch", "simpy", "numpy"):
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = "not installed"
    return found


def _scalars(metrics: RunMetrics) -> dict[str, Any]:
    return {k: _finite(v) for k, v in metrics.to_dict().items() if isinstance(v, (int, float))}


def _finite(value: float) -> float | None:
    """JSON has no NaN: an undefined number (a metric of no requests) is null."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


# ---- writing ---------------------------------------------------------------------------------------------


def write_report(report: Report, out: str | Path, *, force: bool = False) -> Path:
    """Write results.json, the plots, report.md and report.html into `out` (via a temporary folder renamed
    into place)."""
    out = Path(out)
    if out.exists() and not force:
        raise FileExistsError(f"{out}: exists; choose another --out or give --force to replace it")
    results = report.results
    validate(results)
    with replaced_whole(out) as tmp:
        (tmp / "results.json").write_text(json.dumps(results, indent=1), encoding="utf-8")
        images = plot(report.sides, tmp)
        markdown = render_markdown(results, images)
        (tmp / "report.md").write_text(markdown, encoding="utf-8")
        embedded = {name: "data:image/png;base64," + base64.b64encode((tmp / name).read_bytes()).decode()
                    for name in images}
        (tmp / "report.html").write_text(render_html(markdown, embedded), encoding="utf-8")
    return out


def validate(results: dict[str, Any]) -> None:
    """Check a results document against the shipped JSON Schema; a `ValueError` names the first problem."""
    import jsonschema

    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    try:
        jsonschema.validate(results, schema)
    except jsonschema.ValidationError as error:
        where = "/".join(map(str, error.absolute_path)) or "(top)"
        raise ValueError(f"results.json: {where}: {error.message}") from None


def _templates() -> Any:
    import jinja2

    env = jinja2.Environment(loader=jinja2.PackageLoader("serving_lab", "templates"), keep_trailing_newline=True,
                             autoescape=jinja2.select_autoescape(["html.j2"]), undefined=jinja2.StrictUndefined)
    env.filters["num"] = _number
    return env


def render_markdown(results: dict[str, Any], images: list[str]) -> str:
    """report.md: the headline, the measured/simulated table, the configurations and the plots."""
    return _templates().get_template("report.md.j2").render(r=results, images=images, reported=REPORTED,
                                                              sides=SIDES)


def render_html(markdown: str, images: dict[str, str]) -> str:
    """report.html: report.md as HTML (markdown-it, tables on), each image's file name replaced by its data
    URI, so the page needs nothing beside itself."""
    from markdown_it import MarkdownIt
    from markupsafe import Markup

    md = MarkdownIt("commonmark").enable("table")
    tokens = md.parse(markdown)
    for token in tokens:
        for child in token.children or ():
            if child.type == "image":
                child.attrSet("src", images[child.attrGet("src")])
    body = md.renderer.render(tokens, md.options, {})
    title = markdown.splitlines()[0].lstrip("# ")
    return _templates().get_template("report.html.j2").render(title=title, body=Markup(body))


def _number(value: Any, signed: bool = False) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, int):
        return str(value)
    text = f"{value:+.1f}" if signed else (f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}")
    return text


def plot(sides: dict[str, Configuration], folder: Path) -> list[str]:
    """The four plots, as PNG files in `folder`; returns their names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"before": "tab:gray", "after": "tab:blue"}
    fig, ax = plt.subplots(figsize=(5, 3.2))
    for i, (name, side) in enumerate(sides.items()):
        measured = [m.output_throughput for m in side.measured]
        if measured:
            ax.bar(i - 0.2, statistics.median(measured), 0.4, color=colors[name], label=f"{name} measured",
                   yerr=[[statistics.median(measured) - min(measured)], [max(measured) - statistics.median(measured)]])
        ax.bar(i + 0.2, side.simulated.output_throughput, 0.4, color=colors[name], alpha=0.45, hatch="//",
               label=f"{name} simulated")
    ax.set_xticks(range(len(sides)), list(sides))
    ax.set_ylabel("output tokens/s")
    ax.set_title("Output throughput (bars: median, whiskers: range)")
    ax.legend(fontsize=7)
    _save(fig, folder / PLOTS[0])

    fig, axes = plt.subplots(1, 2, figsize=(8, 3.2))
    for name, side in sides.items():
        for label, run, style in (("measured", side.fastest(), "-"), ("simulated", side.simulated, "--")):
            if run is None:
                continue
            ttft = sorted(1000 * r.ttft for r in run.requests if r.first_token_time is not None)
            itl = sorted(1000 * (b - a) for r in run.requests for a, b in zip(r.token_times, r.token_times[1:]))
            for ax, values in zip(axes, (ttft, itl)):
                if values:
                    ax.plot(values, [(k + 1) / len(values) for k in range(len(values))], style,
                            color=colors[name], label=f"{name} {label}")
    for ax, title in zip(axes, ("TTFT (ms)", "inter-token latency (ms)")):
        ax.set_xlabel(title)
        ax.set_ylabel("share of requests" if "TTFT" in title else "share of gaps")
        ax.set_xscale("log")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle("Latency distributions (CDF)")
    _save(fig, folder / PLOTS[1])

    fig, ax = plt.subplots(figsize=(5, 3.2))
    for name, side in sides.items():
        for label, run, style in (("measured", side.fastest(), "-"), ("simulated", side.simulated, "--")):
            if run is not None and run.steps:
                ax.plot([s.start for s in run.steps], [100 * s.kv_usage for s in run.steps], style,
                        color=colors[name], label=f"{name} {label}")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("KV-cache usage (%)")
    ax.set_title("KV-cache usage over time")
    ax.legend(fontsize=7)
    _save(fig, folder / PLOTS[2])

    fig, axes = plt.subplots(len(sides), 1, figsize=(8, 1.8 * len(sides) + 0.6), sharex=True)
    for ax, (name, side) in zip(axes, sides.items()):
        run = side.fastest() or side.simulated
        ax.bar([s.start for s in run.steps], [len(s.query_lens) for s in run.steps],
               width=[s.duration for s in run.steps], align="edge", color=colors[name])
        ax.set_ylabel(f"{name}\nbatch")
    axes[-1].set_xlabel("time (s): each bar one engine step, its width the step's duration")
    fig.suptitle("Step timeline (measured where measured)")
    _save(fig, folder / PLOTS[3])
    return list(PLOTS)


def _save(fig: Any, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
