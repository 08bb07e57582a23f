"""Exercises of lesson 5, "Speculative decoding": E05.1 to E05.4.

Write the bodies below, then check them from the repository root:

    pytest tests/exercises/test_e05_speculative_decoding.py --impl=learner          # all four exercises
    pytest tests/exercises/test_e05_speculative_decoding.py --impl=learner -k e05_2 # one

The tests check E05.1 against the engine's n-gram proposer (`ref_engine.spec_decode.ngram_lookup`) on
random and hand-made contexts, and E05.2 against the simulator: tokens per verify step counted over
thousands of simulated steps at a given acceptance rate. E05.3 is checked by statistics (thousands of seeded
verifications: the emitted tokens must follow the target's distribution) and exactly on point masses. E05.4 is
a debug exercise: its code is written and has a bug, which its tests' traces expose. Reference solutions:
lessons/exercises/solutions/e05_speculative_decoding.py.

Lesson: lessons/05-speculative-decoding.md#exercises
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor


def prompt_lookup(token_ids: Sequence[int], k: int, n_min: int, n_max: int) -> list[int]:
    """E05.1 (implement): draft up to `k` tokens by prompt lookup.

    Take the context's last n tokens (its suffix n-gram) for the largest n in [n_min, n_max] that also
    occurs earlier in the context; among earlier occurrences of that n-gram, take the most recent one. Return
    the (up to) k tokens that followed it. Return [] when not even the last n_min tokens occur earlier.
    Example: context [1, 2, 3, 4, 1, 2], k=2, n in [1, 3]: the suffix [1, 2] occurred at the start, followed
    by [3, 4], so the draft is [3, 4].

    Interview questions: Q-SPEC-03 (lessons/interview-bank.md#q-spec-03).
    """
    raise NotImplementedError("E05.1: prompt lookup")


def expected_tokens_per_step(acceptance_rate: float, k: int) -> float:
    """E05.2 (estimate), part a: the mean number of tokens one verify step emits.

    Each of the k draft tokens is accepted with probability `acceptance_rate` = a, independently, and
    acceptance stops at the first rejection; the step always adds one token of the target's own (the
    correction at the first rejection, or the bonus token when all k are accepted). Derive the closed form
    by hand first (a geometric sum), then mind a = 1.
    """
    raise NotImplementedError("E05.2: expected tokens per verify step")


def speedup(acceptance_rate: float, k: int, draft_cost: float) -> float:
    """E05.2 (estimate), part b: speculative decoding's speed-up over plain decoding.

    Assume a verify step of 1 + k tokens costs the same as a plain decode step (memory-bound decode), and
    each of the k draft passes costs `draft_cost` (c) times a target step. Tokens per unit of target-step
    time, with speculation over without. Example to try by hand: a = 0.8, k = 4, c = 0.05.

    Interview questions: Q-SPEC-02 (lessons/interview-bank.md#q-spec-02).
    """
    raise NotImplementedError("E05.2: speed-up")


def rejection_sample(draft_token_ids: Sequence[int], draft_probs: Tensor | None, target_probs: Tensor,
                     generator: torch.Generator) -> list[int]:
    """E05.3 (implement): verify one request's k drafts by rejection sampling; return the tokens it emits.

    `draft_token_ids` are the k draft tokens; `draft_probs` [k, V] holds, row i, the distribution q_i that draft
    i was drawn from (None: every draft is a point mass on its token, as prompt lookup proposes);
    `target_probs` [k + 1, V] holds the target's distributions p_0 .. p_k at the same positions, the last one
    after all the drafts. Walk the drafts in order: accept draft x at position i with probability
    min(1, p_i(x) / q_i(x)); at the first rejection draw one token from the residual
    max(0, p_i - q_i) / sum(max(0, p_i - q_i)) and stop; if all k are accepted, draw a bonus token from p_k.
    Return the accepted drafts followed by that one token: between 1 and k + 1 tokens. Every random number
    (the uniforms and the draws) comes from `generator`. If the residual is all zeros (p_i equals q_i up to
    rounding, so a rejection was a rounding accident), draw from p_i instead.

    Example, V = 3, one draft x = 0 from a point mass, p_0 = [0.25, 0.75, 0]: accepted a quarter of the time
    (then a bonus token from p_1 follows); otherwise the residual is [0, 0.75, 0], so the token emitted is 1.

    Interview questions: Q-SPEC-01 (lessons/interview-bank.md#q-spec-01).
    """
    raise NotImplementedError("E05.3: rejection sampling of the drafts")


class SpeculativeDecoder:
    """E05.4 (debug): greedy speculation that changes the output, which it must never do.

    One request decoded speculatively over its own KV slots, as the engine serves it (lesson 5, "Why a verify
    step is nearly free"): slot p of `kv` holds the K/V computed at position p (here simply the token it was
    computed from; None for a slot never written), and `num_computed_tokens` counts the leading slots that hold
    the K/V of the request's own tokens. `verify` runs one step: the newest known token and the drafts after
    it, at the positions from `num_computed_tokens` on; the target reads the slots up to each row and returns
    its greedy next token there; the drafts are kept while they match it, and the target's token at the first
    mismatch (or after the last draft) is added. Then `num_computed_tokens` is moved back over the rejected
    drafts, whose slots the next step overwrites, as `Scheduler.update_from_output` (core/scheduler.py) does.

    Greedy verification is exact: whatever the drafts, the tokens must be those of plain decoding, `verify([])`
    at every step. They are not. `pytest tests/exercises --impl=learner -k e05_4` replays a trace where one
    draft is rejected and the next step emits tokens plain decoding never would, and random drafts that drift
    the same way. Find out from the traces which slots the target read, fix the bug here, and keep the
    signatures: the tests call them.

    Interview questions: Q-SPEC-05 (lessons/interview-bank.md#q-spec-05).
    """

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
        num_rejected = max(len(draft) - accepted - 1, 0)  # the first rejected slot now holds the correction
        self.num_computed_tokens = start + len(rows) - num_rejected
        return emitted
