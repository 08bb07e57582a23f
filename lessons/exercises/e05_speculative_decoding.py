"""Exercises of lesson 5, "Speculative decoding": E05.1 and E05.2.

Write the bodies below, then check them from the repository root:

    pytest tests/exercises/test_e05_speculative_decoding.py --impl=learner          # both exercises
    pytest tests/exercises/test_e05_speculative_decoding.py --impl=learner -k e05_2 # one

The tests check E05.1 against the engine's n-gram proposer (`ref_engine.spec_decode.ngram_lookup`) on
random and hand-made contexts, and E05.2 against the simulator: tokens per verify step counted over
thousands of simulated steps at a given acceptance rate. Reference solutions:
lessons/exercises/solutions/e05_speculative_decoding.py.

Lesson: lessons/05-speculative-decoding.md#exercises
"""

from __future__ import annotations

from collections.abc import Sequence


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
