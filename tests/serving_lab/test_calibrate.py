"""Calibration on a tiny random model: the profile is saved (even when quiet), carries its drift-probe
times, and `load_or_calibrate` reuses it only while the machine still runs the probe at the same speed."""

from __future__ import annotations

import pytest

import serving_lab.calibrate as calibration
from sim.hardware import HardwareProfile


@pytest.fixture(scope="module", autouse=True)
def isolated_cache(tmp_path_factory):
    """Never read or write the real ~/.cache from tests."""
    with pytest.MonkeyPatch.context() as patch:
        cache = tmp_path_factory.mktemp("cache")
        patch.setenv("SERVING_LAB_CACHE", str(cache))
        yield cache


@pytest.fixture(scope="module")
def tiny(make_tiny_hf_model):
    from ref_engine.model.loader import load_model

    path = make_tiny_hf_model("llama", name="calibrate", max_position_embeddings=2048)
    return load_model(path, dtype="float32", device="cpu")


@pytest.fixture(scope="module")
def saved(tiny):
    """A quiet calibration of the tiny model, read back from where it was saved."""
    profile = calibration.calibrate(tiny, verbose=False)
    return HardwareProfile.named(profile.name)


def test_quiet_calibration_is_saved_with_its_provenance(saved, tiny):
    assert saved.source == "calibrated"
    assert saved.provenance["model"] == tiny.model_id
    assert saved.provenance["fit_form"] == calibration.FIT_FORM
    assert len(saved.provenance["drift_probe_s"]) == len(calibration.DRIFT_PROBE)
    assert all(t > 0 for t in saved.provenance["drift_probe_s"])


def _probe_at(monkeypatch, saved, factor: float) -> list[str]:
    """Make the machine run the drift probe `factor` times as long as at calibration; returns a log that
    gets "recalibrated" each time `load_or_calibrate` refits."""
    log: list[str] = []
    monkeypatch.setattr(calibration, "time_drift_probe",
                        lambda loaded, seed=0: [factor * t for t in saved.provenance["drift_probe_s"]])
    monkeypatch.setattr(calibration, "calibrate", lambda *args, **kwargs: log.append("recalibrated") or saved)
    return log


@pytest.mark.parametrize("factor", [1.0, 1.05, 0.95])
def test_saved_profile_is_reused_while_the_machine_runs_at_the_same_speed(monkeypatch, saved, tiny, factor):
    log = _probe_at(monkeypatch, saved, factor)
    assert calibration.load_or_calibrate(tiny) == saved
    assert log == []


@pytest.mark.parametrize("factor", [1.2, 0.8])
def test_saved_profile_is_refit_when_the_machine_speed_moved(monkeypatch, saved, tiny, factor, capsys):
    log = _probe_at(monkeypatch, saved, factor)
    calibration.load_or_calibrate(tiny)
    assert log == ["recalibrated"]
    assert "20% since it was calibrated" in capsys.readouterr().out


def test_time_factor_is_the_probe_now_over_then(monkeypatch, saved, tiny):
    _probe_at(monkeypatch, saved, 1.2)
    assert calibration.time_factor(saved, tiny) == pytest.approx(1.2)
    with pytest.raises(ValueError, match="no drift probe times"):
        calibration.time_factor(HardwareProfile.named("local-cpu"), tiny)
