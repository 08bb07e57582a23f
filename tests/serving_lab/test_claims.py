"""Timing claims: asserted on a steady machine, skipped with a loud "machine unsteady" line on an unsteady one
(a profile fitted on a busy machine, or a run slowed beyond `busy`), never skipped for a datasheet profile."""

from __future__ import annotations

from dataclasses import replace

import pytest

from course.claims import error_claim, fit_note, machine_note, timing_claim
from sim.hardware import HardwareProfile

STEADY_FIT = {"steady": True, "repeat_spread_pct": 2.0, "cpu_wait_pct": 1.0}
BUSY_FIT = {"steady": False, "repeat_spread_pct": 4.0, "cpu_wait_pct": 45.0}


def calibrated(**provenance) -> HardwareProfile:
    return replace(HardwareProfile.named("local-cpu"), name="calibrated-test", source="calibrated",
                   provenance=provenance)


def test_fit_note_says_why_a_fit_cannot_be_trusted():
    assert fit_note(calibrated(**STEADY_FIT)) is None
    assert fit_note("h100-sxm") is None  # datasheet numbers are not fitted here
    note = fit_note(calibrated(**BUSY_FIT))
    assert "fitted on a busy machine" in note and "45%" in note
    assert "does not record how steady" in fit_note(calibrated())


def test_machine_note_is_the_fit_first_then_the_worst_run():
    steady, busy = calibrated(**STEADY_FIT), calibrated(**BUSY_FIT)
    rows = [{"side": "measured", "slowdown": 1.05}, {"side": "simulated"}, {"side": "measured", "slowdown": 1.4}]
    assert machine_note(steady, rows=rows[:2]) is None
    assert "1.40x slower" in machine_note(steady, rows=rows)
    assert "faster" in machine_note(steady, slowdowns=[0.7])
    assert "fitted on a busy machine" in machine_note(busy, rows=rows[:2])  # a slowdown against it says nothing


def test_timing_claim_asserts_when_steady_and_skips_loudly_when_not(capsys):
    timing_claim(True, "fast enough", None)
    with pytest.raises(AssertionError, match="fast enough"):
        timing_claim(False, "fast enough", None)
    timing_claim(False, "fast enough", "a busy core")
    assert capsys.readouterr().out == "machine unsteady: a busy core; skipping this timing claim (fast enough)\n"


def _pair(slowdown: float, error_pct: float) -> list[dict]:
    return [{"cap": 4, "side": "measured", "duration": 1.0, "slowdown": slowdown},
            {"cap": 4, "side": "simulated", "duration": 1.0 + error_pct / 100, "duration_err_pct": error_pct}]


def test_error_claim_skips_unsteady_pairs_and_unsteady_fits(capsys):
    steady, busy = calibrated(**STEADY_FIT), calibrated(**BUSY_FIT)
    error_claim(_pair(1.0, 10.0) + _pair(1.5, 90.0), ["duration"], steady)
    assert "machine unsteady: cap=4: skipped, the engine ran 1.50x slower" in capsys.readouterr().out
    with pytest.raises(AssertionError, match="90"):
        error_claim(_pair(1.0, 90.0), ["duration"], steady)
    error_claim(_pair(1.0, 90.0), ["duration"], busy)
    assert capsys.readouterr().out.startswith("machine unsteady: profile 'calibrated-test' was fitted on a busy machine")


def test_prefills_off_profile_make_a_run_unsteady_too(capsys):
    """TTFT is made of prefill steps; a run whose decodes ran on-profile while its prefills did not is
    skipped, naming its prefill steps."""
    steady = calibrated(**STEADY_FIT)
    pair = _pair(1.0, 37.0)
    pair[0]["prefill_slowdown"] = 0.73
    error_claim(pair, ["duration"], steady)
    assert "its prefill steps: the engine ran 1.37x faster" in capsys.readouterr().out
    assert "its prefill steps" in machine_note(steady, rows=pair)
    pair[0]["prefill_slowdown"] = 1.1
    with pytest.raises(AssertionError, match="37"):
        error_claim(pair, ["duration"], steady)
