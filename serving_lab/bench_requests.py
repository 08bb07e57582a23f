"""What `serving-lab bench serve` sends, and when: `BenchRequest`s (synthetic token ids or a JSONL file,
shared out among tenants) and their arrival gaps.

The load generator (serving_lab/bench_serve.py) sends these requests at these gaps, and the simulator's
prediction (serving_lab/bench_predict.py) replays the very same ones at the same times; both import this
module and neither needs the other's.

Lesson: lessons/06-architecture-map.md (measuring the server from outside).
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, replace
from pathlib import Path

from core.workload import tenant_sequence


@dataclass
class BenchRequest:
    prompt: str | list[int]
    output_len: int
    tenant: str | None = None  # sent with this tenant's API key (`--tenants`, `--api-key-file`)


def synthetic_requests(num_prompts: int, input_len: int, output_len: int, seed: int) -> list[BenchRequest]:
    rng = random.Random(seed)
    return [BenchRequest([rng.randrange(256) for _ in range(input_len)], output_len) for _ in range(num_prompts)]


def load_prompts(path: str | Path, num_prompts: int | None) -> list[BenchRequest]:
    """A JSONL file, one {"prompt": str or token ids, "output_len": int} per line."""
    requests = []
    for i, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines()):
        if not line.strip():
            continue
        row = json.loads(line)
        if not isinstance(row, dict) or "prompt" not in row or not isinstance(row.get("output_len"), int):
            raise ValueError(f"{path}:{i + 1}: expected {{\"prompt\": ..., \"output_len\": <int>}}")
        requests.append(BenchRequest(row["prompt"], row["output_len"]))
    return requests[:num_prompts]


def arrival_gaps(num: int, request_rate: float, burstiness: float, seed: int) -> list[float]:
    """Seconds before each request: gamma-distributed with mean 1/rate (shape `burstiness`), as vLLM's."""
    if math.isinf(request_rate):
        return [0.0] * num
    rng = random.Random(seed)
    return [rng.gammavariate(burstiness, 1 / (request_rate * burstiness)) for _ in range(num)]


def assign_tenants(requests: list[BenchRequest], mix: dict[str, int]) -> list[BenchRequest]:
    """The requests shared out among the tenants of `mix` (tenant -> share), as `Workload.with_tenant_mix`."""
    return [replace(r, tenant=t) for r, t in zip(requests, tenant_sequence(len(requests), mix))]
