"""Lesson 3's experiment: prefill/decode disaggregation, measured on a real 1P+1D pair and simulated.

`disaggregation_vs_simulated` serves token prompts through `DisaggregatedLLM` (a prefill and a decode
engine process, the shared-memory KV connector), fits the KV link of that very run (`KVLink.fit`:
seconds = latency + bytes / bandwidth over its requests), then simulates the same workload on the
simulator's `Cluster` with one prefill and one decode replica joined by that link. The rows compare mean
TTFT and ITL (the simulated row with `*_err_pct`), beside the measured prefill / transfer / decode split.

The fitted link is this machine's shared memory plus the router's relay of a small message, so it is fast
next to a real network; the simulated TTFT then hinges on the step times the profile predicts, which a
busy machine (other processes on the cores) stretches. Each engine runs one torch thread, so a profile
calibrated with more threads prices its steps too fast: price the pair with
`serving_lab.calibrate.load_or_calibrate(model, threads=1)`.

Lesson: lessons/03-chunked-prefill-and-disaggregation.md#disaggregation
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from statistics import fmean, linear_regression
from typing import Any

from ref_engine.core.config import EngineConfig
from ref_engine.core.metrics import relative_error
from ref_engine.core.workload import Workload
from serving_lab.pairing import Sides
from sim.cluster import Cluster
from sim.hardware import dtype_bytes


@dataclass(frozen=True)
class KVLink:
    """A KV link as the simulator's `Cluster` takes it (`kv_link_bandwidth`, `kv_link_latency_s`)."""

    bandwidth: float  # bytes/s
    latency_s: float

    @classmethod
    def fit(cls, num_bytes: list[int], seconds: list[float]) -> KVLink:
        """Least squares of seconds = latency + bytes / bandwidth. When the transfers cannot tell the two apart
        (one size only, or time not growing with bytes), all the time is charged to bandwidth."""
        if len(set(num_bytes)) > 1:
            slope, intercept = linear_regression(num_bytes, seconds)
            if slope > 0 and intercept >= 0:
                return cls(1 / slope, intercept)
        return cls(sum(num_bytes) / sum(seconds), 0.0)


def disaggregation_vs_simulated(prompts: list[list[int]], sides: Sides, *, model: str | Path | None = None,
                                output_len: int = 16, config: EngineConfig | None = None,
                                dtype: str = "float32") -> list[dict[str, Any]]:
    """[measured row, simulated row] for `prompts` (token ids, all arriving at once, `output_len` tokens
    each, greedy) on a 1P+1D pair: `model` (a path; None: SmolLM2) in the engine processes, priced by
    `sides` (hardware, arch, dtype) in the simulator. `config` serves both engines, as in `Cluster`. Both
    rows carry `mean_transfer_ms` and `transfer_bytes` (the simulator moves every prompt token's K/V, the
    engine all but the last token's, in whole blocks)."""
    from ref_engine.disagg import DisaggregatedLLM
    from ref_engine.sampling_params import SamplingParams

    config = config or EngineConfig()
    params = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)
    with DisaggregatedLLM(model, config, config, dtype=dtype) as llm:
        llm.generate(prompts[0][:8], SamplingParams(max_tokens=2))  # warm-up: first-call costs, not measured
        timings = [out.disagg_timings for out in llm.generate(prompts, params)]
    link = KVLink.fit([t.transfer_bytes for t in timings], [t.transfer_s for t in timings])
    cluster = Cluster(sides.simulated_arch(), sides.hardware, config, num_prefill_replicas=1,
                      num_decode_replicas=1, kv_link_bandwidth=link.bandwidth, kv_link_latency_s=link.latency_s,
                      dtype=sides.dtype or dtype)
    simulated = cluster.run(Workload.from_token_ids(prompts, output_len))
    cost_model = cluster.simulator.cost_model
    labels = {"kv_link_gb_per_s": link.bandwidth / 1e9, "kv_link_latency_ms": link.latency_s * 1000}
    measured = {**labels, "side": "measured",
                "mean_ttft_ms": 1000 * fmean(t.ttft_s for t in timings),
                "mean_itl_ms": 1000 * fmean(gap for t in timings for gap in t.itl_s),
                "mean_prefill_ms": 1000 * fmean(t.prefill_s for t in timings),
                "mean_transfer_ms": 1000 * fmean(t.transfer_s for t in timings),
                "mean_decode_ms": 1000 * fmean(t.decode_s for t in timings),
                "transfer_bytes": sum(t.transfer_bytes for t in timings)}
    simulated_row = {**labels, "side": "simulated", "mean_ttft_ms": simulated.mean_ttft_ms,
                     "mean_itl_ms": simulated.mean_itl_ms,
                     "mean_transfer_ms": 1000 * fmean(cost_model.kv_transfer_time(len(p)) for p in prompts),
                     "transfer_bytes": sum(len(p) for p in prompts)
                     * sides.simulated_arch().kv_bytes_per_token(dtype_bytes(cost_model.kv_cache_dtype))}
    for key in ("mean_ttft_ms", "mean_itl_ms"):
        simulated_row[f"{key}_err_pct"] = relative_error(simulated_row[key], measured[key])
    return [measured, simulated_row]
