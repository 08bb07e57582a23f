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

Not modelled: how the overhead grows with the batch (per-request input preparation and sampling), vLLM V0's
larger overhead (the pre-0.6.0 rows stay priced without one), and an all-reduce that vLLM's custom kernel makes
cheaper than TensorRT-LLM's fitted one.

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
}


def resolve_engine(engine: str | EngineProfile | None) -> EngineProfile | None:
    """None (the hardware profile as fitted or calibrated), a known name, or a profile of your own."""
    if engine is None or isinstance(engine, EngineProfile):
        return engine
    if engine not in ENGINE_PROFILES:
        raise ValueError(f"unknown engine profile {engine!r}; known: {', '.join(ENGINE_PROFILES)} (or None: the "
                         "hardware profile's own engine)")
    return ENGINE_PROFILES[engine]
