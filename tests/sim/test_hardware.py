"""HardwareProfile: built-in numbers, lookup by name, JSON round trip, where profiles are saved."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from sim.hardware import (
    BUILTIN_PROFILES,
    DEFAULT_CPU_PROFILE,
    HardwareProfile,
    dtype_bytes,
    known_profile_names,
    load_calibrated_profile,
    profiles_dir,
)


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path, monkeypatch):
    """Never read or write the real ~/.cache from tests."""
    monkeypatch.setenv("SERVING_LAB_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_builtin_datasheet_numbers():
    a100 = HardwareProfile.named("A100-80GB-SXM")
    h100 = HardwareProfile.named("H100-SXM")
    h200 = HardwareProfile.named("H200")
    assert a100.peak_flops["bfloat16"] == pytest.approx(312e12)
    assert a100.peak_flops["float32"] == pytest.approx(19.5e12)
    assert a100.memory_bandwidth == pytest.approx(2.039e12)
    assert h100.peak_flops["bfloat16"] == pytest.approx(989e12)
    assert h100.peak_flops["float32"] == pytest.approx(67e12)
    assert h100.memory_bandwidth == pytest.approx(3.35e12)
    assert h200.peak_flops["bfloat16"] == h100.peak_flops["bfloat16"]
    assert h200.memory_bandwidth == pytest.approx(4.8e12)
    assert h200.memory_bytes == 143771 * 2**20  # nvidia-smi's "143771MiB", the engine's view of "141 GB"
    for profile in (a100, h100, h200):
        assert profile.source == "datasheet"
        assert profile.memory_bytes >= 80e9
        assert "fitted" in profile.notes
        # NVLink is stored per direction: half the datasheet's 600 / 900 GB/s bidirectional totals.
        assert profile.interconnect_bandwidth in (300e9, 450e9)


def test_cpu_profile_comes_from_the_machine_results():
    cpu = HardwareProfile.named(DEFAULT_CPU_PROFILE)
    assert cpu.source == "datasheet-like estimate"
    assert cpu.memory_bandwidth == pytest.approx(27e9)
    assert cpu.peak_flops["float32"] == pytest.approx(375e9)
    assert cpu.peak_flops["bfloat16"] == pytest.approx(2.3e12)
    assert cpu.step_overhead_s > 0 and cpu.per_block_overhead_s > 0


def test_named_is_case_insensitive_and_returns_a_copy():
    assert HardwareProfile.named("h100-sxm") == HardwareProfile.named("H100-SXM")
    assert HardwareProfile.named("h100_sxm").name == "H100-SXM"
    mine = HardwareProfile.named("h200")
    mine.peak_flops["bfloat16"] = 1.0
    mine.provenance["x"] = 1
    assert HardwareProfile.named("h200").peak_flops["bfloat16"] == pytest.approx(989e12)
    assert "x" not in HardwareProfile.named("h200").provenance


def test_named_unknown_lists_known_names():
    with pytest.raises(ValueError) as err:
        HardwareProfile.named("tpu-v5")
    message = str(err.value)
    assert "tpu-v5" in message
    for name in BUILTIN_PROFILES:
        assert name in message


def test_json_round_trip(tmp_path):
    profile = HardwareProfile.named("a100-80gb-sxm")
    profile.provenance.update({"device": "A100", "fit_errors": {"mape": 0.04}})
    path = profile.to_json(tmp_path / "sub" / "a100.json")
    assert json.loads(path.read_text())["name"] == "A100-80GB-SXM"
    assert HardwareProfile.from_json(path) == profile


def test_from_json_rejects_unknown_fields(tmp_path):
    data = HardwareProfile.named("h100-sxm").to_dict()
    data["efficiency"] = 0.7
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="efficiency"):
        HardwareProfile.from_json(path)


def test_profiles_dir_default_and_env(monkeypatch, tmp_path):
    monkeypatch.setenv("SERVING_LAB_CACHE", str(tmp_path / "elsewhere"))
    assert profiles_dir() == tmp_path / "elsewhere" / "profiles"
    monkeypatch.delenv("SERVING_LAB_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert profiles_dir() == tmp_path / "home" / ".cache" / "serving-lab" / "profiles"


def test_saved_profile_is_found_by_name(isolated_cache):
    calibrated = HardwareProfile(
        name="My-CPU-Calibrated", peak_flops={"float32": 3e11}, memory_bandwidth=2e10, memory_bytes=8e9,
        step_overhead_s=2e-3, source="calibrated",
        provenance={"device": "cpu", "dtype": "float32", "threads": 2, "torch": "2.13.0+cpu",
                    "model": "smollm2-135m", "attention": "torch-reference", "date": "2025-01-01"},
    )
    path = calibrated.save()
    assert path == isolated_cache / "profiles" / "my-cpu-calibrated.json"
    assert HardwareProfile.named("my-cpu-calibrated") == calibrated
    assert "my-cpu-calibrated" in known_profile_names()
    with pytest.raises(ValueError, match="my-cpu-calibrated"):
        HardwareProfile.named("nothing-like-it")


def test_a_calibrated_profile_this_version_cannot_read_is_passed_over(isolated_cache):
    """Another version's file (a field this one does not know) does not stop the simulator: the next saved
    profile serves, or none (and load_or_calibrate measures one)."""
    cpu = replace(HardwareProfile.named(DEFAULT_CPU_PROFILE), name="calibrated-cpu-float32")
    newer = {**cpu.to_dict(), "name": "calibrated-cuda-float32", "a_field_from_the_future": 1}
    (isolated_cache / "profiles").mkdir(parents=True)
    (isolated_cache / "profiles" / "calibrated-cuda-float32.json").write_text(json.dumps(newer))
    with pytest.warns(UserWarning, match="a_field_from_the_future"):
        assert load_calibrated_profile() is None
    cpu.save()
    with pytest.warns(UserWarning, match="calibrated-cuda-float32.json"):
        assert load_calibrated_profile() == cpu


def test_builtin_names_win_over_saved_files(isolated_cache):
    impostor = HardwareProfile.named("h100-sxm")
    impostor.memory_bandwidth = 1.0
    impostor.to_json(Path(isolated_cache) / "profiles" / "h100-sxm.json")
    assert HardwareProfile.named("h100-sxm").memory_bandwidth == pytest.approx(3.35e12)


def test_derated_scales_rates_and_records_it():
    h100 = HardwareProfile.named("h100-sxm")
    real = h100.derated(compute=0.8, memory=0.9)
    assert real.peak_flops["bfloat16"] == pytest.approx(0.8 * 989e12)
    assert real.memory_bandwidth == pytest.approx(0.9 * 3.35e12)
    assert real.step_overhead_s == h100.step_overhead_s
    assert real.source == "derated datasheet"
    assert real.provenance["derated_from"] == "H100-SXM"
    with pytest.raises(ValueError):
        h100.derated(compute=1.5)


def test_validation_and_dtype_lookup():
    with pytest.raises(ValueError, match="memory_bandwidth"):
        HardwareProfile(name="x", peak_flops={"float32": 1.0}, memory_bandwidth=0, memory_bytes=1)
    with pytest.raises(ValueError, match="step_overhead_s"):
        HardwareProfile(name="x", peak_flops={"float32": 1.0}, memory_bandwidth=1, memory_bytes=1,
                        step_overhead_s=-1)
    with pytest.raises(ValueError, match="peak_flops"):
        HardwareProfile(name="x", peak_flops={}, memory_bandwidth=1, memory_bytes=1)
    with pytest.raises(ValueError, match="float16"):
        HardwareProfile.named(DEFAULT_CPU_PROFILE).flops_for("float16")
    assert dtype_bytes("bfloat16") == 2 and dtype_bytes("float32") == 4
    with pytest.raises(ValueError, match="bfloat16"):
        dtype_bytes("bf16")


@pytest.mark.parametrize("name", ["h100-sxm", "local-cpu"])
def test_retimed_profile_scales_every_step_time(name):
    from sim.cost_model import BatchShape, CostModel
    from sim.simulator import resolve_model

    profile = HardwareProfile.named(name)
    slower = profile.retimed(1.5)
    assert slower.provenance["time_factor"] == 1.5 and slower.provenance["retimed_from"] == profile.name
    arch = resolve_model("llama-3.1-8b")
    for shape in (BatchShape.decode(32, 700), BatchShape((512, 1), (0, 900))):
        before = CostModel(arch, profile, dtype="bfloat16").step_time(shape)
        assert CostModel(arch, slower, dtype="bfloat16").step_time(shape) == pytest.approx(1.5 * before)
    with pytest.raises(ValueError, match="time factor"):
        profile.retimed(0)


@pytest.mark.parametrize("cores, threads, tp, rounds, rate, head", [
    (0, 0, 4, 1, 4.0, 4.0),  # a GPU: a device per rank, the head split by vocabulary
    (2, 2, 1, 1, 1.0, 1.0),  # one rank is the engine as measured
    (2, 2, 2, 1, 1.0, 0.5),  # two 1-thread ranks on the 2 cores the profile measured with 2 threads
    (2, 2, 3, 2, 1.0, 0.5),  # three 1-thread ranks on 2 cores: shared fairly, 1.0; or two turns (the cost model)
    (2, 2, 4, 2, 1.0, 0.5),  # four: two turns of two
    (2, 1, 2, 1, 2.0, 1.0),  # measured on 1 thread: two ranks use both cores
    (4, 2, 2, 1, 2.0, 1.0),  # 2 ranks x 2 threads on 4 cores, measured on 2
    (4, 4, 2, 1, 1.0, 0.5),  # measured on all 4 cores already
    (8, 2, 3, 1, 3.0, 1.0),  # 3 ranks x 2 threads (8 // 3) on 8 cores
])
def test_tensor_parallel_ranks_share_a_cpus_cores(cores, threads, tp, rounds, rate, head):
    profile = replace(HardwareProfile.named("local-cpu"), cores=cores, threads=threads)
    assert profile.tensor_parallel_rounds(tp) == rounds
    assert profile.tensor_parallel_rate(tp) == rate
    assert profile.lm_head_rate(tp) == head
    with pytest.raises(ValueError, match="tensor_parallel_size must be >= 1"):
        profile.tensor_parallel_rate(0)


def test_allreduce_terms_measured_then_interconnect():
    cpu = replace(HardwareProfile.named("local-cpu"), cores=2, threads=2, measured_allreduce={2: [5e-4, 1.5e9]})
    assert cpu.allreduce_terms(2) == (5e-4, 1.5e9)
    with pytest.raises(ValueError, match=r"measured all-reduces among 2 processes, not 3; recalibrate"):
        cpu.allreduce_terms(3)
    with pytest.raises(ValueError, match="among no processes, not 2"):
        replace(cpu, measured_allreduce={}).allreduce_terms(2)
    h100 = HardwareProfile.named("h100-sxm")
    assert h100.allreduce_terms(8) == (h100.interconnect_latency_s, h100.allreduce_bandwidth)
    with pytest.raises(ValueError, match="no interconnect"):
        replace(h100, interconnect_bandwidth=0.0).allreduce_terms(2)


def test_tensor_parallel_terms_are_validated_and_survive_json(tmp_path):
    cpu = HardwareProfile.named("local-cpu")
    with pytest.raises(ValueError, match="sets both cores and threads"):
        replace(cpu, cores=2, threads=0)
    with pytest.raises(ValueError, match="measured_allreduce maps a tp >= 2"):
        replace(cpu, measured_allreduce={1: [1e-4, 1e9]})
    with pytest.raises(ValueError, match="measured_allreduce maps a tp >= 2"):
        replace(cpu, measured_allreduce={2: [1e-4, 0.0]})
    measured = replace(cpu, cores=2, threads=2, measured_allreduce={2: [5e-4, 1.5e9], 3: [1.3e-3, 1.3e9]})
    assert HardwareProfile.from_json(measured.to_json(tmp_path / "cpu.json")) == measured  # int keys come back
    assert measured.retimed(2.0).allreduce_terms(3) == (pytest.approx(2.6e-3), pytest.approx(0.65e9))
