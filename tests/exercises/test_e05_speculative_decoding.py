"""Checks for lesson 5's exercises; `impl` is the reference or your stub (see conftest.py).

E05.1 runs your prompt lookup and the engine's `ngram_lookup` on the same contexts. E05.2 compares your
expected tokens per verify step with what the simulator counts at that acceptance rate (within four
standard errors), and your speed-up with the ratio of those tokens to the step's cost.
"""

from __future__ import annotations

import math
from statistics import fmean, pstdev

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core import EngineConfig, Workload
from ref_engine.spec_decode import ngram_lookup
from sim import Simulator
from sim.spec_decode import AcceptanceRate

FEW = settings(max_examples=200, deadline=None, derandomize=True)


# ---- E05.1 -------------------------------------------------------------------------------------------

def test_e05_1_examples(impl):
    assert impl.prompt_lookup([1, 2, 3, 4, 1, 2], k=2, n_min=1, n_max=3) == [3, 4]
    assert impl.prompt_lookup([1, 2, 3, 4], k=3, n_min=1, n_max=3) == []
    assert impl.prompt_lookup([1, 2, 3, 9, 2, 3, 7, 2, 3], k=5, n_min=2, n_max=2) == [7, 2, 3]  # most recent
    assert impl.prompt_lookup([5, 1, 2, 9, 1, 2, 3, 8, 1, 2, 3], k=1, n_min=1, n_max=3) == [8]  # longest
    assert impl.prompt_lookup([7, 8, 7, 8], k=4, n_min=3, n_max=4) == []  # only 2 tokens recur


@FEW
@given(st.lists(st.integers(0, 4), min_size=1, max_size=60), st.integers(1, 6), st.integers(1, 4),
       st.integers(0, 3))
def test_e05_1_matches_the_engines_proposer(impl, tokens, k, n_min, extra):
    n_max = n_min + extra
    assert impl.prompt_lookup(tokens, k, n_min, n_max) == ngram_lookup(tokens, k, n_min, n_max)


# ---- E05.2 -------------------------------------------------------------------------------------------

def test_e05_2_by_hand(impl):
    assert impl.expected_tokens_per_step(0.0, 4) == pytest.approx(1.0)
    assert impl.expected_tokens_per_step(1.0, 4) == pytest.approx(5.0)
    assert impl.expected_tokens_per_step(0.5, 2) == pytest.approx(1.75)
    assert impl.speedup(0.8, 4, 0.05) == pytest.approx((1 - 0.8**5) / 0.2 / 1.2)
    assert impl.speedup(0.0, 5, 0.1) < 1  # nothing accepted: the draft's passes are pure loss


@pytest.mark.parametrize("a, k", [(0.4, 3), (0.7, 5), (0.9, 2)])
def test_e05_2_matches_the_simulator(impl, a, k):
    config = EngineConfig(speculative_method="ngram", num_speculative_tokens=k)
    metrics = Simulator("smollm2-135m", "local-cpu", config, acceptance=AcceptanceRate((a,), seed=3)).run(
        Workload.synthetic(4, prompt_len=16, output_len=500, seed=1))
    emitted = [accepted + 1 for s in metrics.steps for _, drafted, accepted in s.verified if drafted == k]
    tolerance = 4 * pstdev(emitted) / math.sqrt(len(emitted))
    assert impl.expected_tokens_per_step(a, k) == pytest.approx(fmean(emitted), abs=tolerance)
    assert impl.speedup(a, k, 0.0) == pytest.approx(impl.expected_tokens_per_step(a, k))
