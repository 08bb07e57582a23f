"""Speculative decoding on the real engine: exact greedy output, an exact sampled distribution, no leaks.

The tiny random Llama of test_engine.py (2 layers) is the target; "self:1" (its first layer) is the draft
model. Greedy output with speculation must equal transformers' greedy output token for token, under
chunked prefill and preemption. The rejection sampler is checked on a 6-token vocabulary with known p and
q by a chi-square test, and end to end by comparing seeded sampled outputs with and without speculation.
"""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chi2_contingency, chisquare
from test_engine import GREEDY, loaded, prompts, reference, tiny  # noqa: F401  (fixtures)

from ref_engine import LLM, LLMEngine, SamplingParams
from ref_engine.sampler import Sampler, SamplingMetadata
from ref_engine.spec_decode import Draft, RejectionSampler, ngram_lookup

ALPHA = 1e-3  # chi-square tests fail by chance once in a thousand seeds; the seeds are fixed, so never
PROPOSERS = {"ngram": dict(speculative_method="ngram", prompt_lookup_min=1),
             "draft_model": dict(speculative_method="draft_model", speculative_model="self:1")}


@pytest.mark.parametrize("k", [1, 3, 5])  # one draft token, a middle and the largest k: 2 and 4 add only CI time
@pytest.mark.parametrize("proposer", list(PROPOSERS))
def test_greedy_with_speculation_is_greedy_without_it(proposer, k, loaded, prompts, reference):
    llm = LLM(loaded, max_model_len=1024, num_kv_blocks=64, max_num_seqs=32, max_num_batched_tokens=48,
              num_speculative_tokens=k, speculative_disable_by_batch_size=None, **PROPOSERS[proposer])
    outputs = llm.generate(prompts, GREEDY, use_tqdm=False)
    for i, (out, expected) in enumerate(zip(outputs, reference)):
        assert out.outputs[0].token_ids == expected, f"prompt {i} ({len(prompts[i])} tokens) differs"
    engine = llm.llm_engine
    assert sum(o.num_preemptions for o in outputs) > 0, "the pool was meant to be small enough to preempt"
    assert any(s.num_tokens == 48 for s in engine.step_records), "prompts were meant to be chunked"
    accepted = sum(a for s in engine.step_records for _, _, a in s.verified)
    drafted = sum(d for s in engine.step_records for _, d, _ in s.verified)
    assert 0 < accepted < drafted, "some drafts must be accepted and some rejected, or nothing was tested"
    assert engine.scheduler.kv_cache_manager.block_pool.num_free_blocks == engine.num_kv_blocks


def test_ngram_lookup():
    assert ngram_lookup([1, 2, 3, 4, 1, 2], k=2, n_min=1, n_max=3) == [3, 4]
    assert ngram_lookup([1, 2, 3, 9, 2, 3, 7, 2, 3], k=5, n_min=2, n_max=2) == [7, 2, 3]  # the latest match
    assert ngram_lookup([5, 1, 2, 9, 1, 2, 3, 8, 1, 2, 3], k=1, n_min=1, n_max=3) == [8]  # the longest match
    assert ngram_lookup([1, 2, 3, 4], k=3, n_min=1, n_max=3) == []


# ---- the rejection sampler preserves p ----

P = torch.tensor([[0.05, 0.30, 0.10, 0.25, 0.00, 0.30],   # the target at the draft's position
                  [0.40, 0.05, 0.05, 0.20, 0.30, 0.00]])  # ... and after it (the bonus token's)
Q = torch.tensor([[0.40, 0.10, 0.20, 0.05, 0.25, 0.00]])   # the draft: far from p on purpose
NUM_DRAWS = 120_000


def verify_many(q: torch.Tensor | None) -> tuple[list[int], list[int]]:
    """Draw x ~ q (or the point mass on token 1), verify it against P; emitted first tokens, bonus tokens."""
    sampler = RejectionSampler(Sampler(seed=0))
    generator = torch.Generator().manual_seed(1)
    drafts = torch.multinomial(q[0], NUM_DRAWS, replacement=True, generator=generator).tolist() if q is not None \
        else [1] * NUM_DRAWS
    first, bonus = [], []
    for x in drafts:
        tokens = sampler.verify_sampled(Draft([x], q), P, generator)
        first.append(tokens[0])
        if len(tokens) == 2:
            bonus.append(tokens[1])
    return first, bonus


def assert_distributed_as(tokens: list[int], p: torch.Tensor) -> None:
    counts = torch.bincount(torch.tensor(tokens), minlength=len(p)).double()
    support = p > 0
    assert counts[~support].sum() == 0, "a token with p = 0 was emitted"
    expected = p[support].double() / p[support].double().sum() * len(tokens)
    _, p_value = chisquare(counts[support].numpy(), expected.numpy())
    assert p_value > ALPHA, f"emitted counts {counts.tolist()} do not follow p = {p.tolist()} (p-value {p_value:.2g})"


@pytest.mark.parametrize("q", [Q, None], ids=["draft-distribution", "point-mass"])
def test_rejection_sampling_emits_the_target_distribution(q):
    first, bonus = verify_many(q)
    assert_distributed_as(first, P[0])
    assert_distributed_as(bonus, P[1])  # the bonus token, drawn only when the draft was accepted
    accept = sum(torch.minimum(P[0], Q[0] if q is not None else torch.eye(6)[1]))
    assert len(bonus) / NUM_DRAWS == pytest.approx(float(accept), abs=0.01)  # acceptance = sum min(p, q)


def test_greedy_rows_accept_exactly_the_argmax_prefix():
    logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, 1.0], [0.0, 0.0, 5.0]])
    meta = SamplingMetadata.build([SamplingParams(temperature=0.0)] * 3, [None] * 3, [0, 1, 2], set(), "cpu")
    emitted, out = RejectionSampler(Sampler())(logits, meta, [Draft([1, 2])])
    assert emitted == [[1, 0]]  # 1 accepted, 2 rejected in favour of the argmax 0
    assert out.sampled_token_ids.tolist()[:2] == [1, 0]


def test_seeded_sampled_outputs_follow_the_same_distribution_with_and_without_speculation(loaded):
    """Token 1 and 2 of each request are the first a verify step emits; over 300 seeds their distribution
    must not change with speculation (two-sample chi-square). Token 0 comes from prefill: identical."""
    prompt = list(range(256))  # every byte token once: after any first token t, n-gram lookup proposes t+1, ...
    params = [SamplingParams(max_tokens=3, temperature=1.0, top_k=4, seed=s, ignore_eos=True) for s in range(300)]
    runs = {}
    for name, knobs in {"plain": {}, **PROPOSERS}.items():
        llm = LLM(loaded, max_num_seqs=300, max_num_batched_tokens=8192, speculative_disable_by_batch_size=None,
                  num_speculative_tokens=3, **knobs)
        runs[name] = [o.outputs[0].token_ids for o in llm.generate([prompt] * 300, params, use_tqdm=False)]
        if knobs:
            assert sum(len(s.verified) for s in llm.llm_engine.step_records) > 0
    assert [t[0] for t in runs["ngram"]] == [t[0] for t in runs["plain"]]
    for name in PROPOSERS:
        for position in (1, 2):
            tokens = sorted({t[position] for run in (runs["plain"], runs[name]) for t in run})
            table = [[sum(t[position] == v for t in run) for v in tokens] for run in (runs["plain"], runs[name])]
            _, p_value, _, _ = chi2_contingency(table)
            assert p_value > ALPHA, f"{name}, token {position}: {table} (p-value {p_value:.2g})"


def test_no_blocks_leak_after_aborts_and_preemption_with_a_draft_model(loaded, prompts):
    engine = LLMEngine(loaded, num_kv_blocks=40, max_num_seqs=8, max_num_batched_tokens=64,
                       speculative_disable_by_batch_size=None, **PROPOSERS["draft_model"])
    for i in range(8):
        engine.add_request(str(i), prompts[i * 4], SamplingParams(max_tokens=32, temperature=0.8, seed=i,
                                                                  ignore_eos=True))
    for step in range(400):
        if step in (3, 12, 25):
            engine.abort_request(str(step % 8))
        engine.step()
        engine.scheduler.kv_cache_manager.check_invariants()
        engine.proposer.block_pool.check_invariants()
        if not engine.has_unfinished_requests():
            break
    assert any(s.num_preempted for s in engine.step_records), "the pool was meant to be small enough to preempt"
    assert engine.scheduler.kv_cache_manager.block_pool.num_free_blocks == engine.num_kv_blocks
    assert engine.proposer.block_pool.num_free_blocks == engine.num_kv_blocks
    assert not engine.proposer.block_tables


@pytest.mark.parametrize("proposer", list(PROPOSERS))
def test_stop_strings_end_speculative_output_where_plain_output_ends(proposer, loaded, prompts):
    """A verify step appends several tokens at once; those after the one completing a stop string must go,
    so token ids and text equal the non-speculative run's."""
    plain = LLM(loaded, max_model_len=1024)
    texts = [o.outputs[0].text for o in plain.generate(prompts[:8], GREEDY, use_tqdm=False)]
    params = [SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True, stop=[t[12:14]]) for t in texts]
    expected = plain.generate(prompts[:8], params, use_tqdm=False)
    spec = LLM(loaded, max_model_len=1024, speculative_disable_by_batch_size=None, **PROPOSERS[proposer])
    got = spec.generate(prompts[:8], params, use_tqdm=False)
    for e, g in zip(expected, got):
        assert e.outputs[0].finish_reason == g.outputs[0].finish_reason == "stop"
        assert (g.outputs[0].token_ids, g.outputs[0].text) == (e.outputs[0].token_ids, e.outputs[0].text)
