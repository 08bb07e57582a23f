"""Serving Lab's minimal real engine: `LLM(...).generate(prompts, SamplingParams(...))`, vLLM-style.

The names below are imported lazily, so that importing one part (the tokenizer, a loader) does not build the
whole engine first. The policies the engine runs are in `core` (torch-free, shared with the simulator).
"""

from importlib import import_module
from typing import Any

_EXPORTS = {
    "LLM": "ref_engine.engine",
    "LLMEngine": "ref_engine.engine",
    "CompletionOutput": "ref_engine.outputs",
    "RequestOutput": "ref_engine.outputs",
    "SamplingParams": "ref_engine.sampling_params",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'ref_engine' has no attribute {name!r}")
