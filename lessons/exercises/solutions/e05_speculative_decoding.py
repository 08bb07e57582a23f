"""Reference solutions of lesson 5's exercises (E05.1 to E05.4). Try them yourself first.

E05.1 is the engine's own n-gram proposer (`ngram_lookup` in ref_engine/spec_decode.py). E05.2a is
Leviathan et al.'s Eq. 1, as the simulator computes it (`expected_tokens_per_step` in sim/spec_decode.py);
E05.2b divides it by the step's cost, 1 + k c target steps (their walltime improvement factor). E05.3 is the
engine's verifier (`RejectionSampler.verify_sampled`, Leviathan et al., ICML 2023, Algorithm 1; Chen et al.,
2023). E05.4 is the stub's code with its bug fixed.

Lesson: lessons/05-speculative-decoding.md#exercises
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from ref_engine.sampler import Sampler
from ref_engine.spec_decode import Draft, RejectionSampler, ngram_lookup
from sim.spec_decode import expected_tokens_per_step

__all__ = ["SpeculativeDecoder", "expected_tokens_per_step", "prompt_lookup", "rejection_sample", "speedup"]

_VERIFIER = RejectionSampler(Sampler())  # its own generator is unused: every call passes one


def prompt_lookup(token_ids: Sequence[int], k: int, n_min: int, n_max: int) -> list[int]:
    """E05.1: the engine's proposer."""
    return ngram_lookup(token_ids, k, n_min, n_max)


def speedup(acceptance_rate: float, k: int, draft_cost: float) -> float:
    """E05.2b: (1 - a^(k+1)) / ((1 - a)(1 + k c)): tokens per step over the step's cost in target steps."""
    return expected_tokens_per_step(acceptance_rate, k) / (1 + k * draft_cost)


def rejection_sample(draft_token_ids: Sequence[int], draft_probs: Tensor | None, target_probs: Tensor,
                     generator: torch.Generator) -> list[int]:
    """E05.3: the engine's verifier. Accepting x with probability min(1, p(x)/q(x)) emits y with probability
    min(p(y), q(y)); a rejection, with probability 1 - sum(min(p, q)), then draws y from the residual with
    probability max(0, p(y) - q(y)) / (1 - sum(min(p, q))). The two add up to p(y) (lesson 5's proof)."""
    return _VERIFIER.verify_sampled(Draft(list(draft_token_ids), draft_probs), target_probs, generator)


class SpeculativeDecoder:
    """E05.4 (debug), fixed: the step ran 1 + k rows and keeps the K/V of the newest token and of the
    `accepted` drafts, so it rolls back over all k - accepted rejected drafts. The stub kept the first rejected
    draft's slot, reasoning that the correction token goes to that position. The position is right, but the
    K/V in it was computed from the rejected draft, and counting it as computed means no step ever recomputes
    it: the next step wrote the correction one slot further on, the target read the rejected draft where the
    correction belongs, and from there the output drifted. (Plain steps and fully accepted drafts reject
    nothing, so they never showed it.) The core's line in `Scheduler.update_from_output` is
    `num_computed -= scheduled.num_draft_tokens + 1 - len(token_ids)`: the same count, since len(token_ids)
    is accepted + 1."""

    def __init__(self, prompt_token_ids: Sequence[int], target: Callable[[Sequence[int | None]], int],
                 num_slots: int) -> None:
        self.target = target  # the greedy next token after a context whose K/V are these slots
        self.token_ids = list(prompt_token_ids)  # the prompt, then every token emitted
        self.kv: list[int | None] = [None] * num_slots
        # the prefill: every prompt token but the newest, which the first step runs like any newest token
        self.num_computed_tokens = len(self.token_ids) - 1
        self.kv[:self.num_computed_tokens] = self.token_ids[:-1]

    def verify(self, draft: Sequence[int]) -> list[int]:
        """Run one step with these drafts (none: plain decoding) and return the tokens it emits."""
        start = self.num_computed_tokens
        rows = [self.token_ids[-1], *draft]
        if start + len(rows) > len(self.kv):
            raise ValueError(f"{start + len(rows)} KV slots needed, {len(self.kv)} allocated")
        self.kv[start:start + len(rows)] = rows  # the forward pass writes each row's K/V at its position
        predicted = [self.target(self.kv[:start + i + 1]) for i in range(len(rows))]
        accepted = 0
        while accepted < len(draft) and draft[accepted] == predicted[accepted]:
            accepted += 1
        emitted = [*draft[:accepted], predicted[accepted]]
        self.token_ids += emitted
        num_rejected = len(draft) - accepted  # from the first rejected draft on, every K/V followed a wrong token
        self.num_computed_tokens = start + len(rows) - num_rejected
        return emitted
