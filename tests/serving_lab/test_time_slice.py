"""serving_lab/time_slice.py: the OS's time slice, measured by two processes spinning on one core."""

from __future__ import annotations

import pytest

from serving_lab.time_slice import measure_time_slice


def test_two_processes_on_one_core_run_in_slices():
    slice_s = measure_time_slice(0.1)  # ~0.2 s
    # None only where the OS cannot pin a process; a slice is a scheduler tick or a few (1-10 ms on Linux)
    assert slice_s is None or 1e-4 < slice_s < 0.1


def test_spin_seconds_are_checked():
    with pytest.raises(ValueError, match="spin_seconds"):
        measure_time_slice(0)
