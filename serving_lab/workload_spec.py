"""Workloads named on the command line: `synthetic:NUM_REQUESTS:PROMPT_LEN:OUTPUT_LEN[:RATE]`.

One short string, so `serving-lab simulate`, `sweep` and `report` need no file for the common case:
NUM_REQUESTS requests of PROMPT_LEN prompt tokens that each generate OUTPUT_LEN tokens, all arriving at time
0, or as a Poisson stream of RATE requests per second (`Workload.synthetic`, seed 0). A length may be a range
LO-HI, drawn uniformly per request. `synthetic:64:128:64:8` is 64 requests of 128 + 64 tokens at 8
requests/s; `synthetic:2000:32-1024:16-512:20` a mixed stream.
"""

from __future__ import annotations

import math

from ref_engine.core.workload import Workload

WORKLOAD_SPEC = "synthetic:NUM_REQUESTS:PROMPT_LEN:OUTPUT_LEN[:RATE]"


def parse_workload(spec: str, seed: int = 0) -> Workload:
    """The `Workload` a spec names; a `ValueError` that shows the expected form for anything else."""
    kind, *fields = spec.split(":")
    if kind != "synthetic" or len(fields) not in (3, 4):
        raise ValueError(f"workload {spec!r}: expected {WORKLOAD_SPEC}, e.g. synthetic:64:128:64:8")
    names = ("NUM_REQUESTS", "PROMPT_LEN", "OUTPUT_LEN")
    counts: list[int | tuple[int, int]] = []
    for name, text in zip(names, fields):
        parts = text.split("-") if name != "NUM_REQUESTS" else [text]
        if len(parts) > 2 or not all(p.isdigit() and int(p) >= 1 for p in parts) or int(parts[0]) > int(parts[-1]):
            allowed = "a positive integer" if name == "NUM_REQUESTS" else "a positive integer or a range LO-HI"
            raise ValueError(f"workload {spec!r}: {name} must be {allowed}, got {text!r}")
        counts.append(int(parts[0]) if len(parts) == 1 else (int(parts[0]), int(parts[1])))
    arrival: str | float = "all"
    if len(fields) == 4:
        try:
            arrival = float(fields[3])
        except ValueError:
            arrival = math.nan
        if not 0 < arrival < math.inf:
            raise ValueError(f"workload {spec!r}: RATE must be a positive number of requests/s, got {fields[3]!r}")
    num_requests, prompt_len, output_len = counts
    return Workload.synthetic(num_requests, prompt_len, output_len, arrival=arrival, seed=seed, name=spec)
