"""Workloads named on the command line: `synthetic:NUM_REQUESTS:PROMPT_LEN:OUTPUT_LEN[:RATE][,tenants=MIX]`.

One short string, so `serving-lab simulate`, `sweep` and `report` need no file for the common case:
NUM_REQUESTS requests of PROMPT_LEN prompt tokens that each generate OUTPUT_LEN tokens, all arriving at time
0, or as a Poisson stream of RATE requests per second (`Workload.synthetic`, seed 0). A length may be a range
LO-HI, drawn uniformly per request. `synthetic:64:128:64:8` is 64 requests of 128 + 64 tokens at 8
requests/s; `synthetic:2000:32-1024:16-512:20` a mixed stream.

`,tenants=NAME:SHARE,...` shares the requests out among tenants in those proportions, interleaved
(`Workload.with_tenant_mix`): `synthetic:64:128:64:8,tenants=a:3,b:1` sends 48 requests as tenant a and 16 as
b. A tenant's weight is not its share of the traffic: weights come from the manifest's `tenants:` section.
"""

from __future__ import annotations

import math

from core.workload import Workload

WORKLOAD_SPEC = "synthetic:NUM_REQUESTS:PROMPT_LEN:OUTPUT_LEN[:RATE][,tenants=NAME:SHARE,...]"


def parse_workload(spec: str, seed: int = 0) -> Workload:
    """The `Workload` a spec names; a `ValueError` that shows the expected form for anything else."""
    lengths, _, option = spec.partition(",")
    kind, *fields = lengths.split(":")
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
    workload = Workload.synthetic(num_requests, prompt_len, output_len, arrival=arrival, seed=seed, name=spec)
    return workload.with_tenant_mix(_tenant_mix(spec, option)) if option else workload


def _tenant_mix(spec: str, option: str) -> dict[str, int]:
    """`tenants=a:3,b:1` -> {"a": 3, "b": 1}."""
    if not option.startswith("tenants="):
        raise ValueError(f"workload {spec!r}: after the lengths comes only tenants=NAME:SHARE,... "
                         f"(e.g. tenants=a:3,b:1), got {option!r}")
    return parse_tenant_mix(option.removeprefix("tenants="), f"workload {spec!r}")


def parse_tenant_mix(mix: str, where: str) -> dict[str, int]:
    """`a:3,b:1` -> {"a": 3, "b": 1}; `where` names the flag or spec in the error."""
    shares: dict[str, int] = {}
    for item in mix.split(","):
        name, _, share = item.partition(":")
        if not name or not share.isdigit() or int(share) < 1 or name in shares:
            raise ValueError(f"{where}: each tenant is NAME:SHARE, a distinct name and a positive "
                             f"integer share (e.g. tenants=a:3,b:1), got {item!r}")
        shares[name] = int(share)
    return shares


def check_prompt_lengths(workload: Workload, max_model_len: int) -> None:
    """A `ValueError` when the workload has prompts that `max_model_len` leaves no room to answer (the
    scheduler would fail every one of them): better said before the run than as a table of nan."""
    too_long = [request.prompt_len for request in workload.requests if request.prompt_len >= max_model_len]
    if too_long:
        raise ValueError(f"workload {workload.name!r}: {len(too_long)} of {len(workload)} prompts have up to "
                         f"{max(too_long)} tokens, and max_model_len ({max_model_len}) leaves room for prompts "
                         f"of at most {max_model_len - 1}; shorten PROMPT_LEN or raise --max-model-len")
