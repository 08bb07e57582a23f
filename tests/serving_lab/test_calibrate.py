"""Calibration on a tiny random model: the profile is saved with its drift-probe times and how steady the
machine was, a fit taken on an unsteady machine is flagged, and `load_or_calibrate` uses a profile fitted
within the hour as it is, and an older one only while it was fitted on a steady machine and the machine
still runs the probe at the same speed. A CPU profile carries the machine's all-reduce (measured by spawned
processes, which the tests replace by timings of a known link).

The tiny model's grid runs once, for real; each test then fakes the machine around those runs (the
repeats' spread, the time our threads waited for a core), so steadiness is the test's choice, not the
machine's."""

from __future__ import annotations

import datetime
import time
from dataclasses import replace

import pytest

import serving_lab.calibrate as calibration
from serving_lab.collectives import CALIBRATION_SIZES, AllReduceTiming, ring_factor
from sim.hardware import HardwareProfile


@pytest.fixture(scope="module", autouse=True)
def isolated_cache(tmp_path_factory):
    """Never read or write the real ~/.cache from tests."""
    with pytest.MonkeyPatch.context() as patch:
        cache = tmp_path_factory.mktemp("cache")
        patch.setenv("SERVING_LAB_CACHE", str(cache))
        yield cache


FIT_BOUND = calibration.MAX_FIT_MEAN_ERROR_PCT


@pytest.fixture(scope="module", autouse=True)
def no_fit_bound():
    """No bound on the fit's error, but in the tests of the bound: the tiny model's grid runs for real on a
    shared machine (a neighbour can push its fit past the bound) while each test fakes a steady one. Module
    scoped, so that it holds for the module's calibration fixtures too."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(calibration, "MAX_FIT_MEAN_ERROR_PCT", float("inf"))
        yield


# The link the fake all-reduce measurement times: world size -> (latency s, bus bandwidth bytes/s).
LINK = {2: (4e-4, 1.5e9), 3: (1.2e-3, 1.2e9)}
SLICE_S = 4e-3  # the OS's time slice, as measured instead of 0.6 s of spinning processes


@pytest.fixture(scope="module", autouse=True)
def known_allreduce():
    """All-reduce timings of `LINK` instead of seconds of spawned processes; the measured world sizes are logged."""
    measured: list[tuple[int, ...]] = []

    def measure(world_sizes, sizes=CALIBRATION_SIZES, repeats=5, cores=None):
        measured.append(tuple(world_sizes))
        return {p: [AllReduceTiming(p, n, LINK[p][0] + ring_factor(p) * n / LINK[p][1]) for n in sizes]
                for p in world_sizes}

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(calibration, "measure_allreduce", measure)
        patch.setattr(calibration, "measure_time_slice", lambda: SLICE_S)
        yield measured


@pytest.fixture(scope="module")
def tiny(make_tiny_hf_model):
    from ref_engine.model.loader import load_model

    path = make_tiny_hf_model("llama", name="calibrate", max_position_embeddings=2048)
    return load_model(path, dtype="float32", device="cpu")


@pytest.fixture(scope="module")
def grid_runs(tiny):
    """Every run of the calibration grid on the tiny model (two repeats of each workload)."""
    return calibration.run_grid(tiny)


def _machine(patch, runs, *, jitter: float = 0.0, cpu_wait_pct: float | None = 1.0) -> None:
    """Make calibration measure `runs` with every repeat after the first `jitter` slower than the first
    (the same runs, so the fit does not change), and this process's threads waiting for a core
    `cpu_wait_pct` of the time they were ready to run (None: the kernel does not say)."""
    repeats = [[replace(rs[0], duration=rs[0].duration * (1 + jitter * (i > 0))) for i in range(len(rs))]
               for rs in runs]
    patch.setattr(calibration, "run_grid", lambda *args, **kwargs: repeats)
    readings = iter([(0.0, 0.0), (100.0 - cpu_wait_pct, cpu_wait_pct)] if cpu_wait_pct is not None else [None, None])
    patch.setattr(calibration, "cpu_clock", lambda: next(readings))


@pytest.fixture(scope="module")
def saved(tiny, grid_runs):
    """A calibration of the tiny model on a quiet machine, read back from where it was saved."""
    with pytest.MonkeyPatch.context() as patch:
        _machine(patch, grid_runs)
        profile = calibration.calibrate(tiny, verbose=False)
    return HardwareProfile.named(profile.name)


def test_quiet_calibration_is_saved_with_its_provenance(saved, tiny):
    assert saved.source == "calibrated"
    assert saved.provenance["model"] == tiny.model_id
    assert saved.provenance["fit_form"] == calibration.FIT_FORM
    assert len(saved.provenance["drift_probe_s"]) == len(calibration.DRIFT_PROBE)
    assert all(t > 0 for t in saved.provenance["drift_probe_s"])
    assert saved.provenance["steady"] is True
    assert saved.provenance["repeat_spread_pct"] == 0.0 and saved.provenance["cpu_wait_pct"] == 1.0
    assert calibration.unsteady_fit(saved) is None


def test_a_cpu_profile_carries_the_machines_cores_and_all_reduce(saved, tiny):
    from ref_engine.distributed.parallel_state import cpu_cores
    from sim.cost_model import BatchShape, CostModel

    assert saved.cores == cpu_cores() and saved.threads == saved.provenance["threads"]
    for p, (latency, bandwidth) in LINK.items():
        assert saved.measured_allreduce[p] == [pytest.approx(latency), pytest.approx(bandwidth)]
    assert (saved.interconnect_latency_s, saved.interconnect_bandwidth) == (pytest.approx(4e-4), pytest.approx(1.5e9))
    assert set(saved.provenance["allreduce"]["fit_mean_abs_error_pct"]) == {"2", "3"}
    comm = CostModel(tiny.arch, saved, dtype="float32", tensor_parallel_size=3).breakdown(BatchShape.decode(1, 8)).comm_s
    assert comm == pytest.approx(2 * tiny.arch.num_layers * (1.2e-3 + 4 / 3 * tiny.arch.hidden_size * 4 / 1.2e9))


def test_a_cpu_profile_saved_before_the_all_reduce_gains_it_on_load(monkeypatch, tmp_path, saved, tiny,
                                                                     known_allreduce):
    old = replace(saved, cores=0, threads=0, measured_allreduce={})
    monkeypatch.setenv("SERVING_LAB_CACHE", str(tmp_path))
    old.save()
    log = _probe_at(monkeypatch, saved, 1.0)
    measured_before = len(known_allreduce)
    loaded = calibration.load_or_calibrate(tiny)
    assert log == [] and known_allreduce[measured_before:] == [calibration.ALLREDUCE_WORLD_SIZES]  # no refit
    assert loaded.measured_allreduce == saved.measured_allreduce and loaded.cores == saved.cores
    assert HardwareProfile.named(saved.name) == loaded  # saved with it
    assert calibration.with_measured_allreduce(old, ()).measured_allreduce == {}  # () measures nothing


def test_a_cpu_profile_carries_the_time_slice_and_one_saved_without_gains_it_on_load(monkeypatch, tmp_path, saved,
                                                                                    tiny, known_allreduce):
    assert saved.scheduler_slice_s == SLICE_S
    monkeypatch.setenv("SERVING_LAB_CACHE", str(tmp_path))
    replace(saved, scheduler_slice_s=0.0).save()
    log = _probe_at(monkeypatch, saved, 1.0)
    measured_before = len(known_allreduce)
    loaded = calibration.load_or_calibrate(tiny)
    assert log == [] and known_allreduce[measured_before:] == []  # no refit, the all-reduce kept
    assert loaded == saved and HardwareProfile.named(saved.name) == loaded


@pytest.mark.parametrize("jitter, cpu_wait_pct, steady", [
    (0.30, 1.0, False),  # load that comes and goes: repeats 30% apart
    (0.0, 40.0, False),  # one core busy all along: every repeat alike, but our threads wait for a core
    (0.30, None, False),  # no schedstat (not Linux): the spread alone decides
    (0.05, 5.0, True),  # the ordinary jitter of a quiet machine
    (0.05, None, True),
])
def test_calibration_records_how_steady_the_machine_was(monkeypatch, tiny, grid_runs, capsys, jitter,
                                                        cpu_wait_pct, steady):
    _machine(monkeypatch, grid_runs, jitter=jitter, cpu_wait_pct=cpu_wait_pct)
    profile = calibration.calibrate(tiny, verbose=False, save=False)
    assert profile.provenance["steady"] is steady
    assert profile.provenance["repeat_spread_pct"] == pytest.approx(100 * jitter)
    assert profile.provenance["cpu_wait_pct"] == cpu_wait_pct
    out = capsys.readouterr().out
    if steady:
        assert calibration.unsteady_fit(profile) is None and out == ""
    else:
        assert "fitted on a busy machine" in calibration.unsteady_fit(profile)
        assert out.startswith("warning: ") and "claims that rest on it are skipped" in out


def _fake_cuda(monkeypatch, tiny, measured: dict):
    """`tiny` as if loaded on a GPU, with the device's measurements faked and logged into `measured`: its
    memory, its copy bandwidth and matmul rate (each with the device it was asked to measure on)."""
    import types

    import torch

    gpu = torch.device("cuda", 0)
    param = types.SimpleNamespace(device=gpu, dtype=torch.float32)

    def properties(device):
        measured["memory_of"] = device
        return types.SimpleNamespace(total_memory=80 * 2**30)

    def copy_bandwidth(device, *args, **kwargs):
        measured["copied_on"] = device
        return 3e12

    def matmul_rate(device, dtype, *args, **kwargs):
        measured["matmul_on"] = (device, dtype)
        return 5e14

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Fake GPU")
    monkeypatch.setattr(torch.cuda, "get_device_properties", properties)
    monkeypatch.setattr(calibration, "measure_copy_bandwidth", copy_bandwidth)
    monkeypatch.setattr(calibration, "measure_matmul_rate", matmul_rate)
    return replace(tiny, model=types.SimpleNamespace(parameters=lambda: iter([param]))), gpu


def test_a_cuda_calibration_measures_on_the_device_and_records_its_memory(monkeypatch, tmp_path, tiny, grid_runs,
                                                                          known_allreduce):
    """Issue #29: a CUDA calibration timed a host memcpy as the device's bandwidth and saved memory_bytes=0, a
    profile that cannot size a pool (and calibrated CUDA profiles are every notebook's first choice)."""
    import torch

    measured: dict = {}
    on_gpu, gpu = _fake_cuda(monkeypatch, tiny, measured)
    _machine(monkeypatch, grid_runs)
    monkeypatch.setenv("SERVING_LAB_CACHE", str(tmp_path))
    allreduces_before = len(known_allreduce)
    calibration.calibrate(on_gpu, verbose=False)
    saved = HardwareProfile.named("calibrated-cuda-float32")
    assert measured == {"copied_on": gpu, "matmul_on": (gpu, torch.float32), "memory_of": gpu}
    assert saved.memory_bandwidth == 3e12 and saved.memory_bytes == 80 * 2**30
    assert saved.provenance["device"] == "Fake GPU" and saved.provenance["device_matmul_flops"] == 5e14
    assert saved.cores == 0 and len(known_allreduce) == allreduces_before  # no CPU all-reduce on a GPU


def test_a_cpu_profile_records_no_device_memory(saved):
    """A CPU's KV pool is a fixed size (core/kv_sizing.py), whatever the profile says."""
    assert calibration.device_memory_bytes("cpu") == 0.0 and saved.memory_bytes == 0.0


def test_the_copy_bandwidth_is_timed_on_the_given_device_between_synchronisations(monkeypatch):
    """On the meta device (a device without memory, standing in for a GPU): every timed copy is bracketed by
    the device's synchronisation, and the buffers live there."""
    import torch

    import ref_engine.runner

    synced = []
    monkeypatch.setattr(ref_engine.runner, "synchronize", synced.append)
    assert calibration.measure_copy_bandwidth("meta", num_bytes=1 << 20, repeats=3) > 0
    assert synced == [torch.device("meta")] * 6


def _scrambled(grid_runs):
    """The grid's runs with every other step 5x as long and the rest a fifth: no form fits them."""
    return [[replace(run, steps=[replace(step, duration=step.duration * (5.0 if i % 2 else 0.2))
                                 for i, step in enumerate(run.steps)]) for run in repeats] for repeats in grid_runs]


def test_a_steady_fit_beyond_the_error_bound_is_refused_and_nothing_is_saved(monkeypatch, tmp_path, tiny, grid_runs):
    monkeypatch.setattr(calibration, "MAX_FIT_MEAN_ERROR_PCT", FIT_BOUND)
    monkeypatch.setenv("SERVING_LAB_CACHE", str(tmp_path))
    _machine(monkeypatch, _scrambled(grid_runs))
    unsaved = calibration.calibrate(tiny, verbose=False, save=False)  # a fit that is not saved is returned
    assert unsaved.provenance["fit_mean_abs_error_pct"] > FIT_BOUND == 35.0
    _machine(monkeypatch, _scrambled(grid_runs))
    with pytest.raises(calibration.CalibrationError, match=r"fit is [\d.]+% off the measured steps on average "
                       r"\(mean \|error\|\), beyond the bound of 35% for a fit on a steady machine"):
        calibration.calibrate(tiny, verbose=False)
    assert not any(tmp_path.rglob("*.json")), "a refused fit was written"


def test_an_unsteady_fit_beyond_the_bound_is_saved_flagged_as_before(monkeypatch, tmp_path, tiny, grid_runs):
    """A busy machine's fit is judged by its steadiness: saved flagged, its claims skipped, refit after an hour."""
    monkeypatch.setattr(calibration, "MAX_FIT_MEAN_ERROR_PCT", FIT_BOUND)
    monkeypatch.setenv("SERVING_LAB_CACHE", str(tmp_path))
    _machine(monkeypatch, _scrambled(grid_runs), cpu_wait_pct=40.0)
    profile = calibration.calibrate(tiny, verbose=False)
    assert profile.provenance["fit_mean_abs_error_pct"] > FIT_BOUND and profile.provenance["steady"] is False
    assert HardwareProfile.named(profile.name) == profile


def test_cpu_clock_counts_this_process_running():
    before = calibration.cpu_clock()
    if before is None:
        pytest.skip("this kernel reports no per-thread schedstat")
    # Spin until the kernel has charged this thread 0.1 s of CPU, not for a wall-clock time: on a VM the
    # hypervisor may take the core away (steal time), which neither counter sees.
    start = time.thread_time()
    while time.thread_time() - start < 0.1:
        pass
    ran, waited = (after - b for after, b in zip(calibration.cpu_clock(), before))
    assert ran >= 0.099 and waited >= 0  # the same kernel counter as thread_time; other threads only add


def _probe_at(monkeypatch, saved, factor: float) -> list[str]:
    """Make the machine run the drift probe `factor` times as long as at calibration; returns a log that
    gets "probed" each time the probe runs and "recalibrated" each time `load_or_calibrate` refits."""
    log: list[str] = []
    monkeypatch.setattr(calibration, "time_drift_probe", lambda loaded, seed=0: log.append("probed") or [
        factor * t for t in saved.provenance["drift_probe_s"]])
    monkeypatch.setattr(calibration, "calibrate", lambda *args, **kwargs: log.append("recalibrated") or saved)
    return log


def _saved_as(monkeypatch, tmp_path, saved, *, age_s: float | None, **provenance) -> HardwareProfile:
    """`saved` with `provenance` changed (None: a key removed), fitted `age_s` seconds ago (None: a profile
    saved before calibration recorded the time), saved into a cache of its own."""
    fields = {**saved.provenance, **provenance}
    fields["fitted_at"] = None if age_s is None else (
        datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(seconds=age_s)).isoformat(timespec="seconds")
    profile = replace(saved, provenance={k: v for k, v in fields.items() if v is not None})
    monkeypatch.setenv("SERVING_LAB_CACHE", str(tmp_path))  # leave `saved` where it is
    profile.save()
    return profile


HOUR_OLD = calibration.REFIT_AFTER_S + 60


@pytest.mark.parametrize("factor", [1.0, 1.05, 0.95])
def test_an_old_profile_is_reused_while_the_machine_runs_at_the_same_speed(monkeypatch, tmp_path, saved, tiny, factor):
    old = _saved_as(monkeypatch, tmp_path, saved, age_s=HOUR_OLD)
    log = _probe_at(monkeypatch, saved, factor)
    assert calibration.load_or_calibrate(tiny) == old
    assert log == ["probed"]


@pytest.mark.parametrize("factor", [1.2, 0.8])
@pytest.mark.parametrize("age_s", [HOUR_OLD, None], ids=["an-hour-old", "time-not-recorded"])
def test_an_old_profile_is_refit_when_the_machine_speed_moved(monkeypatch, tmp_path, saved, tiny, factor, age_s,
                                                              capsys):
    _saved_as(monkeypatch, tmp_path, saved, age_s=age_s)
    log = _probe_at(monkeypatch, saved, factor)
    calibration.load_or_calibrate(tiny)
    assert log == ["probed", "recalibrated"]
    assert "20% since it was calibrated" in capsys.readouterr().out


@pytest.mark.parametrize("recorded", ["unsteady", "not recorded"])
def test_an_old_profile_fitted_on_an_unsteady_machine_is_refit(monkeypatch, tmp_path, saved, tiny, capsys, recorded):
    if recorded == "unsteady":
        _saved_as(monkeypatch, tmp_path, saved, age_s=HOUR_OLD, steady=False, repeat_spread_pct=30.0)
    else:  # a profile saved before calibration recorded steadiness
        _saved_as(monkeypatch, tmp_path, saved, age_s=HOUR_OLD, steady=None, repeat_spread_pct=None,
                  cpu_wait_pct=None)
    log = _probe_at(monkeypatch, saved, 1.0)  # the drift probe alone would keep it
    calibration.load_or_calibrate(tiny)
    assert log == ["recalibrated"]
    out = capsys.readouterr().out
    assert "the saved profile cannot be trusted" in out
    assert ("fitted on a busy machine" if recorded == "unsteady" else "does not record how steady") in out


@pytest.mark.parametrize("steady", [True, False])
def test_a_profile_fitted_within_the_hour_is_used_as_it_is(monkeypatch, tmp_path, saved, tiny, capsys, steady):
    """However far the probe would have moved, and even when it was fitted on a busy machine: the CI run's
    notebooks and a student's afternoon share one calibration instead of paying 2 minutes each."""
    young = _saved_as(monkeypatch, tmp_path, saved, age_s=calibration.REFIT_AFTER_S - 60,
                      **({} if steady else {"steady": False, "cpu_wait_pct": 40.0}))
    log = _probe_at(monkeypatch, saved, 1.5)
    assert calibration.load_or_calibrate(tiny) == young
    assert log == []
    out = capsys.readouterr().out
    assert (out == "") if steady else ("using the saved profile as it is, though" in out and "59 min old" in out)


def test_time_factor_is_the_probe_now_over_then(monkeypatch, saved, tiny):
    _probe_at(monkeypatch, saved, 1.2)
    assert calibration.time_factor(saved, tiny) == pytest.approx(1.2)
    with pytest.raises(ValueError, match="no drift probe times"):
        calibration.time_factor(HardwareProfile.named("local-cpu"), tiny)


def test_a_profile_for_one_thread_is_measured_on_it_and_kept_beside_the_default(monkeypatch, tmp_path, saved, tiny,
                                                                                 grid_runs):
    import torch

    monkeypatch.setenv("SERVING_LAB_CACHE", str(tmp_path))
    saved.save()  # the default profile, which a one-thread request must neither reuse nor overwrite
    _machine(monkeypatch, grid_runs)
    grid, threads_seen = calibration.run_grid, []
    monkeypatch.setattr(calibration, "run_grid", lambda *a, **k: threads_seen.append(torch.get_num_threads()) or grid(*a, **k))
    monkeypatch.setattr(calibration, "time_drift_probe", lambda loaded, seed=0: threads_seen.append(
        torch.get_num_threads()) or list(one.provenance["drift_probe_s"]))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        one = calibration.load_or_calibrate(tiny, threads=1)
        assert threads_seen == [1] and torch.get_num_threads() == 2  # the grid ran on one thread, then restored
        assert one.name == "calibrated-cpu-float32-1-threads" and one.provenance["threads"] == 1
        assert HardwareProfile.named(saved.name) == saved and HardwareProfile.named(one.name) == one
        assert calibration.load_or_calibrate(tiny, threads=1) == one and threads_seen == [1]  # within the hour
        aged = _saved_as(monkeypatch, tmp_path, one, age_s=HOUR_OLD)
        assert calibration.load_or_calibrate(tiny, threads=1) == aged  # reused: probed on one thread, no new grid
        assert threads_seen == [1, 1]
    finally:
        torch.set_num_threads(before)
    with pytest.raises(ValueError, match="threads must be at least 1, got 0"):
        calibration.load_or_calibrate(tiny, threads=0)


def test_a_profile_measured_on_another_kernel_is_refit(monkeypatch, tmp_path, saved, tiny):
    """A profile saved before the engine's numeric path changed kernels (int8 was W8A8 once) prices a kernel
    the engine no longer runs: refit, however young and steady the profile is."""
    _saved_as(monkeypatch, tmp_path, saved, age_s=60, kernel="int8 W8A8, torch's quantized ops")
    log = _probe_at(monkeypatch, saved, 1.0)
    calibration.load_or_calibrate(tiny)
    assert log == ["recalibrated"]


def test_the_int8_engine_gets_a_profile_of_its_own_that_prices_int8(monkeypatch, tmp_path, saved, tiny):
    """`quantization="int8"` measures the int8 engine (the float32 model quantized) and saves its profile
    beside the float32 one, with rates keyed "int8" (and float32, the engine's dtype around the int8
    projections), so the simulator prices 1-byte weights with them and the KV cache at float32's width."""
    from core import EngineConfig, Workload
    from sim import Simulator

    monkeypatch.setenv("SERVING_LAB_CACHE", str(tmp_path))
    saved.save()
    measured = []
    grid = calibration.run_grid
    monkeypatch.setattr(calibration, "run_grid", lambda loaded, *a, **k: measured.append(loaded.quantization)
                        or grid(loaded, *a, **k))
    int8 = calibration.load_or_calibrate(tiny, quantization="int8")
    assert measured == ["int8"] and tiny.quantization is None  # a quantized copy ran the grid
    assert int8.name == "calibrated-cpu-int8" and set(int8.peak_flops) == {"int8", "float32"}
    assert int8.provenance["quantization"] == "int8" and int8.provenance["model"].endswith("+int8")
    assert HardwareProfile.named(saved.name) == saved  # the float32 profile is untouched
    assert calibration.load_or_calibrate(tiny, quantization="int8") == int8 and measured == ["int8"]  # reused
    simulator = Simulator(tiny.arch, int8, EngineConfig(), dtype="int8")
    run = simulator.run(Workload.synthetic(4, 16, 4, seed=0))
    assert run.completed == 4 and run.duration > 0 and simulator.kv_cache_dtype == "float32"


def test_the_grid_runs_in_interleaved_passes_with_its_rows_block_sizes(monkeypatch):
    from core.metrics import StepRecord
    from ref_engine import bench

    ran = []
    monkeypatch.setattr(bench, "run", lambda workload, config, model=None: ran.append(config.block_size) or
                        (workload.requests[0].prompt_len, config.block_size))
    rows = [0, 14, 15]  # a row at the calibration's block size, then the 1- and 128-token ones
    runs = calibration.run_grid(None, rows=rows, block_size=32)
    assert ran == [32, 32, 1, 128, 32, 1, 128]  # a throw-away run, then pass 1 and pass 2 over the rows
    assert [[r[1] for r in repeated] for repeated in runs] == [[32, 32], [1, 1], [128, 128]]
    step = StepRecord(0, 0.0, 0.1, (1, 1), (255, 20), 0.0, 0, 0, 0)
    assert calibration.grid_shape(step, 1).num_blocks_touched == 256 + 21
    assert calibration.grid_shape(step, 128).num_blocks_touched == 2 + 1


def test_a_quantized_model_cannot_be_calibrated_as_another_numeric_path(tiny):
    from ref_engine.model.loader import quantized

    with pytest.raises(ValueError, match="needs the float32 one"):
        calibration.engine_model(quantized(tiny, "int8"), "float32", None)


@pytest.mark.parametrize("dtype", ["float32", "int4"])
def test_the_fit_recovers_every_term_of_a_known_machine(dtype):
    """Steps priced by a known "sum" profile (SmolLM2's shapes, the calibration grid's kinds: decode at
    batch 1-64, some at other block sizes, prompt chunks with and without logits, mixed steps, verifies) are
    fitted back to it, every fitted term within 1e-6. A fit whose unknowns share a column (as per-token overhead and 1/FLOP/s once
    did) could not recover them: its rate would come out anywhere, often 1e30 FLOP/s. An int4 engine (float32
    around its projections) is fitted the same way, its rate keyed under both dtypes, so its KV cache and
    activations are priced at float32's width."""
    from core.arch_config import ArchConfig
    from sim.cost_model import BatchShape, CostModel

    arch = ArchConfig.named("smollm2-135m")
    known = HardwareProfile(name="known", peak_flops=dict.fromkeys({dtype, "float32"}, 1.5e11), memory_bandwidth=4e10,
                            memory_bytes=0.0, step_overhead_s=0.02, per_seq_overhead_s=8e-4, per_block_overhead_s=1e-4,
                            attention_efficiency=0.6, weight_packing_passes=1.5, combine="sum",
                            provenance={"dtype": "float32"})
    assert CostModel(arch, known, dtype=dtype).kv_cache_dtype == "float32"
    shapes = [BatchShape.decode(b, c) for b in (1, 2, 4, 16, 64) for c in (64, 512)]
    shapes += [BatchShape((n,), (c,), num_logit_rows=rows) for n, c, rows in
               ((16, 0, 1), (256, 0, 1), (256, 256, 0), (256, 768, 1), (1024, 0, 1))]
    shapes += [BatchShape((128,) + (1,) * 6, (300,) * 7), BatchShape.verify(1, 150, 5), BatchShape.verify(4, 150, 3)]
    shapes += [BatchShape((1,) * 8, (256,) * 8, num_blocks_touched=8 * 257), BatchShape((1,) * 8, (256,) * 8, 8 * 3)]
    price = CostModel(arch, known, dtype=dtype).step_time
    steps = [("decode" if max(s.query_lens) == 1 else "other", s, price(s)) for s in shapes]
    fitted, points = calibration.fit_profile(arch, steps, dtype=dtype, memory_bandwidth=known.memory_bandwidth,
                                             provenance={"dtype": "float32"})
    for term in ("step_overhead_s", "per_seq_overhead_s", "per_block_overhead_s", "attention_efficiency",
                 "weight_packing_passes"):
        assert getattr(fitted, term) == pytest.approx(getattr(known, term), rel=1e-6), term
    assert set(fitted.peak_flops) == {dtype, "float32"}
    assert fitted.peak_flops[dtype] == fitted.peak_flops["float32"] == pytest.approx(1.5e11, rel=1e-6)
    assert fitted.per_token_overhead_s == 0.0
    assert max(abs(p.error_pct) for p in points) < 1e-6
