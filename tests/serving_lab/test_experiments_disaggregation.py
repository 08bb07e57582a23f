"""Lesson 3's experiment (course/chunked_prefill_and_disaggregation.py): the KV link fit, and one small run of
a real 1P+1D pair (a tiny random model) beside the simulated cluster. No timing asserts beyond sanity: the
numbers are this machine's."""

from __future__ import annotations

import math

import pytest
import torch

from core import EngineConfig
from course.chunked_prefill_and_disaggregation import KVLink, disaggregation_vs_simulated
from ref_engine.model.loader import load_model
from serving_lab.pairing import Sides


def test_kv_link_fit_recovers_latency_and_bandwidth():
    link = KVLink.fit([1000, 3000, 5000], [0.002 + b / 1e6 for b in (1000, 3000, 5000)])
    assert link.bandwidth == pytest.approx(1e6) and link.latency_s == pytest.approx(0.002)
    flat = KVLink.fit([1000, 1000], [0.01, 0.03])  # one size: all time goes to bandwidth
    assert flat.bandwidth == pytest.approx(2000 / 0.04) and flat.latency_s == 0.0


def test_measured_pair_beside_the_simulated_cluster(make_tiny_hf_model):
    tiny = make_tiny_hf_model("llama", name="disagg-experiment")
    arch = load_model(tiny, dtype="float32", device="cpu").arch
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (20, 45, 70, 90)]
    measured, simulated = disaggregation_vs_simulated(
        prompts, Sides(arch=arch, hardware="local-cpu"), model=tiny, output_len=6,
        config=EngineConfig(num_kv_blocks=64))
    assert measured["side"] == "measured" and simulated["side"] == "simulated"
    assert measured["kv_link_gb_per_s"] > 0 and measured["transfer_bytes"] > 0
    for key in ("mean_ttft_ms", "mean_itl_ms"):
        assert measured[key] > 0 and simulated[key] > 0 and math.isfinite(simulated[f"{key}_err_pct"])
    # the simulator moves every prompt token's K/V (float32), the engine all but the last, in whole blocks
    assert simulated["transfer_bytes"] == sum(len(p) for p in prompts) * arch.kv_bytes_per_token(4)
    assert measured["transfer_bytes"] == sum(-(-(len(p) - 1) // 16) * 16 for p in prompts) * arch.kv_bytes_per_token(4)
    assert simulated["mean_transfer_ms"] > 0
