"""Speculative knobs are checked on construction, and the scheduler's 1 + k rule in small, exact cases."""

from __future__ import annotations

import pytest

from core import EngineConfig, Request, StepResult, make_scheduler


@pytest.mark.parametrize("knobs, words", [
    (dict(speculative_method="medusa"), "speculative_method"),
    (dict(speculative_method="ngram", num_speculative_tokens=0), "num_speculative_tokens"),
    (dict(speculative_method="draft_model"), "speculative_model"),
    (dict(speculative_model="self:4"), "speculative_model"),
    (dict(speculative_method="draft_model", speculative_model="self:0"), "L >= 1"),
    (dict(speculative_method="draft_model", speculative_model="self:x"), "L >= 1"),
    (dict(prompt_lookup_min=5, prompt_lookup_max=3), "prompt_lookup_min"),
    (dict(speculative_disable_by_batch_size=0), "speculative_disable_by_batch_size"),
    (dict(speculative_method="ngram", scheduling="static"), "continuous"),
])
def test_bad_speculative_knobs_are_named(knobs, words):
    with pytest.raises(ValueError, match=words):
        EngineConfig(**knobs)


def test_draft_num_layers():
    assert EngineConfig(speculative_method="draft_model", speculative_model="self:6").draft_num_layers == 6
    assert EngineConfig(speculative_method="draft_model", speculative_model="/m.gguf").draft_num_layers is None


def decoding(config: EngineConfig, num_requests: int = 1, max_tokens: int = 20):
    """A scheduler whose requests have just finished their 4-token prefill and sampled token 100."""
    sched = make_scheduler(config.replace(max_model_len=64), num_kv_blocks=32)
    for i in range(num_requests):
        sched.add_request(Request(str(i), [1, 2, 3, 4], max_tokens=max_tokens))
    out = sched.schedule(0.0)
    sched.update_from_output(out, StepResult({s.request_id: [100] for s in out.scheduled}), 0.0)
    return sched


def test_a_verify_step_schedules_the_next_token_and_the_drafts_then_rolls_back_the_rejected():
    sched = decoding(EngineConfig(speculative_method="ngram", num_speculative_tokens=3, block_size=4))
    (req, most), = sched.requests_to_speculate()
    assert most == 3
    req.spec_token_ids = [7, 8, 9]
    out = sched.schedule(1.0)
    (s,) = out.scheduled
    assert (s.token_ids, s.num_computed_tokens, s.num_draft_tokens, s.needs_logits) == ([100, 7, 8, 9], 4, 3, True)
    assert len(s.block_ids) == 2  # 8 slots for positions 0..7
    sched.update_from_output(out, StepResult({"0": [7, 55]}), 1.0)  # 7 accepted, 8 rejected -> 55
    assert req.output_token_ids == [100, 7, 55]
    assert req.num_computed_tokens == 6 == req.num_tokens - 1  # K/V of 1, 2, 3, 4, 100, 7
    assert req.spec_token_ids == []
    assert len(sched.kv_cache_manager.get_block_ids("0")) == 2  # blocks stay; slots 6, 7 are rewritten later


def test_drafts_are_capped_near_max_tokens_and_cut_by_the_budget():
    sched = decoding(EngineConfig(speculative_method="ngram", num_speculative_tokens=5), max_tokens=3)
    assert [most for _, most in sched.requests_to_speculate()] == [1]  # 1 out, 2 to go: 1 draft + 1 own
    sched = decoding(EngineConfig(speculative_method="ngram", max_num_batched_tokens=16), num_requests=4)
    for req, _ in sched.requests_to_speculate():
        req.spec_token_ids = [5, 6, 7, 8, 9]
    out = sched.schedule(1.0)
    # 6 + 6 + 4 = 16 tokens: as in vLLM, earlier requests' drafts can use up the budget of later ones
    assert [s.num_draft_tokens for s in out.scheduled] == [5, 5, 3]


def test_speculation_switches_off_above_the_batch_size_threshold():
    config = EngineConfig(speculative_method="ngram", speculative_disable_by_batch_size=2)
    assert len(decoding(config, num_requests=2).requests_to_speculate()) == 2
    assert decoding(config, num_requests=3).requests_to_speculate() == []
    assert decoding(EngineConfig(), num_requests=1).requests_to_speculate() == []
