"""The sampler: greedy, the processed distribution (temperature, top-k, top-p, min-p), per-request seeds,
min_tokens bans and raw logprobs.

Everything random here runs under fixed seeds, so each test is deterministic: a distribution test either
always passes or always fails.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ref_engine.sampler import (
    Sampler,
    SamplingMetadata,
    make_generator,
    softmax_probs,
)
from ref_engine.sampling_params import SamplingParams

EOS = 2


def sample(
    sampler: Sampler,
    logits: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator | None] | None = None,
    num_output_tokens: list[int] | None = None,
):
    meta = SamplingMetadata.build(
        params,
        generators if generators is not None else [None] * len(params),
        num_output_tokens if num_output_tokens is not None else [0] * len(params),
        eos_token_ids={EOS},
        device="cpu",
    )
    return sampler(logits, meta)


# ---- goodness of fit ----

# Upper-tail critical values of the chi-square distribution at p = 0.001, by degrees of freedom. A test
# passes when the statistic is below the value, i.e. when p > 0.001: a correct sampler fails with
# probability 0.1% per test, and with the fixed seeds below it passes deterministically.
CHI2_CRITICAL_P001 = {
    1: 10.828,
    2: 13.816,
    3: 16.266,
    4: 18.467,
    5: 20.515,
    6: 22.458,
    7: 24.322,
    8: 26.124,
    9: 27.877,
}


def assert_matches_distribution(tokens: torch.Tensor, expected: np.ndarray) -> None:
    """Chi-square goodness of fit of the sampled ids against `expected` (float64 probabilities)."""
    counts = np.bincount(tokens.numpy(), minlength=expected.size)
    support = expected > 0
    assert counts[~support].sum() == 0, f"sampled outside the support: {counts}"
    expected_counts = expected[support] * tokens.numel()
    assert expected_counts.min() >= 5, "too few draws for a chi-square test"
    statistic = ((counts[support] - expected_counts) ** 2 / expected_counts).sum()
    assert statistic < CHI2_CRITICAL_P001[int(support.sum()) - 1], (statistic, counts, expected_counts)


def softmax64(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


LOGITS_10 = np.array([2.0, 1.5, 1.2, 1.0, 0.5, 0.3, 0.0, -0.4, -0.8, -1.0])
NUM_DRAWS = 20_000


def draw_many(params: SamplingParams, logits: np.ndarray = LOGITS_10, seed: int = 0) -> torch.Tensor:
    """NUM_DRAWS independent draws: one step with NUM_DRAWS identical rows, no per-request seeds."""
    rows = torch.tensor(logits, dtype=torch.float32).repeat(NUM_DRAWS, 1)
    return sample(Sampler(seed=seed), rows, [params] * NUM_DRAWS).sampled_token_ids


@pytest.mark.parametrize("temperature", [0.7, 1.0, 1.5])
def test_temperature_sampling_matches_softmax_of_logits_over_t(temperature):
    tokens = draw_many(SamplingParams(temperature=temperature))
    assert_matches_distribution(tokens, softmax64(LOGITS_10 / temperature))


def test_top_k_sampling_matches_renormalized_top_k():
    tokens = draw_many(SamplingParams(temperature=1.0, top_k=4))
    expected = softmax64(LOGITS_10)
    expected[4:] = 0  # LOGITS_10 is sorted, so the top 4 are the first 4
    assert_matches_distribution(tokens, expected / expected.sum())


def test_top_p_sampling_matches_renormalized_nucleus():
    top_p = 0.8
    probs = softmax64(LOGITS_10)  # sorted descending already
    mass_above = np.cumsum(probs) - probs
    assert np.abs(mass_above - top_p).min() > 1e-3, "fixture too close to the nucleus boundary"
    expected = np.where(mass_above < top_p, probs, 0.0)
    assert 2 < (expected > 0).sum() < 10  # the filter really cuts something
    tokens = draw_many(SamplingParams(temperature=1.0, top_p=top_p))
    assert_matches_distribution(tokens, expected / expected.sum())


def test_min_p_sampling_matches_renormalized_survivors():
    min_p = 0.2
    probs = softmax64(LOGITS_10)
    expected = np.where(probs >= min_p * probs.max(), probs, 0.0)
    assert 2 < (expected > 0).sum() < 10
    tokens = draw_many(SamplingParams(temperature=1.0, min_p=min_p))
    assert_matches_distribution(tokens, expected / expected.sum())


def test_seeded_rows_also_match_the_distribution():
    """The per-row generator path: 100 seeded requests x 200 steps = 20k draws."""
    params = SamplingParams(temperature=0.9, top_k=6)
    generators = [make_generator(seed) for seed in range(100)]
    logits = torch.tensor(LOGITS_10, dtype=torch.float32).repeat(100, 1)
    sampler = Sampler()
    tokens = torch.cat(
        [sample(sampler, logits, [params] * 100, generators).sampled_token_ids for _ in range(200)]
    )
    expected = softmax64(LOGITS_10 / 0.9)
    expected[6:] = 0
    assert_matches_distribution(tokens, expected / expected.sum())


# ---- filters never emit a masked token ----


def reference_allowed(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Tokens the filters may keep, computed independently in float64.

    Deliberately permissive at the boundaries (ties and float32 rounding may fall either way), so the
    property below checks "never emits a clearly masked token".
    """
    scaled = logits / params.temperature
    allowed = np.ones(scaled.size, dtype=bool)
    if params.top_k > 0:
        kth = np.sort(scaled)[::-1][min(params.top_k, scaled.size) - 1]
        allowed &= scaled >= kth - 1e-4 * (1 + abs(kth))
    if params.top_p < 1:
        probs = np.where(allowed, softmax64(scaled), 0.0)
        probs /= probs.sum()
        for token in np.flatnonzero(allowed):
            clearly_more_likely = probs > probs[token] * (1 + 1e-4) + 1e-12
            allowed[token] = probs[clearly_more_likely].sum() < params.top_p + 1e-4
    if params.min_p > 0:
        ratio_to_max = np.exp(scaled - scaled.max())
        allowed &= ratio_to_max >= params.min_p * (1 - 1e-4) - 1e-30
    return allowed


@settings(max_examples=150, deadline=None, derandomize=True)
@given(data=st.data())
def test_filters_never_emit_a_masked_token(data):
    vocab_size = data.draw(st.integers(2, 24), label="vocab_size")
    logits = np.array(
        data.draw(st.lists(st.floats(-20, 20, width=32), min_size=vocab_size, max_size=vocab_size)),
        dtype=np.float64,
    )
    params = SamplingParams(
        temperature=data.draw(st.floats(0.05, 3.0), label="temperature"),
        top_k=data.draw(st.integers(-1, vocab_size + 2), label="top_k"),
        top_p=data.draw(st.floats(0.01, 1.0), label="top_p"),
        min_p=data.draw(st.floats(0.0, 1.0), label="min_p"),
    )
    allowed = reference_allowed(logits, params)
    logits_t = torch.tensor(logits, dtype=torch.float32)

    probs = softmax_probs(logits_t, params)
    assert torch.all(probs[torch.from_numpy(~allowed)] == 0)
    assert probs[logits_t.argmax()] > 0  # the most likely token always survives
    assert probs.sum().item() == pytest.approx(1.0, abs=1e-5)

    tokens = sample(Sampler(seed=1), logits_t.repeat(256, 1), [params] * 256).sampled_token_ids
    assert allowed[tokens.numpy()].all()


def test_softmax_probs_on_a_worked_example():
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    cases = [
        (SamplingParams(top_k=2), [0.625, 0.375, 0, 0]),
        (SamplingParams(top_p=0.85), [0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0]),
        (SamplingParams(min_p=0.2), [0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0]),  # keeps p >= 0.1
        (SamplingParams(top_k=3, top_p=0.6), [0.5 / 0.8, 0.3 / 0.8, 0, 0]),  # nucleus of the top-3
        (SamplingParams(temperature=0), [1, 0, 0, 0]),
    ]
    for params, probs in cases:
        assert softmax_probs(logits, params).tolist() == pytest.approx(probs, abs=1e-6), params


def test_softmax_probs_takes_one_row_or_many():
    logits = torch.randn(3, 12, generator=torch.Generator().manual_seed(0))
    params = SamplingParams(temperature=0.8, top_p=0.9)
    batched = softmax_probs(logits, params)
    assert batched.shape == (3, 12)
    for row in range(3):
        assert torch.equal(softmax_probs(logits[row], params), batched[row])


def test_ties_at_the_top_k_boundary_are_all_kept():
    logits = torch.tensor([3.0, 1.0, 1.0, 0.0])
    assert (softmax_probs(logits, SamplingParams(top_k=2)) > 0).tolist() == [True, True, True, False]


# ---- greedy ----


def test_greedy_rows_take_the_argmax_in_a_mixed_batch():
    logits = torch.randn(8, 50, generator=torch.Generator().manual_seed(3))
    greedy = SamplingParams(temperature=0, top_k=5, top_p=0.1)  # filters do not matter when greedy
    params = [greedy if row % 2 == 0 else SamplingParams(temperature=1.5) for row in range(8)]
    tokens = sample(Sampler(), logits, params).sampled_token_ids
    assert tokens.dtype == torch.int64
    assert torch.equal(tokens[::2], logits[::2].argmax(dim=-1))


def test_greedy_breaks_ties_towards_the_lowest_id():
    logits = torch.tensor([[0.0, 5.0, 1.0, 5.0]])
    assert sample(Sampler(), logits, [SamplingParams(temperature=0)]).sampled_token_ids.item() == 1


def test_sampler_does_not_modify_its_input():
    logits = torch.randn(4, 30, generator=torch.Generator().manual_seed(5))
    before = logits.clone()
    params = [SamplingParams(temperature=0.5, top_k=3, top_p=0.8, min_p=0.1, min_tokens=2)] * 4
    sample(Sampler(), logits, params)
    assert torch.equal(logits, before)


# ---- seeds ----


def run_steps(
    sampler: Sampler,
    logits_per_step: list[torch.Tensor],
    params: list[SamplingParams],
    row: int,
) -> list[int]:
    """Decode len(logits_per_step) steps; each request gets a generator from its seed once, up front."""
    generators = [make_generator(p.seed) if p.seed is not None else None for p in params]
    tokens = []
    for step, logits in enumerate(logits_per_step):
        out = sample(sampler, logits, params, generators, num_output_tokens=[step] * len(params))
        tokens.append(out.sampled_token_ids[row].item())
    return tokens


def test_a_seed_gives_the_same_tokens_alone_and_in_any_batch():
    vocab_size, num_steps = 64, 60
    logits_rng = torch.Generator().manual_seed(7)
    batch_logits = [3 * torch.randn(5, vocab_size, generator=logits_rng) for _ in range(num_steps)]
    target = SamplingParams(temperature=0.9, top_k=40, top_p=0.95, seed=1234, max_tokens=num_steps)
    neighbours = [
        SamplingParams(seed=1),
        SamplingParams(),  # no seed: draws from the sampler-wide stream
        SamplingParams(temperature=0),
        SamplingParams(top_p=0.5, min_p=0.05, seed=99, min_tokens=10, max_tokens=20),
    ]

    alone = run_steps(Sampler(seed=0), [logits[3:4] for logits in batch_logits], [target], row=0)
    in_batch = run_steps(Sampler(seed=555), batch_logits, neighbours[:3] + [target] + neighbours[3:], row=3)
    assert alone == in_batch

    other_seed = SamplingParams(temperature=0.9, top_k=40, top_p=0.95, seed=4321)
    assert run_steps(Sampler(seed=0), [logits[3:4] for logits in batch_logits], [other_seed], row=0) != alone


def test_unseeded_rows_are_reproducible_from_the_sampler_seed():
    logits = torch.randn(6, 40, generator=torch.Generator().manual_seed(11))
    params = [SamplingParams(temperature=1.2)] * 6

    def tokens(seed: int) -> list[list[int]]:
        sampler = Sampler(seed=seed)
        return [sample(sampler, logits, params).sampled_token_ids.tolist() for _ in range(20)]

    assert tokens(0) == tokens(0)
    assert tokens(0) != tokens(1)


# ---- min_tokens ----


def test_min_tokens_bans_eos_and_stop_ids_until_reached():
    logits = torch.zeros(1, 10)
    logits[0, [EOS, 5, 7]] = torch.tensor([9.0, 8.0, 7.0])  # EOS, then the stop id, then token 7
    params = [SamplingParams(temperature=0, min_tokens=3, stop_token_ids=[5])]
    sampler = Sampler()
    produced = [
        sample(sampler, logits, params, num_output_tokens=[n]).sampled_token_ids.item() for n in range(5)
    ]
    assert produced == [7, 7, 7, EOS, EOS]

    logits[0, 5] = 10.0  # now the stop id is the argmax
    assert sample(sampler, logits, params, num_output_tokens=[2]).sampled_token_ids.item() == 7
    assert sample(sampler, logits, params, num_output_tokens=[3]).sampled_token_ids.item() == 5


def test_ignore_eos_lets_eos_through_but_still_bans_stop_ids():
    logits = torch.zeros(1, 10)
    logits[0, [EOS, 5, 7]] = torch.tensor([9.0, 10.0, 7.0])
    params = SamplingParams(temperature=0, min_tokens=3, stop_token_ids=[5], ignore_eos=True)
    assert sample(Sampler(), logits, [params]).sampled_token_ids.item() == EOS


def test_min_tokens_bans_hold_for_random_rows():
    logits = torch.zeros(2000, 10)
    params = [SamplingParams(temperature=1.0, min_tokens=1, stop_token_ids=[5])] * 2000
    before = sample(Sampler(), logits, params, num_output_tokens=[0] * 2000).sampled_token_ids
    assert not torch.isin(before, torch.tensor([EOS, 5])).any()
    after = sample(Sampler(), logits, params, num_output_tokens=[1] * 2000).sampled_token_ids
    assert torch.isin(torch.tensor([EOS, 5]), after).all()


def test_metadata_lists_banned_ids_only_for_rows_short_of_min_tokens():
    params = [
        SamplingParams(min_tokens=2, stop_token_ids=[9, 4]),
        SamplingParams(min_tokens=2, stop_token_ids=[9, 4]),
        SamplingParams(min_tokens=2, ignore_eos=True),
        SamplingParams(),
    ]
    meta = SamplingMetadata.build(params, [None] * 4, [1, 2, 0, 0], eos_token_ids={EOS, 3}, device="cpu")
    assert meta.banned_token_ids == [[EOS, 3, 4, 9], [], [], []]


# ---- logprobs ----


def test_logprobs_are_the_raw_log_softmax_with_sorted_top_n():
    logits = torch.randn(4, 20, generator=torch.Generator().manual_seed(2))
    params = [
        SamplingParams(logprobs=None),
        SamplingParams(temperature=0, logprobs=0),
        SamplingParams(temperature=0.3, top_k=3, logprobs=3, min_tokens=1, stop_token_ids=[0]),
        SamplingParams(temperature=2.0, logprobs=5),
    ]
    out = sample(Sampler(), logits, params)
    raw = torch.log_softmax(logits, dim=-1)

    rows = torch.arange(4)
    assert torch.allclose(out.logprobs, raw[rows, out.sampled_token_ids])
    values, ids = out.top_logprobs
    assert values.shape == ids.shape == (4, 5)  # N = the largest request; rows slice their own
    assert torch.all(values[:, :-1] >= values[:, 1:])
    assert torch.equal(ids, raw.argsort(dim=-1, descending=True)[:, :5])
    assert torch.allclose(values, raw.gather(-1, ids))
    # Raw means raw: the banned token 0 of row 2 still has its model logprob.
    assert values[2].tolist() == pytest.approx(raw[2].sort(descending=True).values[:5].tolist())
    assert math.isfinite(raw[2, 0].item())


def test_no_logprobs_unless_asked():
    logits = torch.randn(2, 10, generator=torch.Generator().manual_seed(4))
    none_asked = sample(Sampler(), logits, [SamplingParams()] * 2)
    assert none_asked.logprobs is None and none_asked.top_logprobs is None
    chosen_only = sample(Sampler(), logits, [SamplingParams(logprobs=0)] * 2)
    assert chosen_only.logprobs.shape == (2,) and chosen_only.top_logprobs is None


# ---- metadata ----


def test_metadata_leaves_out_filters_no_row_uses():
    meta = SamplingMetadata.build(
        [SamplingParams(top_k=-1), SamplingParams(temperature=0)], [None, None], [0, 0], {EOS}, "cpu"
    )
    assert meta.top_k is None and meta.top_p is None and meta.min_p is None
    assert meta.temperature.tolist() == [1.0, 1.0]
    assert meta.greedy.tolist() == [False, True] and not meta.all_greedy
    assert meta.max_num_logprobs is None

    meta = SamplingMetadata.build(
        [SamplingParams(top_k=5, logprobs=2), SamplingParams(top_p=0.5, logprobs=7)],
        [None] * 2,
        [0, 0],
        {EOS},
        "cpu",
    )
    assert meta.top_k.tolist() == [5, 0]
    assert meta.top_p.tolist() == [1.0, 0.5]
    assert meta.max_num_logprobs == 7


def test_metadata_rejects_mismatched_lengths():
    with pytest.raises(ValueError, match="one entry per row"):
        SamplingMetadata.build([SamplingParams()] * 2, [None], [0, 0], {EOS}, "cpu")
