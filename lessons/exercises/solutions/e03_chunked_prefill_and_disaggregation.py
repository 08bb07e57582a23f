"""Reference solutions of lesson 3's exercises (E03.1, E03.2). Try them yourself first.

E03.1 is the admission rule of the engine's fair scheduler (`FairRequestQueue._next_tenant` in
core/fair.py), on a static queue with every request charged in full when it is admitted.
E03.2 is `ArchConfig.kv_bytes_per_token` times the prompt, over the link as `CostModel.kv_transfer_time`
prices it (tensor parallelism 1).

Lesson: lessons/03-chunked-prefill-and-disaggregation.md#exercises
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence

from core.arch_config import ArchConfig


def vtc_order(requests: Sequence[tuple[str, int]], weights: Mapping[str, float] | None = None) -> list[int]:
    """E03.1: lowest counter first, ties by the oldest head request; charge tokens / weight on admission."""
    weights = dict(weights or {})
    queues: dict[str, deque[int]] = {}
    for i, (tenant, _) in enumerate(requests):
        queues.setdefault(tenant, deque()).append(i)
    counters = dict.fromkeys(queues, 0.0)
    order = []
    while any(queues.values()):
        tenant = min((t for t, q in queues.items() if q), key=lambda t: (counters[t], queues[t][0]))
        i = queues[tenant].popleft()
        counters[tenant] += requests[i][1] / weights.get(tenant, 1.0)
        order.append(i)
    return order


def kv_transfer_bytes(arch: ArchConfig, prompt_len: int, dtype_bytes: int = 2) -> int:
    """E03.2a: 2 (K and V) x layers x KV heads x head_dim x dtype bytes, per token, times the prompt."""
    return 2 * arch.num_layers * arch.num_kv_heads * arch.head_dim * dtype_bytes * prompt_len


def kv_transfer_seconds(arch: ArchConfig, prompt_len: int, bandwidth: float, latency_s: float = 0.0,
                        dtype_bytes: int = 2) -> float:
    """E03.2b: latency + bytes / bandwidth."""
    return latency_s + kv_transfer_bytes(arch, prompt_len, dtype_bytes) / bandwidth
