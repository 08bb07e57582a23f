"""vLLM's published measurements (benchmarks/vllm_published_rows.json): the rows are well-formed, one small row
still simulates to the number benchmarks/RESULTS.md states, and vLLM's engine profile (sim/engine_profile.py) is
the constant its two fit rows give and adds exactly that to every step. The errors themselves are reported
there (a held-out check), not asserted."""

from __future__ import annotations

import json
import math

import pytest

from benchmarks.vllm_published import (
    RESULTS_PATH,
    ROWS_PATH,
    SERVED_METRICS,
    TABLE_END,
    TABLE_START,
    engine_fit_ids,
    fit_engine_step_s,
    load,
    simulate,
    step_gap_s,
)
from core.arch_config import KNOWN_MODELS, ArchConfig
from core.config import EngineConfig
from core.workload import Workload
from sim.engine_profile import ENGINE_PROFILES
from sim.hardware import BUILTIN_PROFILES
from sim.simulator import Simulator

RAW = json.loads(ROWS_PATH.read_text())["rows"]
METRICS = {"mean_latency_ms", *SERVED_METRICS}
SMALL_ROW = "vllm-main-2024-10/llama-3.1-8b/h200/bf16/tp1/latency-bs8-32-128/mean_latency_ms"  # 8 x 128 tokens


def test_every_row_names_its_source_version_gpu_and_model():
    assert len(RAW) >= 5
    assert len({r["id"] for r in RAW}) == len(RAW)
    for r in RAW:
        assert r["source"].strip() and r["version"].strip() and r["date"][:2] == "20", r["id"]
        assert "vLLM" in r["version"] or "vllm" in r["version"], r["id"]
        assert r["fit"] is False, r["id"]  # held out: nothing here is fitted
        assert r["metric"] in METRICS and r["value"] > 0, r["id"]
        s = r["setup"]
        assert s["gpu"] in BUILTIN_PROFILES and s["model"] in KNOWN_MODELS, r["id"]
        assert s["mode"] in ("latency", "served"), r["id"]
        assert (s["mode"] == "latency") == (r["metric"] == "mean_latency_ms"), r["id"]
        config = EngineConfig(**s["engine"])  # the knobs are EngineConfig's, and valid
        assert config.max_model_len <= ArchConfig.named(s["model"]).max_position_embeddings, r["id"]
        assert s["input_len"] + s["output_len"] <= config.max_model_len, r["id"]


def test_fitted_line_rows_are_the_published_line_at_their_input_length():
    for r in (r for r in RAW if "published" in r):
        line = r["published"]
        expected = line["itl_intercept_ms"] + line["itl_slope_ms_per_token"] * r["setup"]["input_len"]
        assert r["value"] == pytest.approx(expected, abs=1e-4), r["id"]


def results_table_value(row_id: str) -> float:
    section = RESULTS_PATH.read_text().split(TABLE_START, 1)[1].split(TABLE_END, 1)[0]
    line = next(line for line in section.splitlines() if line.startswith(f"| {row_id} "))
    return float(line.split("|")[6].replace(",", ""))  # | row | vLLM | setup | metric | published | simulated |


def significant(x: float, digits: int = 3) -> float:
    return round(x, digits - 1 - math.floor(math.log10(abs(x))))


def test_a_small_row_simulates_to_the_results_table():
    row = next(r for r in load() if r.id == SMALL_ROW)
    assert significant(simulate(row)) == significant(results_table_value(SMALL_ROW))


# ---- vLLM's engine profile: one constant, fitted on two rows, reproducible from them ----

def test_the_engine_profile_is_fitted_on_two_short_context_h100_rows_and_reproduces_from_them():
    fit = engine_fit_ids()
    assert len(fit) == 2 and all("/h100-sxm/" in i and "/c1-256-128/" in i and i.startswith("vllm-0.19.1/") for i in fit)
    assert all(r["setup"].get("engine_profile") == "vllm" for r in RAW if r["id"].startswith("vllm-0.19.1/"))
    assert significant(ENGINE_PROFILES["vllm"].step_overhead_s, 4) == significant(fit_engine_step_s(), 4)


@pytest.mark.parametrize("name", ["vllm", "vllm-v0"])
def test_an_engine_profile_adds_its_overhead_to_every_step(name):
    workload = Workload.synthetic(3, 64, 8)
    plain, vllm = (Simulator("llama-3.1-8b", "h100-sxm", EngineConfig(), engine=e).run(workload) for e in (None, name))
    overhead = ENGINE_PROFILES[name].step_overhead_s
    assert [s.duration - overhead for s in vllm.steps] == pytest.approx([s.duration for s in plain.steps], abs=1e-12)
    assert repr([s.query_lens for s in vllm.steps]) == repr([s.query_lens for s in plain.steps])  # same schedule
    with pytest.raises(ValueError, match="unknown engine profile 'sglang'; known: vllm, vllm-v0"):
        Simulator("llama-3.1-8b", "h100-sxm", engine="sglang")


# ---- vLLM V0's engine profile: fitted on another source's batch-1 rows, never on the V0 rows it prices ----

V0_FIT_PREFIX = "vllm-v0-llm-inference-bench/"


def test_v0_engine_fit_rows_are_batch_1_h100_rows_of_a_source_other_than_the_v0_rows_they_price():
    fit = engine_fit_ids(profile="vllm-v0")
    assert len(fit) == 5 and all(i.startswith(V0_FIT_PREFIX) for i in fit)
    assert engine_fit_ids(profile=None) == engine_fit_ids() | fit  # V1's two rows are V1's alone
    by_id = {r["id"]: r for r in RAW}
    for i in fit:
        r = by_id[i]
        s = r["setup"]
        assert r["engine_fit"] is True and r["fit"] is False and s["engine_profile"] == "vllm-v0"
        assert s["mode"] == "latency" and s["batch_size"] == 1 and s["gpu"] == "h100-sxm", i
        assert s["input_len"] == s["output_len"] and "argonne-lcf/LLM-Inference-Bench" in r["source"], i
    priced = [r for r in RAW if r["setup"].get("engine_profile") == "vllm-v0" and r["id"] not in fit]
    assert {r["id"].split("/", 1)[0] for r in priced} == {"vllm-0.5", "vllm-main-2024-10"}
    # no fit row comes from the documents of the rows the profile prices (the v0.6.0 post, the Buildkite build)
    assert not any("blog.vllm.ai" in by_id[i]["source"] or "buildkite" in by_id[i]["source"] for i in fit)
    assert not any(r.get("engine_fit") for r in priced)


def test_a_latency_row_s_step_gap_is_its_gap_over_its_output_length():
    row = next(r for r in load() if r.id.startswith(V0_FIT_PREFIX))
    assert step_gap_s(row, row.value - 2.0 * row.setup["output_len"]) == pytest.approx(2e-3)
    batched = next(r for r in load() if r.id == SMALL_ROW)
    with pytest.raises(ValueError, match="batch 1"):
        step_gap_s(batched, batched.value)
