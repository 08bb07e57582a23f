"""Exercises of lesson 3, "The scheduler": E03.1 and E03.2.

Write the bodies below, then check them from the repository root:

    pytest tests/exercises/test_e03_chunked_prefill_and_disaggregation.py --impl=learner          # both
    pytest tests/exercises/test_e03_chunked_prefill_and_disaggregation.py --impl=learner -k e03_2 # one

The tests check E03.1 against the engine's fair queue (`FairRequestQueue` in core/fair.py,
driven with the same counters) and E03.2 against the simulator's `CostModel.kv_transfer_time` and the
model's `ArchConfig.kv_bytes_per_token`. Reference solutions:
lessons/exercises/solutions/e03_chunked_prefill_and_disaggregation.py.

Lesson: lessons/03-chunked-prefill-and-disaggregation.md#exercises
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from core.arch_config import ArchConfig


def vtc_order(requests: Sequence[tuple[str, int]], weights: Mapping[str, float] | None = None) -> list[int]:
    """E03.1 (implement): the order in which virtual token counters admit `requests`.

    `requests[i]` is (tenant, tokens): request i of that tenant costs `tokens` tokens of service. All are
    queued at time 0 in list order (index = arrival order); every tenant's counter starts at 0. Repeat
    until the queue is empty: take the tenant with the lowest counter among those with requests left (ties:
    the tenant whose oldest remaining request came first), admit its oldest request, and add
    tokens / weight to its counter (`weights`: missing tenants weigh 1). Return the admitted indices in order.
    Example: [("a", 10), ("a", 10), ("b", 10)] -> [0, 2, 1]: after a's first request a's counter is 10, b's 0.

    Interview questions: Q-FAIR-01 (lessons/interview-bank.md#q-fair-01).
    """
    raise NotImplementedError("E03.1: virtual token counter order")


def kv_transfer_bytes(arch: ArchConfig, prompt_len: int, dtype_bytes: int = 2) -> int:
    """E03.2 (estimate), part a: bytes of KV cache a `prompt_len`-token prompt holds, over all layers:
    keys and values, one vector of head_dim per KV head per layer, `dtype_bytes` per element.
    By hand first: Llama-3.1-8B (32 layers, 8 KV heads, head_dim 128), 4096 tokens, bf16.

    Interview questions: Q-PD-02 (lessons/interview-bank.md#q-pd-02).
    """
    raise NotImplementedError("E03.2: KV bytes of a prompt")


def kv_transfer_seconds(arch: ArchConfig, prompt_len: int, bandwidth: float, latency_s: float = 0.0,
                        dtype_bytes: int = 2) -> float:
    """E03.2 (estimate), part b: seconds to send that KV cache over a link of `bandwidth` bytes/s with a
    fixed `latency_s`, one request at a time. Try 400 Gb/s InfiniBand (50 GB/s) and 10 GbE (1.25 GB/s).

    Interview questions: Q-PD-02 (lessons/interview-bank.md#q-pd-02).
    """
    raise NotImplementedError("E03.2: KV transfer time")
