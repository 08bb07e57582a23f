"""Lesson 1's experiment functions in course/continuous_batching.py: the cost of a step, static vs continuous, capacity and
load sweeps, and the table helper. Simulator-only except one tiny engine run of `step_cost`; no timing asserts
on measured numbers (the notebook compares those, with its tolerances)."""

from __future__ import annotations

import math

import pytest

from core import Exponential
from course.continuous_batching import (
    capacity,
    load_sweep,
    static_vs_continuous,
    step_cost,
    throughput_ratios,
)
from serving_lab.pairing import Sides, error_check, format_table, pairs, same_policy

GPU = Sides(arch="llama-3.1-8b", hardware="h100-sxm", measure=False)
CPU = Sides(hardware="local-cpu", measure=False)


def test_sides_pick_the_model_profile_and_dtype():
    assert GPU.simulated_arch().name == "Llama-3.1-8B"
    assert GPU.cost_model().dtype == "bfloat16"  # datasheet profiles assume bf16
    assert Sides(hardware="h100-sxm", dtype="float32", measure=False).cost_model().dtype == "float32"
    assert CPU.simulated_arch().name == "SmolLM2-135M"  # the default model


def test_step_cost_on_a_gpu_profile_shows_the_knee():
    rows = step_cost([1, 64, 1024], [64, 2048], [16, 1024, 4096], GPU)
    assert all(r["side"] == "simulated" and "step_ms_err_pct" not in r for r in rows)
    decode = {(r["batch_size"], r["context"]): r for r in rows if r["kind"] == "decode"}
    # nearly flat and memory-bound at short context, compute-bound far past the ridge (~295 FLOP/byte)
    assert decode[(64, 64)]["step_ms"] < 1.5 * decode[(1, 64)]["step_ms"] and decode[(64, 64)]["bound"] == "memory"
    assert decode[(1024, 64)]["bound"] == "compute"
    # long contexts: KV reads make the step grow with the batch although it stays memory-bound
    assert decode[(64, 2048)]["step_ms"] > 1.5 * decode[(64, 64)]["step_ms"]
    for r in rows:
        assert r["tokens_per_s"] == pytest.approx(r["num_tokens"] / (r["step_ms"] / 1e3))
    prefill = {r["num_tokens"]: r for r in rows if r["kind"] == "prefill"}
    assert prefill[4096]["tokens_per_s"] < 1.1 * prefill[1024]["tokens_per_s"]  # saturated
    assert prefill[1024]["bound"] == "compute" and prefill[16]["bound"] == "memory"


def test_static_vs_continuous_ratios_grow_with_the_cap():
    rows = static_vs_continuous([32, 512], GPU, num_requests=128, prompt_len=64, mean_output=128, max_num_seqs=32)
    assert [(r["cap"], r["scheduling"]) for r in rows] == [(32, "static"), (32, "continuous"), (512, "static"),
                                                            (512, "continuous")]
    ratios = throughput_ratios(rows)
    assert [r["cap"] for r in ratios] == [32, 512] and {r["side"] for r in ratios} == {"simulated"}
    assert 1 <= ratios[0]["ratio"] < ratios[1]["ratio"]
    steps = throughput_ratios(rows, metric="num_steps")
    assert steps[1]["static"] > steps[1]["continuous"]


def test_equal_lengths_tie():
    # cap 1 forces every output to one token: both schedulers take the same steps
    rows = static_vs_continuous([1], CPU, num_requests=8, prompt_len=16, mean_output=4, max_num_seqs=4)
    (ratio,) = throughput_ratios(rows)
    assert ratio["ratio"] == pytest.approx(1.0)


def test_capacity_orders_the_schedulers_and_needs_a_queue():
    mix = dict(num_requests=64, prompt_len=(32, 256), output_len=Exponential(64, 512), max_num_seqs=16,
               max_num_batched_tokens=2048)
    continuous = capacity(GPU, scheduling="continuous", **mix)
    static = capacity(GPU, scheduling="static", **mix)
    assert continuous > static > 0
    with pytest.raises(ValueError, match="more requests than max_num_seqs"):
        capacity(GPU, num_requests=4, max_num_seqs=8)


def test_load_sweep_covers_every_policy_and_rate():
    rows = load_sweep([5.0, 50.0], GPU, num_requests=32, scheduling=("static", "continuous"), max_num_seqs=8)
    assert [(r["scheduling"], r["rate"]) for r in rows] == [("static", 5.0), ("static", 50.0),
                                                            ("continuous", 5.0), ("continuous", 50.0)]
    assert all(r["completed"] == 32 for r in rows)
    by = {(r["scheduling"], r["rate"]): r for r in rows}
    assert by[("continuous", 50.0)]["mean_ttft_ms"] < by[("static", 50.0)]["mean_ttft_ms"]


def test_format_table():
    table = format_table([{"a": 1, "b": 2.345, "x_err_pct": -3.21}, {"a": 10, "b": 1234.5}], ["a", "b", "x_err_pct"])
    lines = table.splitlines()
    assert lines[0].split() == ["a", "b", "x_err_pct"]
    assert lines[2].split() == ["1", "2.35", "-3.2%"]
    assert lines[3].split() == ["10", "1234"]  # a missing value stays blank
    assert len({len(line) for line in lines}) == 1


@pytest.mark.cpu_only(reason="the engine's side is paired with the local-cpu profile's simulated side")
def test_step_cost_measures_the_engine(smollm2):
    rows = step_cost([2], [16], [16], Sides(model=smollm2, hardware="local-cpu"), decode_tokens=3)
    assert [(r["kind"], r["side"]) for r in rows] == [("decode", "measured"), ("decode", "simulated"),
                                                      ("prefill", "measured"), ("prefill", "simulated")]
    for measured, simulated in pairs(rows):
        assert measured["step_ms"] > 0 and math.isfinite(simulated["step_ms_err_pct"])


@pytest.mark.cpu_only(reason="the engine's side is paired with the local-cpu profile's simulated side")
def test_engine_and_simulator_take_the_same_steps(smollm2):
    rows = static_vs_continuous([6], Sides(model=smollm2, hardware="local-cpu"), num_requests=4, prompt_len=8,
                                mean_output=4, max_num_seqs=2)
    assert len(pairs(rows)) == 2
    for measured, simulated in pairs(rows):
        assert same_policy(measured["metrics"], simulated["metrics"])


def test_error_check_judges_quiet_runs_and_skips_busy_ones():
    def pair(label, slowdown, err):
        return [{"cap": label, "side": "measured", "slowdown": slowdown, "duration": 1.0},
                {"cap": label, "side": "simulated", "duration": 1.0 + err / 100, "duration_err_pct": err}]

    rows = pair(4, 1.0, 10.0) + pair(16, 1.05, -40.0) + pair(48, 1.5, -60.0) + pair(64, 0.5, 90.0)
    problems, skipped = error_check(rows, ["duration"], tolerance_pct=35)
    assert len(problems) == 1 and problems[0].startswith("cap=16: duration") and "-40.0%" in problems[0]
    assert len(skipped) == 2
    assert skipped[0].startswith("cap=48: skipped, the engine ran 1.50x slower") and "busy" in skipped[0]
    assert skipped[1].startswith("cap=64: skipped, the engine ran 2.00x faster") and "stale" in skipped[1]
