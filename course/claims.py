"""Timing claims: a lesson's claim that rests on a timing is asserted while the machine is steady, and
skipped, loudly, when it is not.

A notebook makes two kinds of claims. What the shared core decides (steps, batch shapes, hits,
preemptions, `same_policy`) is exact on any machine and always asserted. What rests on a timing is only
as good as the machine was steady while the time was taken: a measured run (another program on one of two
cores slows every step, by up to 2x), and every simulated number on this machine, whose profile was fitted
to timings (a calibration on a busy machine priced a speculative verify step above the tokens it emits).
Such claims go through `timing_claim` with the reason the machine was unsteady, or None:

    fit_note(profile)                      the profile was fitted on an unsteady machine (its provenance)
    machine_note(profile, rows=measured)   that, or a measured run ran more than `busy` times slower or
                                           faster than the profile prices it (`drift_note`)

An unsteady machine prints "machine unsteady: <why>; skipping this timing claim (<what>)" instead of
failing; a steady one asserts with the claim's own tolerance. `error_claim` does the same for a table's
simulated-vs-measured errors, pair by pair. Datasheet profiles (the H100 what-ifs) are fixed numbers: their
claims never depend on this machine and are plain asserts.

Lesson: lessons/01-continuous-batching.md (which tolerance, and why).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from serving_lab.calibrate import unsteady_fit
from serving_lab.pairing import drift_note, drift_notes, error_check
from sim.hardware import HardwareProfile

BUSY = 1.15  # a run this many times slower (or faster) than its profile prices it was not in the calibrated state


def fit_note(hardware: HardwareProfile | str) -> str | None:
    """Why claims that rest on `hardware`'s fitted numbers cannot be judged (None when they can): a
    calibrated profile fitted while the machine was unsteady (`serving_lab.calibrate.unsteady_fit`)."""
    profile = hardware if isinstance(hardware, HardwareProfile) else HardwareProfile.named(hardware)
    return unsteady_fit(profile)


def machine_note(hardware: HardwareProfile | str, *, rows: Iterable[dict[str, Any]] = (),
                 slowdowns: Iterable[float] = (), busy: float = BUSY) -> str | None:
    """Why claims about measured runs cannot be judged (None when they can). First the profile's
    `fit_note`: a run's slowdown is measured against the profile, so against an unsteady fit it says
    nothing. Then each slowdown: the `slowdown` and `prefill_slowdown` columns of the measured `rows`
    (`drift_notes`) and the given `slowdowns`
    (measured / priced time, see `machine_slowdown`); one beyond `busy` either way means the machine was
    busy, or faster than when it was calibrated, while that run was measured (`drift_note`)."""
    note = fit_note(hardware)
    if note:
        return note
    measured = [drift_notes(r, busy) for r in rows if r.get("side") == "measured" and "slowdown" in r]
    return next((n for n in [*measured, *(drift_note(s, busy) for s in slowdowns)] if n), None)


def timing_claim(condition: bool, what: str, unsteady: str | None) -> None:
    """Assert `condition`, the claim `what`, unless `unsteady` says why the machine was not steady; then
    print so and skip."""
    if unsteady:
        print(f"machine unsteady: {unsteady}; skipping this timing claim ({what})")
        return
    assert condition, what


def error_claim(rows: Iterable[dict[str, Any]], fields: Iterable[str], hardware: HardwareProfile | str, *,
                tolerance_pct: float = 35.0, busy: float = BUSY) -> None:
    """Every (measured, simulated) pair of `rows` has each of `fields` simulated within `tolerance_pct` of
    measured (`error_check`), as a timing claim: all pairs are skipped when the profile was fitted on an
    unsteady machine, and each pair whose run was slowed (or sped up) beyond `busy` is skipped on its own,
    loudly."""
    fields = list(fields)
    what = f"simulated {', '.join(fields)} within {tolerance_pct:g}% of measured"
    unsteady = fit_note(hardware)
    if unsteady:
        timing_claim(True, what, unsteady)
        return
    problems, skipped = error_check(rows, fields, tolerance_pct, busy)
    for line in skipped:
        print(f"machine unsteady: {line}; skipping this timing claim ({what})")
    assert not problems, problems
