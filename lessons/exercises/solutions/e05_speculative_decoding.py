"""Reference solutions of lesson 5's exercises (E05.1, E05.2). Try them yourself first.

E05.1 is the engine's own n-gram proposer (`ngram_lookup` in ref_engine/spec_decode.py). E05.2a is
Leviathan et al.'s Eq. 1, as the simulator computes it (`expected_tokens_per_step` in sim/spec_decode.py);
E05.2b divides it by the step's cost, 1 + k c target steps (their walltime improvement factor).

Lesson: lessons/05-speculative-decoding.md#exercises
"""

from __future__ import annotations

from collections.abc import Sequence

from ref_engine.spec_decode import ngram_lookup
from sim.spec_decode import expected_tokens_per_step

__all__ = ["expected_tokens_per_step", "prompt_lookup", "speedup"]


def prompt_lookup(token_ids: Sequence[int], k: int, n_min: int, n_max: int) -> list[int]:
    """E05.1: the engine's proposer."""
    return ngram_lookup(token_ids, k, n_min, n_max)


def speedup(acceptance_rate: float, k: int, draft_cost: float) -> float:
    """E05.2b: (1 - a^(k+1)) / ((1 - a)(1 + k c)): tokens per step over the step's cost in target steps."""
    return expected_tokens_per_step(acceptance_rate, k) / (1 + k * draft_cost)
