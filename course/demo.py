"""What every lesson's demo (`serving-lab demo LESSON`: the `demo` function of its lesson's module) shares:
what it runs on (`DemoContext`), what it hands back (`DemoReport`), the side-by-side table of measured and
simulated numbers, the plot, and `run_demo`, which prints and saves them.

The table has one row per configuration and metric: the measured number, the simulated one, the simulator's
error, and the engine's `slowdown` (its steps' time over the profile's price of them, `machine_slowdown`).
When that is far from 1, or the profile was fitted on a busy machine, the machine was not in the state the
profile describes, and `run_demo` says so under the table (`machine_note`) rather than letting a busy
machine pass for a wrong simulator.

Lesson: lessons/00-orientation.md#quick-start
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from core.metrics import relative_error
from course import Demo
from course.claims import machine_note
from serving_lab.calibrate import BUSY_MACHINE_REMEDY
from serving_lab.pairing import Sides, format_table, pairs
from sim.hardware import HardwareProfile

# The lessons' GPU what-if: Llama-3.1-8B on a datasheet H100-SXM, simulated only.
GPU = Sides(arch="llama-3.1-8b", hardware="h100-sxm", measure=False)
COLUMNS = ("metric", "measured", "simulated", "simulated_err_pct")


@dataclass
class DemoContext:
    """What a demo runs on: the engine's model (`model_path`, None: SmolLM2-135M-Instruct; loaded on first
    use), the simulator's profile of this machine (`hardware`, None: its calibration, measured once and
    cached), and which sizes: the demo's own, or with `fast` the tests' (seconds)."""

    fast: bool = False
    model_path: str | None = None
    hardware: str | None = None

    @cached_property
    def model(self) -> Any:
        from ref_engine.model.loader import load_model

        return load_model(self.model_path)

    @cached_property
    def profile(self) -> HardwareProfile:
        if self.hardware is not None:
            from sim.simulator import resolve_hardware

            return resolve_hardware(self.hardware)
        from serving_lab.calibrate import load_or_calibrate

        return load_or_calibrate(self.model)

    def preset(self, presets: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """The demo's sizes: `presets["fast"]` or `presets["full"]`."""
        return presets["fast" if self.fast else "full"]

    def sides(self, repeats: int = 1) -> Sides:
        """The engine on this machine and the simulator with its profile (the fastest of `repeats` runs kept)."""
        return Sides(model=self.model, hardware=self.profile, repeats=repeats)


@dataclass
class DemoReport:
    """What a demo hands back: the side-by-side rows (`labels` name the configuration columns), lines to
    print under the table (the headline ratio, the GPU what-if), and the figure to save."""

    comparison: list[dict[str, Any]]
    labels: tuple[str, ...]
    figure: Any  # a matplotlib Figure
    notes: list[str] = field(default_factory=list)


def side_by_side(rows: Iterable[dict[str, Any]], labels: Sequence[str], metrics: Sequence[str]
                 ) -> list[dict[str, Any]]:
    """An experiment's (measured, simulated) row pairs as one row per pair and metric: the labels, the
    metric, both numbers, the simulator's error (0 where they are equal, zeros included: the counts the core
    decides) and, when the measured row has it, its `slowdown`. A label a row lacks is None (a blank cell):
    experiments with different labels can share one table."""
    return [{**{k: m.get(k) for k in labels}, "metric": metric, "measured": m[metric], "simulated": s[metric],
             "simulated_err_pct": 0.0 if s[metric] == m[metric] else relative_error(s[metric], m[metric]),
             **({"slowdown": m["slowdown"]} if "slowdown" in m else {})}
            for m, s in pairs(rows) for metric in metrics]


def gpu_name(sides: Sides = GPU) -> str:
    """Which model on which datasheet profile, for the what-if's line and plot."""
    return f"{sides.simulated_arch().name} on {sides.cost_model().hardware.name} (simulated)"


def plot_comparison(comparison: list[dict[str, Any]], labels: Sequence[str], title: str, extra_panels: int = 1
                    ) -> tuple[Any, list[Any]]:
    """One panel per metric, measured and simulated bars per configuration, then `extra_panels` empty
    panels for the demo's own (a GPU what-if). Returns (figure, the empty axes)."""
    # a bare Figure, outside pyplot: it is only saved to a file, so no display, backend or global state
    from matplotlib.figure import Figure

    metrics = list(dict.fromkeys(r["metric"] for r in comparison))
    fig = Figure(figsize=(4.6 * (len(metrics) + extra_panels), 3.8))
    axes = fig.subplots(1, len(metrics) + extra_panels, squeeze=False)
    for ax, metric in zip(axes[0], metrics):
        rows = [r for r in comparison if r["metric"] == metric]
        x = range(len(rows))
        ax.bar([i - 0.2 for i in x], [r["measured"] for r in rows], 0.4, label="measured (engine)")
        ax.bar([i + 0.2 for i in x], [r["simulated"] for r in rows], 0.4, label="simulated")
        ax.set_xticks(list(x), ["\n".join(f"{r[k]}" for k in labels if r[k] is not None) for r in rows], fontsize=7)
        ax.set_xlabel(", ".join(labels), fontsize=7)
        ax.set_title(metric, fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    return fig, list(axes[0][len(metrics):])


def run_demo(demo: Demo, context: DemoContext, out: str | Path | None = None) -> Path:
    """Run `demo` and print its table, its notes and where its plot went (`out`, default
    reports/demo/<name>/); returns the plot's path."""
    started = time.perf_counter()
    print(f"{demo.name}: {demo.description}\n  lesson: {demo.lesson}"
          + ("\n  fast sizes (--fast): a smoke test, not a measurement" if context.fast else ""))
    report: DemoReport = importlib.import_module(demo.module).demo(context)
    profile = context.profile
    fit = profile.provenance.get("fit_mean_abs_error_pct")
    print(f"  engine: {context.model.model_id}; simulator: profile {profile.name}"
          + (f" (fit error {fit}%)" if fit is not None else "") + "\n")
    slowdowns = [r["slowdown"] for r in report.comparison if "slowdown" in r]
    print(format_table(report.comparison, [*report.labels, *COLUMNS, *(["slowdown"] if slowdowns else [])]))
    notes = list(report.notes)
    if slowdowns:
        notes.insert(0, "slowdown: the engine's step times over the profile's price of the same steps "
                        "(1: the machine is as it was calibrated)")
    if note := machine_note(profile, slowdowns=slowdowns):
        notes.append(f"note: this machine was not in the state it was calibrated in ({note}), so the errors above "
                     f"measure the machine, not the simulator; {BUSY_MACHINE_REMEDY}")
    print("\n" + "\n".join(notes))
    folder = Path(out) if out is not None else Path("reports/demo") / demo.name
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{demo.name}.png"
    report.figure.tight_layout()
    report.figure.savefig(path, dpi=110)
    print(f"\nplot: {path}\n{demo.name} ran in {time.perf_counter() - started:.0f} s")
    return path
