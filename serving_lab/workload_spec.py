"""Workloads named on the command line: `synthetic:NUM_REQUESTS:PROMPT_LEN:OUTPUT_LEN[:RATE]`.

One short string, so `serving-lab simulate` (and later commands that take a workload) need no file for the
common case: NUM_REQUESTS requests of PROMPT_LEN prompt tokens that each generate OUTPUT_LEN tokens, all
arriving at time 0, or as a Poisson stream of RATE requests per second (`Workload.synthetic`, seed 0).
`synthetic:64:128:64:8` is 64 requests of 128 + 64 tokens at 8 requests/s.
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
    counts = []
    for name, text in zip(names, fields):
        if not text.isdigit() or int(text) < 1:
            raise ValueError(f"workload {spec!r}: {name} must be a positive integer, got {text!r}")
        counts.append(int(text))
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
