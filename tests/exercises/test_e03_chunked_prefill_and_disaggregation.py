"""Checks for lesson 3's exercises; `impl` is the reference or your stub (see conftest.py).

E03.1 drives the engine's `FairRequestQueue` with the same counters and compares the admission order.
E03.2 compares your bytes with `ArchConfig.kv_bytes_per_token` and your seconds with the simulator's
`CostModel.kv_transfer_time` on a profile whose network link is the one you were given.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.arch_config import ArchConfig
from core.fair import FairRequestQueue
from core.request import Request
from sim.cost_model import CostModel
from sim.hardware import HardwareProfile

FEW = settings(max_examples=150, deadline=None, derandomize=True)


# ---- E03.1 -------------------------------------------------------------------------------------------

def _engine_order(requests, weights):
    counters: dict[str, float] = {t: 0.0 for t, _ in requests}
    queue = FairRequestQueue(counters, Counter())
    for i, (tenant, _) in enumerate(requests):
        queue.add_request(Request(str(i), [1], max_tokens=1, arrival_time=float(i), tenant=tenant))
    order = []
    while len(queue):
        r = queue.pop_request()
        i = int(r.request_id)
        counters[r.tenant_key] += requests[i][1] / weights.get(r.tenant_key, 1.0)
        order.append(i)
    return order


def test_e03_1_examples(impl):
    assert impl.vtc_order([("a", 10), ("a", 10), ("b", 10)]) == [0, 2, 1]
    assert impl.vtc_order([("a", 5)] * 4 + [("b", 5)] * 2) == [0, 4, 1, 5, 2, 3]  # round-robin, then a alone
    # weights 1:3: b gets three requests for each one of a's while both are backlogged
    order = impl.vtc_order([("a", 30)] * 4 + [("b", 30)] * 12, {"a": 1, "b": 3})
    assert [("a" if i < 4 else "b") for i in order[:8]] == ["a", "b", "b", "b", "a", "b", "b", "b"]


@FEW
@given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(1, 50)), min_size=1, max_size=30),
       st.floats(0.5, 4), st.floats(0.5, 4))
def test_e03_1_matches_the_engines_fair_queue(impl, requests, wa, wb):
    weights = {"a": wa, "b": wb}
    assert impl.vtc_order(requests, weights) == _engine_order(requests, weights)


# ---- E03.2 -------------------------------------------------------------------------------------------

def test_e03_2_by_hand(impl):
    llama = ArchConfig.named("llama-3.1-8b")
    assert impl.kv_transfer_bytes(llama, 1) == 128 * 1024  # 128 KiB per token in bf16
    assert impl.kv_transfer_bytes(llama, 4096) == 512 * 1024 * 1024  # 512 MiB for 4096 tokens
    assert impl.kv_transfer_seconds(llama, 4096, 50e9) == pytest.approx(512 * 2**20 / 50e9)  # ~10.7 ms
    assert impl.kv_transfer_seconds(llama, 4096, 1.25e9) == pytest.approx(0.4295, rel=1e-3)  # ~0.43 s on 10 GbE


@pytest.mark.parametrize("name", ["llama-3.1-8b", "mistral-7b", "smollm2-135m"])
@pytest.mark.parametrize("prompt_len", [1, 512, 4096])
def test_e03_2_matches_the_cost_model(impl, name, prompt_len):
    arch = ArchConfig.named(name)
    assert impl.kv_transfer_bytes(arch, prompt_len) == arch.kv_bytes_per_token(2) * prompt_len
    for bandwidth, latency in ((450e9, 5e-6), (50e9, 1e-5), (1.25e9, 5e-5)):
        hardware = replace(HardwareProfile.named("h100-sxm"), network_bandwidth=bandwidth, network_latency_s=latency)
        expected = CostModel(arch, hardware, dtype="bfloat16").kv_transfer_time(prompt_len)
        assert impl.kv_transfer_seconds(arch, prompt_len, bandwidth, latency) == pytest.approx(expected, rel=1e-9)
