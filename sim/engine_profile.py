"""Engine profiles: what a serving engine's own software adds to every step, beyond the device's work.

This module owns the difference between engines that run the same kernels on the same GPU. The GPU profiles
(sim/hardware.py) were fitted to TensorRT-LLM's published rows (benchmarks/published.py), so whatever
TensorRT-LLM spends per step is already inside their fitted terms. Another engine pays its own CPU time per
step: scheduling, preparing inputs, sampling, processing outputs, and the launch gaps that CUDA graphs and
asynchronous scheduling hide only in part. That time is the engine's, not the device's, so it is modelled as an
engine profile added to every step's price (`Simulator(engine="vllm")`), not as a refit of the hardware.

- "vllm": vLLM V1 (0.19.1), `step_overhead_s` fitted by `python -m benchmarks.vllm_published --fit-engine` on the
  two rows marked `engine_fit` in benchmarks/vllm_published_rows.json (Llama-3.1-8B on one H100 at
  concurrency 1 and a 256-token prompt, BF16 and FP8 KV: there a decode step is the weights' read plus this
  overhead and nothing else, so the fit is the mean of published minus simulated inter-token latency). Every
  other vLLM row is held out; RESULTS.md ("vllm-published") gives both columns.

- "vllm-v0": vLLM's V0 engine (the LLM class, 0.5.1 to 0.6.1), `step_overhead_s` derived by
  `python -m benchmarks.fit_by_source` on its candidate H100 (benchmarks/gpu_fit_by_source.json, combine
  "kernels", TensorRT-LLM's per-step time taken out) from the five rows marked `engine_fit` with this profile:
  Argonne's LLM-Inference-Bench, Llama-3-8B on one H100, `benchmark_latency` at batch 1, 128/128 to 2048/2048
  tokens (a source independent of the vLLM rows it prices). Each row's every step is one sequence's, so its
  published minus simulated latency over its output length is the CPU time per step; the constant is the mean of
  the five (2.57 to 2.63 ms each). It prices the other V0 rows, held out from it; none of them is its source.

Not modelled: how the overhead grows with the batch (per-request input preparation and sampling), an API server
in the engine's process (vLLM before 0.6.0 served from one process: the "vllm-v0" rows are the LLM class, with no
server), and an all-reduce that vLLM's custom kernel makes cheaper than TensorRT-LLM's fitted one.

Lesson: lessons/06-architecture-map.md (the engine loop around the model); lessons/07-tuning-knobs.md.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineProfile:
    """A serving engine's CPU time per step that no GPU work hides, and where the number comes from."""

    name: str
    step_overhead_s: float
    source: str


ENGINE_PROFILES = {
    "vllm": EngineProfile("vllm", 1.1503e-3, "vLLM 0.19.1: fitted on two concurrency-1 H100 rows of the vLLM blog's "
                          "FP8 KV-cache post (2026-04-22); benchmarks/vllm_published.py --fit-engine"),
    "vllm-v0": EngineProfile("vllm-v0", 2.608e-3, "vLLM V0 (LLM class, 0.5.1 to 0.6.1): derived on five batch-1 "
                             "Llama-3-8B H100 rows of Argonne's LLM-Inference-Bench (arXiv 2411.00136) on the "
                             "by-source candidate H100; python -m benchmarks.fit_by_source"),
}


def resolve_engine(engine: str | EngineProfile | None) -> EngineProfile | None:
    """None (the hardware profile as fitted or calibrated), a known name, or a profile of your own."""
    if engine is None or isinstance(engine, EngineProfile):
        return engine
    if engine not in ENGINE_PROFILES:
        raise ValueError(f"unknown engine profile {engine!r}; known: {', '.join(ENGINE_PROFILES)} (or None: the "
                         "hardware profile's own engine)")
    return ENGINE_PROFILES[engine]
