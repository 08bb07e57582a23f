"""`serving-lab sweep`: deterministic tables, a correct Pareto front, resuming, and clear errors."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from serving_lab import cli
from serving_lab.manifest import EXAMPLE_MANIFEST, ManifestError, load_manifest
from serving_lab.sweep import Sweep, pareto_front, parse_grid, rank_agreement, run_sweep
from sim.hardware import HardwareProfile

WORKLOAD = "synthetic:24:96:24:20"
GRID = {"max_num_seqs": [2, 8, 32], "prefill_budget_tokens": [32, 256], "block_size": [16, 32]}


def _sweep(grid: dict | None = None, **kwargs) -> Sweep:
    return Sweep(load_manifest(EXAMPLE_MANIFEST), parse_grid(grid or GRID), WORKLOAD, hardware="local-cpu", **kwargs)


def _plain(rows: list[dict]) -> list[dict]:
    return json.loads(json.dumps(rows))


def test_same_seed_same_table(tmp_path):
    first = run_sweep(_sweep(), tmp_path / "a")
    second = run_sweep(_sweep(), tmp_path / "b")
    assert len(first.simulated()) == 12 and first.measured() == []
    assert _plain(first.rows) == _plain(second.rows)
    assert (tmp_path / "a" / "sweep.csv").read_text() == (tmp_path / "b" / "sweep.csv").read_text()
    assert run_sweep(_sweep(seed=1)).rows != first.rows  # the seed reaches the workload


def test_the_knobs_reach_the_simulator():
    rows = {r["point"]: r for r in run_sweep(_sweep()).simulated()}
    small, large = rows["max_num_seqs=2 prefill_budget_tokens=256 block_size=16"], \
        rows["max_num_seqs=32 prefill_budget_tokens=256 block_size=16"]
    assert large["output_throughput"] > 2 * small["output_throughput"]  # batching pays (lesson 1)
    assert rows["max_num_seqs=8 prefill_budget_tokens=256 block_size=32"]["num_kv_blocks"] * 2 == \
        rows["max_num_seqs=8 prefill_budget_tokens=256 block_size=16"]["num_kv_blocks"]


def test_pareto_front_on_a_hand_built_table():
    rows = [
        {"output_throughput": 100, "p99_itl_ms": 10, "p99_ttft_ms": 100},  # 0: front (lowest ITL)
        {"output_throughput": 200, "p99_itl_ms": 20, "p99_ttft_ms": 100},  # 1: front
        {"output_throughput": 150, "p99_itl_ms": 25, "p99_ttft_ms": 150},  # 2: dominated by 1
        {"output_throughput": 200, "p99_itl_ms": 20, "p99_ttft_ms": 100},  # 3: equal to 1: neither dominates
        {"output_throughput": 50, "p99_itl_ms": 30, "p99_ttft_ms": 50},    # 4: front (lowest TTFT)
        {"output_throughput": 90, "p99_itl_ms": 10, "p99_ttft_ms": 100},   # 5: dominated by 0
    ]
    assert pareto_front(rows) == [0, 1, 3, 4]
    assert pareto_front(rows, minimize=()) == [1, 3]


def test_sweep_marks_its_front():
    result = run_sweep(_sweep())
    simulated = result.simulated()
    assert [r["point"] for r in simulated if r["on_front"]] == result.front
    assert [simulated[i]["point"] for i in pareto_front(simulated)] == result.front


def test_rank_agreement():
    simulated = [{"point": p, "output_throughput": t} for p, t in zip("abcd", (1.0, 2.0, 3.0, 4.0))]
    measured = [{"point": p, "output_throughput": t} for p, t in zip("abcd", (10.0, 30.0, 20.0, 40.0))]
    agreement = rank_agreement(measured, simulated)
    assert agreement["rho"] == pytest.approx(0.8)  # one swapped pair of four: 1 - 6 * 2 / (4 * 15)
    assert [p["point"] for p in agreement["points"]] == list("abcd")
    assert math.isnan(rank_agreement(measured[:2], simulated)["rho"])


def test_an_interrupted_sweep_resumes_to_the_same_table(tmp_path, monkeypatch):
    whole = run_sweep(_sweep(), tmp_path / "whole")
    calls = []
    simulate = Sweep.simulate

    def interrupted(self, point):
        if len(calls) == 5:
            raise KeyboardInterrupt
        calls.append(point.id)
        return simulate(self, point)

    monkeypatch.setattr(Sweep, "simulate", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(_sweep(), tmp_path / "resumed")
    assert len((tmp_path / "resumed" / "points.jsonl").read_text().splitlines()) == 5
    assert not (tmp_path / "resumed" / "sweep.csv").exists()
    monkeypatch.setattr(Sweep, "simulate", simulate)
    resumed_calls = []
    monkeypatch.setattr(Sweep, "simulate", lambda self, p: resumed_calls.append(p.id) or simulate(self, p))
    resumed = run_sweep(_sweep(), tmp_path / "resumed")
    assert len(resumed_calls) == 7 and not set(resumed_calls) & set(calls)  # only the points not yet done
    assert _plain(resumed.rows) == _plain(whole.rows)
    assert (tmp_path / "resumed" / "sweep.csv").read_text() == (tmp_path / "whole" / "sweep.csv").read_text()


def test_a_folder_of_another_sweep_is_refused(tmp_path):
    run_sweep(_sweep(), tmp_path / "out")
    other = _sweep({"max_num_seqs": [4, 8]})
    with pytest.raises(FileExistsError, match="holds a different sweep"):
        run_sweep(other, tmp_path / "out")
    assert len(run_sweep(other, tmp_path / "out", force=True).rows) == 2
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="holds no sweep"):
        run_sweep(other, tmp_path / "notes")


@pytest.mark.parametrize("grid, message", [
    ({"max_num_seq": [8]}, "'max_num_seq' is not a knob; knobs: max_num_seqs"),
    ({}, "a grid is a mapping of knobs"),
    ({"max_num_seqs": []}, "max_num_seqs: an empty list"),
    ({"measure": [{"max_num_seqs": 8}]}, "the grid has no knobs"),
    ({"max_num_seqs": [8, 8]}, "a value listed twice"),
    ({"max_num_seqs": [8], "measure": [{"max_num_seqs": 16}]}, r"measure\[0\]: \{'max_num_seqs': 16\} is no point"),
    ({"max_num_seqs": [8], "measure": [{"block_size": 16}]}, r"measure\[0\]: a mapping of the grid's knobs"),
])
def test_bad_grids_are_named(grid, message):
    with pytest.raises(ManifestError, match=message):
        parse_grid(grid)


def test_a_bad_point_is_refused_before_anything_runs():
    with pytest.raises(ManifestError, match="grid point max_num_seqs=0: .*max_num_seqs"):
        _sweep({"max_num_seqs": [8, 0]})
    with pytest.raises(ManifestError, match="grid point dtype=int3: dtype: unknown dtype 'int3'"):
        _sweep({"dtype": ["bfloat16", "int3"]})
    with pytest.raises(ManifestError, match="speculation needs an `acceptance_rate` knob"):
        _sweep({"num_speculative_tokens": [0, 4]})


def test_a_point_the_engine_cannot_run_is_refused_before_measuring():
    sweep = _sweep({"tensor_parallel_size": [1, 2], "measure": [{"tensor_parallel_size": 2}]})
    with pytest.raises(ManifestError, match="the engine cannot run tensor_parallel_size=2"):
        run_sweep(sweep)


def test_simulator_only_knobs_sweep_a_gpu():
    sweep = Sweep(load_manifest(EXAMPLE_MANIFEST, {"engine.model": "llama-3.1-8b"}),
                  parse_grid({"tensor_parallel_size": [1, 2], "kv_cache_dtype": ["bfloat16", "fp8"]}),
                  "synthetic:64:512:64", hardware="h100-sxm")
    rows = {r["point"]: r for r in run_sweep(sweep).simulated()}
    assert rows["tensor_parallel_size=1 kv_cache_dtype=fp8"]["num_kv_blocks"] > \
        1.9 * rows["tensor_parallel_size=1 kv_cache_dtype=bfloat16"]["num_kv_blocks"]


def test_cli(tmp_path, capsys):
    grid = tmp_path / "grid.yaml"
    grid.write_text("max_num_seqs: [2, 32]\nblock_size: [16]\n")
    cli.main(["sweep", "--config", str(EXAMPLE_MANIFEST), "--grid", str(grid), "--workload", WORKLOAD,
              "--hardware", "local-cpu", "--out", str(tmp_path / "out"), "--slo-ttft-ms", "500"])
    out = capsys.readouterr().out
    assert "2 points simulated on local-cpu" in out and "goodput" in out
    assert json.loads((tmp_path / "out" / "sweep.json").read_text())["front"]
    grid.write_text("max_num_seqs: [2]\nbogus: [1]\n")
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["sweep", "--config", str(EXAMPLE_MANIFEST), "--grid", str(grid), "--workload", WORKLOAD])
    assert exit_info.value.code == 2
    assert "'bogus' is not a knob" in capsys.readouterr().err


@pytest.mark.slow
def test_a_measured_point_that_changes_numerics_is_judged_on_quality(smollm2):
    sweep = Sweep(load_manifest(EXAMPLE_MANIFEST), parse_grid({"dtype": ["float32", "bfloat16"]}), "synthetic:2:16:4",
                  hardware="local-cpu")
    rows = sweep.measure(sweep.grid.points(), model=smollm2, eval_prompts=2, eval_tokens=4)
    reference, bf16 = rows
    assert reference["side"] == bf16["side"] == "measured" and reference["completed"] == bf16["completed"] == 2
    assert "mean_kl" not in reference  # float32 is the reference itself
    assert 0 <= bf16["mean_kl"] < 0.05 and 0 <= bf16["agreement"] <= 1


def test_parallel_jobs_give_the_same_table(tmp_path):
    serial = run_sweep(_sweep())
    parallel = run_sweep(_sweep(), tmp_path / "out", jobs=2)
    assert _plain(parallel.rows) == _plain(serial.rows)
    assert len((tmp_path / "out" / "points.jsonl").read_text().splitlines()) == len(serial.rows)
    with pytest.raises(ValueError, match="jobs must be >= 1"):
        run_sweep(_sweep(), jobs=0)



def test_an_int8_manifest_stops_at_a_profile_that_cannot_price_int8():
    with pytest.raises(ManifestError, match="grid point max_num_seqs=2: profile 'local-cpu' has no peak FLOP/s for "
                                            "dtype 'int8'"):
        Sweep(load_manifest(EXAMPLE_MANIFEST, {"engine.quantization": "int8"}), parse_grid({"max_num_seqs": [2]}),
              "synthetic:2:16:4", hardware="local-cpu")


def test_a_numeric_point_the_profile_cannot_price_is_left_unpriced():
    sweep = _sweep({"quantization": [None, "int8"], "max_num_seqs": [2, 4], "measure": [{"quantization": "int8"}]})
    sweep.measure = lambda points, *args: []  # the engine side: the slow tests
    result = run_sweep(sweep)
    rows = {row["point"]: row for row in result.simulated()}
    unpriced = rows["quantization=int8 max_num_seqs=2"]
    assert "has no rate for int8" in unpriced["unpriced"] and unpriced["output_throughput"] is None
    assert rows["quantization=None max_num_seqs=2"]["output_throughput"] > 0
    assert result.front and all("int8" not in point for point in result.front)
    with pytest.raises(ManifestError, match="the engine cannot run it with dtype=bfloat16"):
        _sweep({"quantization": ["int4"], "dtype": ["bfloat16"]}).check_engine_can_run(
            parse_grid({"quantization": ["int4"], "dtype": ["bfloat16"]}).points()[0])


def test_a_path_this_machine_has_calibrated_is_priced_by_its_own_profile(tmp_path, monkeypatch):
    """A sweep priced by this machine's float32 calibration prices its int8 points with this machine's int8
    calibration, when one is saved (`calibrate --quantization int8`); a built-in profile never borrows one."""
    monkeypatch.setenv("SERVING_LAB_CACHE", str(tmp_path))
    cpu = HardwareProfile.named("local-cpu")
    calibrated = {**cpu.provenance, "device_type": "cpu", "dtype": "float32"}
    replace(cpu, name="calibrated-cpu-float32", peak_flops={"float32": cpu.peak_flops["float32"]},
            provenance=calibrated).save()
    grid = {"quantization": [None, "int8"], "max_num_seqs": [2]}
    sweep = Sweep(load_manifest(EXAMPLE_MANIFEST), parse_grid(grid), WORKLOAD, hardware="calibrated-cpu-float32")
    int8_point = sweep.grid.points()[1]
    assert "`serving-lab calibrate --quantization int8`" in sweep.unpriced(int8_point)
    rate = 4 * cpu.peak_flops["float32"]  # as `calibrate --quantization int8` keys it: int8 and its float32 around
    replace(cpu, name="calibrated-cpu-int8", peak_flops={"int8": rate, "float32": rate},
            provenance={**calibrated, "quantization": "int8"}).save()
    sweep = Sweep(load_manifest(EXAMPLE_MANIFEST), parse_grid(grid), WORKLOAD, hardware="calibrated-cpu-float32")
    assert sweep.unpriced(int8_point) is None and sweep.profile_for(int8_point).name == "calibrated-cpu-int8"
    assert sweep.simulator(int8_point).kv_cache_dtype == "float32"  # the KV cache of the engine around int8
    fp32, int8 = (sweep.simulate(point) for point in sweep.grid.points())
    assert int8["output_throughput"] > fp32["output_throughput"] > 0  # its own (here faster) rates
    assert _sweep(grid).unpriced(int8_point) is not None  # local-cpu: no borrowing


@pytest.mark.slow
def test_a_kv_cache_dtype_point_is_measured_and_judged_on_the_eval_set(smollm2):
    sweep = Sweep(load_manifest(EXAMPLE_MANIFEST), parse_grid({"kv_cache_dtype": ["auto", "bfloat16"]}), "chat:2:2:8:4:4",
                  hardware="local-cpu")
    reference, bf16 = sweep.measure(sweep.grid.points(), model=smollm2, eval_prompts=2, eval_tokens=4)
    assert reference["completed"] == bf16["completed"] == 4 and "mean_kl" not in reference
    assert 0 <= bf16["mean_kl"] < 0.05 and 0 <= bf16["agreement"] <= 1
