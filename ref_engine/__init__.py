"""Serving Lab's minimal real engine: `LLM(...).generate(prompts, SamplingParams(...))`, vLLM-style.

The names below are imported lazily, so `ref_engine.core` and `ref_engine.model.arch_config` (which the
simulator uses) load without torch.
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
