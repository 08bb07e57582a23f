"""The all-reduce fit on hand-made timings, and the inputs a measurement refuses before it spawns anything.
(The measurement itself spawns processes for seconds; benchmarks/allreduce.py runs it.)"""

from __future__ import annotations

import pytest

from core.arch_config import ArchConfig
from ref_engine.distributed.parallel_state import worker_threads
from serving_lab.collectives import (
    AllReduceFit,
    AllReduceTiming,
    activation_sizes,
    fit_allreduce,
    measure_allreduce,
    ring_factor,
)


def test_the_fit_recovers_latency_and_bus_bandwidth():
    # 3 ranks: 2 (3 - 1) / 3 = 4/3 of each buffer crosses the link; 300 us + 4/3 * bytes / 2 GB/s
    timings = [AllReduceTiming(3, n, 3e-4 + 4 / 3 * n / 2e9) for n in (4096, 147456, 1 << 20, 4 << 20)]
    fit = fit_allreduce(timings)
    assert fit.world_size == 3
    assert fit.latency_s == pytest.approx(3e-4, rel=1e-9) and fit.bus_bandwidth == pytest.approx(2e9, rel=1e-9)
    assert fit.mean_abs_error_pct == pytest.approx(0.0, abs=1e-6)
    assert fit.time(3 << 20) == pytest.approx(3e-4 + 4 / 3 * (3 << 20) / 2e9)


def test_the_fit_refuses_what_it_cannot_fit():
    with pytest.raises(ValueError, match="one world size at a time"):
        fit_allreduce([AllReduceTiming(2, 4096, 1e-4), AllReduceTiming(3, 8192, 2e-4)])
    with pytest.raises(ValueError, match="at least two sizes"):
        fit_allreduce([AllReduceTiming(2, 4096, 1e-4), AllReduceTiming(2, 4096, 2e-4)])
    with pytest.raises(ValueError, match="do not grow with size"):
        fit_allreduce([AllReduceTiming(2, 4096, 2e-4), AllReduceTiming(2, 1 << 20, 1e-4)])


def test_sizes_threads_and_the_ring():
    assert activation_sizes(ArchConfig.named("smollm2-135m"), [1, 16, 64, 512]) == [2304, 36864, 147456, 1179648]
    assert worker_threads(3, cores=2) == 1 and worker_threads(2, cores=8) == 4
    assert ring_factor(2) == 1.0 and ring_factor(4) == 1.5
    assert AllReduceFit(2, 1e-4, 1e9).time(1e6) == pytest.approx(1e-4 + 1e-3)


@pytest.mark.parametrize("kwargs, message", [
    ({"world_sizes": [1]}, "at least 2 processes"),
    ({"world_sizes": [2, 2]}, "distinct"),
    ({"world_sizes": [2], "sizes": [4096, 6]}, "multiples of 4 bytes"),
    ({"world_sizes": [2], "repeats": 0}, "repeats must be at least 1"),
])
def test_bad_measurements_are_refused_before_spawning(kwargs, message):
    with pytest.raises(ValueError, match=message):
        measure_allreduce(**kwargs)
