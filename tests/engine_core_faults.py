"""An engine core whose sampler raises for one kind of request, for the AsyncLLM and server tests. It lives
in a module of its own (at tests/, on every test's path) because the spawned engine-core process imports
it by name to unpickle `PoisonedEngineArgs`.

A request with `min_p=POISON_MIN_P` makes the batched sampler raise, as a bug in a logits processor would;
the engine must pin the error on that request and keep the others going. A request with
`min_p=SLOW_MIN_P` makes every step it is in take SLOW_STEP_S longer, as a big model's steps would: a test
that must act while requests still run (a client hanging up) gets that time on a busy machine too.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ref_engine.engine import LLMEngine
from ref_engine.engine_core.core import EngineCoreArgs
from ref_engine.sampler import Sampler, SamplerOutput, SamplingMetadata

POISON_MIN_P = 0.125
SLOW_MIN_P = 0.0625
SLOW_STEP_S = 0.02


class PoisonedSampler(Sampler):
    def __call__(self, logits: torch.Tensor, meta: SamplingMetadata) -> SamplerOutput:
        if meta.min_p is not None and bool((meta.min_p == POISON_MIN_P).any()):
            raise RuntimeError("injected: the sampler broke on this request")
        if meta.min_p is not None and bool((meta.min_p == SLOW_MIN_P).any()):
            time.sleep(SLOW_STEP_S)
        return super().__call__(logits, meta)


@dataclass
class PoisonedEngineArgs(EngineCoreArgs):
    def create_engine(self) -> LLMEngine:
        engine = super().create_engine()
        engine.sampler = PoisonedSampler(engine.config.seed, engine.device)
        return engine
