"""Checks for lesson 5's exercises; `impl` is the reference or your stub (see conftest.py).

E05.1 runs your prompt lookup and the engine's `ngram_lookup` on the same contexts. E05.2 compares your
expected tokens per verify step with what the simulator counts at that acceptance rate (within four
standard errors), and your speed-up with the ratio of those tokens to the step's cost. E05.3 verifies
thousands of seeded drafts: the emitted tokens' frequencies must be within four standard errors of the
target's distribution (and the acceptance rate of sum(min(p, q))), and point masses must give exact answers.
E05.4 (debug) decodes with drafts and without and compares, step by step: the committed stub fails, the fix
passes.
"""

from __future__ import annotations

import math
from statistics import fmean, pstdev

import pytest
import torch
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


# ---- E05.3 -------------------------------------------------------------------------------------------

# Two drafted positions over a 6-token vocabulary. q puts mass where p has none (tokens 4, 5) and too little
# where p has most (token 0), so the residual matters: drawing from p instead of it emits token 0 40% of the
# time, not 50%.
P = torch.tensor([[0.5, 0.3, 0.1, 0.1, 0.0, 0.0],
                  [0.1, 0.1, 0.2, 0.2, 0.2, 0.2],
                  [0.0, 0.0, 0.0, 0.0, 0.0, 1.0]])
Q = torch.tensor([[0.1, 0.1, 0.1, 0.2, 0.3, 0.2],
                  [0.4, 0.0, 0.0, 0.1, 0.1, 0.4]])
TRIALS = 4000


def within_four_standard_errors(tokens: list[int], p: torch.Tensor) -> None:
    n = len(tokens)
    for token, prob in enumerate(p.tolist()):
        freq = tokens.count(token) / n
        if prob == 0:
            assert freq == 0, f"token {token} has probability 0 under the target, yet {freq:.1%} of tokens were it"
        else:
            se = math.sqrt(prob * (1 - prob) / n)
            assert abs(freq - prob) <= 4 * se, (f"token {token}: emitted {freq:.3f} of {n} times, the target says "
                                                f"{prob:.3f} (tolerance: 4 standard errors, {4 * se:.3f})")


def test_e05_3_emits_the_targets_distribution(impl):
    drafter, verifier = torch.Generator().manual_seed(1), torch.Generator().manual_seed(2)
    runs = []
    for _ in range(TRIALS):
        draft = [int(torch.multinomial(q, 1, generator=drafter)) for q in Q]
        runs.append((draft, impl.rejection_sample(draft, Q, P, verifier)))
    assert all(1 <= len(out) <= 3 and out[:-1] == draft[:len(out) - 1] for draft, out in runs), \
        "emit the accepted drafts, then one token of the target's: 1 to k + 1 tokens"
    within_four_standard_errors([out[0] for _, out in runs], P[0])  # the first token follows p_0 ...
    # ... and, once the first draft is accepted, the second follows p_1 whatever was drafted there
    within_four_standard_errors([out[1] for draft, out in runs if len(out) > 1], P[1])
    accepted = sum(len(out) > 1 for _, out in runs) / TRIALS
    overlap = float(torch.minimum(P[0], Q[0]).sum())
    assert accepted == pytest.approx(overlap, abs=4 * math.sqrt(overlap * (1 - overlap) / TRIALS)), \
        "the first draft must be accepted with probability sum(min(p, q)) = 1 - TV(p, q)"


def point_mass(token: int, vocab: int = 6) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(token), vocab).float()


def test_e05_3_point_masses_are_exact(impl):
    g = torch.Generator().manual_seed(0)
    sure = torch.stack([point_mass(2), point_mass(4), point_mass(1)])  # the target is certain: 2, then 4, then 1
    for _ in range(20):
        assert impl.rejection_sample([2, 4], None, sure, g) == [2, 4, 1]  # all accepted, then the bonus
        assert impl.rejection_sample([2, 3], None, sure, g) == [2, 4]  # p(3) = 0: rejected, the residual is 4
        assert impl.rejection_sample([5, 4], None, sure, g) == [2]  # the first rejection stops the walk
        assert impl.rejection_sample([], None, sure[:1], g) == [2]  # no drafts: one token from p_0
    same = P[:2]  # q = p: min(1, p/q) = 1, so every draft is accepted and only the bonus is drawn
    for token in range(4):
        out = impl.rejection_sample([token], same[:1], same, g)
        assert out[0] == token and len(out) == 2 and out[1] in range(6)


# ---- E05.4 -------------------------------------------------------------------------------------------

VOCAB = 50


def toy_target(slots) -> int:
    """A deterministic 'model': its greedy next token depends on every slot it reads, position by position, so
    one stale or missing slot changes what it says."""
    h = 0
    for position, token in enumerate(slots):
        h = (h * 1_000_003 + (97 if token is None else token) * 31 + position) % (1 << 61)
    return h % VOCAB


def plain_decoding(prompt: list[int], num_tokens: int) -> list[int]:
    """Greedy decoding without drafts: each token from the K/V of exactly the tokens before it."""
    tokens = list(prompt)
    for _ in range(num_tokens):
        tokens.append(toy_target(tokens))
    return tokens[len(prompt):]


def replay(impl, prompt: list[int], drafts_per_step: list[list[bool]], num_tokens: int) -> None:
    """Decode with drafts: at each step, draft the true next tokens, wrong wherever the step's mask says False
    (the proposer knows plain decoding's answer; the mask decides where it errs). Checks every step."""
    expected = plain_decoding(prompt, num_tokens + 8)
    decoder = impl.SpeculativeDecoder(prompt, toy_target, num_slots=len(prompt) + num_tokens + 16)
    story = []
    for mask in drafts_per_step:
        done = len(decoder.token_ids) - len(prompt)
        if done >= num_tokens:
            break
        draft = [expected[done + i] if right else (expected[done + i] + 1) % VOCAB for i, right in enumerate(mask)]
        start = decoder.num_computed_tokens
        emitted = decoder.verify(draft)
        story.append(f"verify(draft {draft}) at positions from {start}: emitted {emitted}, num_computed_tokens -> "
                     f"{decoder.num_computed_tokens}, sequence {len(decoder.token_ids)} tokens")
        assert emitted == expected[done:done + len(emitted)], (
            f"speculation changed the output: plain decoding gives {expected[done:done + len(emitted)]}, this step "
            f"emitted {emitted}. Slots the target read: {decoder.kv[:start + len(draft) + 1]}\n"
            f"tokens:                 {decoder.token_ids}\n  " + "\n  ".join(story))


def test_e05_4_the_failing_trace(impl):
    """A 4-token prompt; the first step drafts three tokens and the third is wrong, then plain steps."""
    replay(impl, [11, 7, 3, 29], [[True, True, False], [], [], [True, True]], num_tokens=8)


@FEW
@given(st.lists(st.lists(st.booleans(), max_size=4), min_size=1, max_size=12), st.integers(0, 20))
def test_e05_4_random_drafts_never_change_the_output(impl, steps, first):
    replay(impl, [first, 3, 8], steps, num_tokens=30)
