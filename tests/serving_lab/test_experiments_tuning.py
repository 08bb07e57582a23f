"""Lesson 7's experiments (course/tuning_knobs.py), simulator side: no engine, no timing."""

from __future__ import annotations

import pytest
import torch

from course import tuning_knobs as tuning
from serving_lab.sweep import SLO, SweepResult


def test_roofline_stays_under_its_ceiling_and_flattens():
    rows = tuning.roofline("llama-3.1-8b", "h100-sxm", [1, 8, 64, 512, 1024], context_len=1024)
    assert all(r["simulated_tok_s"] <= r["ceiling_tok_s"] for r in rows)
    tok_s = [r["simulated_tok_s"] for r in rows]
    assert tok_s == sorted(tok_s)
    assert tok_s[1] / tok_s[0] > 5 and tok_s[4] / tok_s[3] < 1.1
    # the ceiling's memory side by hand, at batch 1: 2 bytes x 8.03e9 weights + 1024 tokens x 128 KiB of KV
    one = rows[0]["ceiling_tok_s"]
    assert one == pytest.approx(3350e9 / (2 * 8.03e9 + 1024 * 131072), rel=0.01)


def test_fp8_kv_doubles_the_pool_in_a_gpu_sweep():
    result = tuning.sweep({"kv_cache_dtype": ["bfloat16", "fp8"]}, "synthetic:8:256:16", "h100-sxm",
                          model="llama-3.1-8b")
    blocks = [r["num_kv_blocks"] for r in result.simulated()]
    assert blocks[1] >= 1.9 * blocks[0]


def test_slo_picks_the_point_with_most_goodput():
    slos = (SLO(100, 10, "tight"), SLO(1000, 50, "loose"))
    rows = [{"point": "a", "side": "simulated", "goodput_tight": 3.0, "goodput_loose": 5.0, "output_throughput": 10},
            {"point": "b", "side": "simulated", "goodput_tight": 1.0, "goodput_loose": 9.0, "output_throughput": 20}]
    picks = tuning.slo_picks(SweepResult(rows, ["a", "b"], {}), slos)
    assert [(p["slo"], p["best point"], p["goodput"]) for p in picks] == [("tight", "a", 3.0), ("loose", "b", 9.0)]


def test_the_tuning_manifest_uses_plain_vllm_knobs():
    config = tuning.tuning_manifest("llama-3.1-8b").engine_config()
    assert config.prefill_budget_tokens is None and config.scheduling_policy == "fcfs"
    assert tuning.tuning_manifest().engine.model == "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_numerics_measures_the_weight_only_paths_only_on_a_cpu():
    """int8 and int4 run on torch's CPU weight-only kernels, which refuse CUDA."""
    assert tuning.quantized_paths_on(torch.device("cpu")) == ["int8", "int4"]
    assert tuning.quantized_paths_on(torch.device("cuda")) == []
