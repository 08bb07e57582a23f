"""`bench serve --simulate` and `--dry-run`: the simulator's prediction for the run `bench serve` makes.

The same requests (token-id prompts and output lengths), the same arrival times (the seeded gamma gaps
`bench serve` sleeps between sends), the same cap on open requests (`Simulator.run(max_concurrency=)`)
go through the simulator, on the deployment's engine config (`--config MANIFEST`, else the engine's
defaults on the default model) and a hardware profile: `--hardware NAME` (e.g. a GPU's), else this machine's
calibrated CPU profile (`load_or_calibrate`, which measures once if none is saved). `--frontend-latency-ms`
is what the server spends on a request before its engine sees it (HTTP, JSON, tokenization): the simulator
delays each request by that much, so TTFT and E2EL include it as the client measures them.

The prediction is a dict with the measured run's field names (`output_throughput`, `mean_ttft_ms`, ...),
stored under `simulated` in the results JSON, so the error of each field is one subtraction.

Lesson: lessons/06-architecture-map.md (measuring the server from outside).
"""

from __future__ import annotations

import argparse
import itertools
import math
from typing import Any

from core.workload import Workload, WorkloadRequest
from serving_lab.bench_requests import BenchRequest, arrival_gaps
from sim.hardware import HardwareProfile

# The fields of a prediction printed next to the measurement (all of `RunMetrics.to_dict()` are stored).
COMPARED_FIELDS = ("output_throughput", "request_throughput", "mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
                   "mean_itl_ms", "mean_e2el_ms")


def add_predict_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("the simulator's prediction (--simulate, --dry-run)")
    group.add_argument("--simulate", action="store_true",
                       help="also predict the run with the simulator and print it next to the measurement")
    group.add_argument("--dry-run", action="store_true", help="only predict: send nothing (no server needed)")
    group.add_argument("--config", metavar="MANIFEST", default=None,
                       help="the served deployment's manifest (default: the engine's defaults, default model)")
    group.add_argument("--hardware", default=None,
                       help="a hardware profile, e.g. h100-sxm (default: this machine's calibrated CPU profile)")
    group.add_argument("--frontend-latency-ms", type=float, default=0.0,
                       help="the server's time per request before the engine sees it (default 0)")


def bench_workload(requests: list[BenchRequest], request_rate: float, burstiness: float, seed: int) -> Workload:
    """The requests as a `Workload` arriving when `bench serve` sends them; prompts must be token ids,
    since only the server's tokenizer could count a text prompt's tokens."""
    if any(not isinstance(r.prompt, list) for r in requests):
        raise ValueError("--simulate/--dry-run: the simulator needs token-id prompts (synthetic ones, or a "
                         "--dataset-path whose prompts are lists of token ids); text prompts are counted "
                         "by the server's tokenizer")
    times = itertools.accumulate(arrival_gaps(len(requests), request_rate, burstiness, seed))
    return Workload(tuple(WorkloadRequest(t, len(r.prompt), r.output_len, prompt_token_ids=tuple(r.prompt),
                                          tenant=r.tenant)
                          for t, r in zip(times, requests)), seed=seed, name="bench serve")


def predict(requests: list[BenchRequest], *, request_rate: float = math.inf, burstiness: float = 1.0, seed: int = 0,
            max_concurrency: int | None = None, config: str | None = None,
            hardware: HardwareProfile | str | None = None, frontend_latency_ms: float = 0.0) -> dict[str, Any]:
    """The simulated run of `bench serve`'s workload (module docstring), as a dict of result fields.
    `config`: the served deployment's manifest path; `hardware`: a profile or its name (None: this machine's)."""
    from serving_lab.manifest import load_manifest, naming_keys
    from sim.simulator import Simulator

    if frontend_latency_ms < 0:
        raise ValueError(f"--frontend-latency-ms must be >= 0, got {frontend_latency_ms}")
    manifest = load_manifest(config) if config else None
    kwargs = manifest.simulator_kwargs() if manifest else {}
    if hardware is None:
        from serving_lab.calibrate import load_or_calibrate

        engine = manifest.llm_kwargs() if manifest else {"model": None, "dtype": "float32", "quantization": None}
        hardware = load_or_calibrate(engine["model"], dtype=engine["dtype"], quantization=engine["quantization"])
    workload = bench_workload(requests, request_rate, burstiness, seed)
    with naming_keys():
        simulator = Simulator(hardware=hardware, frontend_latency_s=frontend_latency_ms / 1000, **kwargs)
        run = simulator.run(workload, max_concurrency=max_concurrency)
    return {"model": simulator.arch.name, "hardware": simulator.hardware.name,
            "frontend_latency_ms": frontend_latency_ms, **run.to_dict()}


def comparison(measured: dict[str, Any] | None, simulated: dict[str, Any]) -> str:
    """The compared fields as rows: measured, simulated and the simulator's error."""
    lines = [f"{'':<20}{'measured':>12}{'simulated':>12}{'error':>9}" if measured else
             f"{'':<20}{'simulated':>12}"]
    for name in COMPARED_FIELDS:
        sim = simulated[name]
        if measured is None:
            lines.append(f"{name:<20}{sim:>12.2f}")
            continue
        real = measured[name]
        error = (sim - real) / real if real and not math.isnan(real) else math.nan
        lines.append(f"{name:<20}{real:>12.2f}{sim:>12.2f}{error:>+9.1%}")
    return "\n".join(lines)
