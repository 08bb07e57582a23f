"""Prefix caching on the real engine: same tokens as without it, one prefill token for a fully cached
prompt, isolation between tenants and salts, miss explanations, and eviction under memory pressure.

A tiny random Llama (block size 4, so every case is a few tokens long) serves prompts that share a prefix
of every length that matters relative to a block: shorter than a block, exactly k blocks, k blocks plus
one token, and the whole prompt.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import random
import re
import shutil
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ref_engine import LLM, LLMEngine, SamplingParams
from ref_engine.kv_transfer.config import KVTransferConfig
from ref_engine.kv_transfer.connector import KVTransferParams
from ref_engine.model.loader import load_model
from ref_engine.sampling_params import RequestOutputKind

BS = 4
GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
SEEDED = SamplingParams(max_tokens=12, temperature=1.0, top_p=0.9, seed=7, ignore_eos=True)


@pytest.fixture(scope="module")
def loaded(make_tiny_hf_model, device):
    return load_model(make_tiny_hf_model("llama", name="prefix-llama", seed=3), dtype="float32", device=device)


@pytest.fixture(scope="module")
def base():
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 256, (40,), generator=g).tolist()


def variants(base: list[int]) -> dict[str, list[list[int]]]:
    """Pairs of prompts (first warms the cache, second may hit), by shared-prefix length."""
    tail = [300, 301, 302, 303, 304, 305]  # ids the base prompt never uses
    return {
        "shorter-than-a-block": [base[:3] + tail, base[:3] + tail[::-1]],
        "exactly-2-blocks": [base[:2 * BS] + tail, base[:2 * BS] + tail[::-1]],
        "2-blocks-plus-1": [base[:2 * BS + 1] + tail, base[:2 * BS + 1] + tail[::-1]],
        "whole-prompt-aligned": [base[:5 * BS], base[:5 * BS]],
        "whole-prompt-unaligned": [base[:5 * BS + 2], base[:5 * BS + 2]],
        "one-extends-the-other": [base[:3 * BS + 1], base[:7 * BS + 3]],
    }


EXPECTED_HITS = {"shorter-than-a-block": 0, "exactly-2-blocks": 2 * BS, "2-blocks-plus-1": 2 * BS,
                 "whole-prompt-aligned": 5 * BS - 1, "whole-prompt-unaligned": 5 * BS,
                 "one-extends-the-other": 3 * BS}


def generate_one_by_one(llm: LLM, prompts: list, params: SamplingParams):
    return [llm.generate([p], params, use_tqdm=False)[0] for p in prompts]


@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
@pytest.mark.parametrize("case", list(EXPECTED_HITS))
def test_outputs_with_caching_equal_outputs_without(case, params, loaded, base):
    prompts = variants(base)[case]
    cold = generate_one_by_one(LLM(loaded, block_size=BS, enable_prefix_caching=False), prompts, params)
    warm = generate_one_by_one(LLM(loaded, block_size=BS), prompts, params)
    for c, w in zip(cold, warm):
        assert w.outputs[0].token_ids == c.outputs[0].token_ids
    assert [w.num_cached_tokens for w in warm] == [0, EXPECTED_HITS[case]]
    assert [w.prefix_cache.num_cached_tokens for w in warm] == [0, EXPECTED_HITS[case]]  # says the same
    assert all(c.num_cached_tokens == 0 for c in cold)


def test_hits_inside_one_batch_with_chunked_prefill_equal_cold_outputs(loaded, base):
    """Requests admitted while another still prefills its (chunked) prompt share the blocks it finished."""
    prompts = [p for pair in variants(base).values() for p in pair] * 2
    cold = LLM(loaded, block_size=BS, enable_prefix_caching=False).generate(prompts, GREEDY, use_tqdm=False)
    llm = LLM(loaded, block_size=BS, max_num_batched_tokens=8)
    warm = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert [w.outputs[0].token_ids for w in warm] == [c.outputs[0].token_ids for c in cold]
    assert sum(w.num_cached_tokens for w in warm) > 0


def test_a_fully_cached_prompt_computes_exactly_one_prefill_token(loaded, base):
    engine = LLMEngine(loaded, block_size=BS)
    prompt = base[:6 * BS]  # block-aligned: the last block is copied, not shared, and one token computed
    for request_id in ("cold", "warm"):
        engine.reset_clock()
        engine.add_request(request_id, prompt, SamplingParams(max_tokens=1, temperature=0.0))
        (out,) = engine.step()
        assert engine.step_records[0].query_lens == ((6 * BS,) if request_id == "cold" else (1,))
    assert out.num_cached_tokens == 6 * BS - 1
    kv = engine.scheduler.kv_cache_manager
    kv.check_invariants()
    assert kv.block_pool.num_free_blocks == engine.num_kv_blocks


@pytest.mark.parametrize("second", [{"tenant": "bob"}, {"cache_salt": "s2"}, {"tenant": "alice", "cache_salt": "s2"}])
def test_another_tenant_or_salt_gets_no_hit_and_the_same_one_does(second, loaded, base):
    llm = LLM(loaded, block_size=BS)
    first = {"prompt_token_ids": base[:32], "tenant": "alice"}
    llm.generate([first], GREEDY, use_tqdm=False)
    other = llm.generate([{**first, **second}], GREEDY, use_tqdm=False)[0]
    same = llm.generate([first], GREEDY, use_tqdm=False)[0]  # the positive control
    assert other.num_cached_tokens == 0
    assert other.prefix_cache.reason == "other_isolation_key"
    assert same.num_cached_tokens == 31
    assert same.prefix_cache.reason == "all_full_blocks_hit"


def test_misses_are_explained(loaded, base):
    llm = LLM(loaded, block_size=BS, num_kv_blocks=24)
    engine = llm.llm_engine
    assert engine.explain_prefix_cache(base[:3]).reason == "shorter_than_block"
    assert engine.explain_prefix_cache(base[:20]).reason == "never_computed"
    llm.generate([base[:20]], GREEDY, use_tqdm=False)
    changed = base[:20]
    changed[9] = 299
    explanation = engine.explain_prefix_cache(changed)
    assert (explanation.reason, explanation.num_cached_tokens, explanation.position) == ("different_tokens", 8, 9)
    assert "differ at token 9" in str(explanation)
    # Fill the small pool with other prompts until the first prompt's blocks are evicted.
    g = torch.Generator().manual_seed(5)
    llm.generate([torch.randint(0, 256, (60,), generator=g).tolist() for _ in range(3)], GREEDY, use_tqdm=False)
    assert engine.explain_prefix_cache(base[:20]).reason == "evicted"


@pytest.mark.parametrize("prompt, message", [
    ({"prompt_token_ids": [1, 2], "tenant": ""}, "'tenant' must be a non-empty string"),
    ({"prompt_token_ids": [1, 2], "cache_salt": 5}, "'cache_salt' must be a non-empty string"),
    ({"prompt_token_ids": [1, 2], "salt": "x"}, "unknown key(s) ['salt']"),
    ({"prompt_token_ids": [1, 2], "priority": "high"}, "'priority' must be an integer"),
])
def test_bad_prompt_dicts_are_named(prompt, message, loaded):
    with pytest.raises(ValueError, match=re.escape(message)):
        LLM(loaded).generate([prompt], GREEDY, use_tqdm=False)


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2**16), num_blocks=st.integers(12, 30), budget=st.sampled_from([8, 16, 64]))
def test_eviction_under_memory_pressure_keeps_outputs_and_invariants(seed, num_blocks, budget, loaded, base):
    """Random request sequences over three prefix families, in a pool too small to keep them all: blocks
    are evicted and reused, requests preempted; every output still equals the cold one."""
    rng = random.Random(seed)
    prompts = []
    for _ in range(rng.randint(4, 10)):
        family = rng.randrange(3)
        shared = base[family * 5:family * 5 + rng.randint(0, 24)]
        prompts.append(shared + [rng.randrange(256) for _ in range(rng.randint(1, 10))])
    params = SamplingParams(max_tokens=rng.randint(1, 10), temperature=0.0, ignore_eos=True)
    cold = LLM(loaded, block_size=BS, enable_prefix_caching=False, num_kv_blocks=200).generate(
        prompts, params, use_tqdm=False)
    llm = LLM(loaded, block_size=BS, num_kv_blocks=num_blocks, max_num_batched_tokens=budget)
    engine = llm.llm_engine
    kv = engine.scheduler.kv_cache_manager
    ids = [str(i) for i in range(len(prompts))]
    for request_id, prompt in zip(ids, prompts):
        engine.add_request(request_id, prompt, params)
    outputs = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            outputs[out.request_id] = out
        kv.check_invariants()
    assert [outputs[i].outputs[0].token_ids for i in ids] == [c.outputs[0].token_ids for c in cold]
    assert kv.block_pool.num_free_blocks == num_blocks and not kv.block_tables


# ---- cache identity, isolation labels, invalidation under load (issue 26) ----

def test_the_cache_namespace_covers_the_weights_not_only_the_name(make_tiny_hf_model, tmp_path, base, device):
    """Two checkpoints named alike ("chat") with other weights never share a block hash; the same file
    loaded twice does (as the two processes of a disaggregated pair). A file rewritten in place with other
    weights of the same size, its modification time then set back, is hashed again, not served from the
    digest cache."""
    first = make_tiny_hf_model("llama", name="identity-a", seed=3)
    other = make_tiny_hf_model("llama", name="identity-b", seed=4)
    a = shutil.copytree(first, tmp_path / "a" / "chat")
    b = shutil.copytree(other, tmp_path / "b" / "chat")

    def hashes(path: Path) -> tuple[str, list[bytes]]:
        engine = LLMEngine(load_model(path, dtype="float32", device=device), block_size=BS)
        request = engine.add_request("r", base[:16], GREEDY)
        return engine.cache_namespace, engine.scheduler.kv_cache_manager.block_hashes(request)

    (ns_a, hashes_a), (ns_a2, hashes_a2), (ns_b, hashes_b) = hashes(a), hashes(a), hashes(b)
    assert ns_a == ns_a2 and hashes_a == hashes_a2
    assert ns_a != ns_b and not set(hashes_a) & set(hashes_b)
    weights = a / "model.safetensors"
    before = weights.stat()
    shutil.copyfile(other / "model.safetensors", weights)
    os.utime(weights, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert weights.stat().st_size == before.st_size and weights.stat().st_mtime_ns == before.st_mtime_ns
    assert hashes(a)[0] == ns_b


def test_the_cache_namespace_covers_dtype_and_kv_cache_dtype(loaded):
    namespaces = {LLMEngine(loaded).cache_namespace, LLMEngine(loaded, kv_cache_dtype="bfloat16").cache_namespace}
    namespaces.add(LLMEngine(dataclasses.replace(loaded, model=copy.deepcopy(loaded.model).to(torch.bfloat16)),
                             ).cache_namespace)
    assert len(namespaces) == 3
    assert "weights=" in LLMEngine(loaded).cache_namespace


def test_user_groups_requests_but_never_isolates_the_cache(loaded, base):
    llm = LLM(loaded, block_size=BS)
    llm.generate([{"prompt_token_ids": base[:32], "user": "u1"}], GREEDY, use_tqdm=False)
    other_user = llm.generate([{"prompt_token_ids": base[:32], "user": "u2"}], GREEDY, use_tqdm=False)[0]
    other_tenant = llm.generate([{"prompt_token_ids": base[:32], "user": "u1", "tenant": "t2"}], GREEDY,
                                use_tqdm=False)[0]
    assert other_user.num_cached_tokens == 31 and other_tenant.num_cached_tokens == 0


@pytest.mark.parametrize("key", ["tenant", "user", "cache_salt", "prompt"])
def test_text_that_is_not_unicode_is_refused_at_add_naming_its_field(key, loaded):
    engine = LLMEngine(loaded)
    prompt = {"prompt": "hello", key: "bad \ud800 text"}
    with pytest.raises(ValueError, match=re.escape(f"{key}")):
        engine.add_request("r", prompt, GREEDY)
    assert not engine.has_unfinished_requests()


def test_a_reset_under_load_returns_true_and_every_block_comes_back(loaded, base):
    engine = LLMEngine(loaded, block_size=BS)
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    engine.add_request("a", {"prompt_token_ids": base[:32], "tenant": "x"}, params)
    engine.add_request("b", {"prompt_token_ids": base[:32], "tenant": "y"}, params)
    engine.step()
    assert engine.reset_prefix_cache(tenant="x") is True  # while both run
    assert engine.reset_prefix_cache() is True
    engine.add_request("c", {"prompt_token_ids": base[:32], "tenant": "x"}, params)
    outputs = {}
    while engine.has_unfinished_requests():
        outputs |= {o.request_id: o for o in engine.step()}
    assert outputs["c"].num_cached_tokens == 0  # a's blocks were in use, but out of reach
    kv = engine.scheduler.kv_cache_manager
    assert kv.block_pool.num_used_blocks == 0 and not kv.block_pool.dropped
    kv.check_invariants()
    with pytest.raises(ValueError, match="tenant"):
        engine.reset_prefix_cache(tenant="\ud800")


def test_a_request_whose_own_work_raises_fails_alone(loaded, base, monkeypatch):
    """One streamed request's delta raises: it ends with finish_reason "error" and its error, the other
    finishes normally, and the step loop goes on."""
    engine = LLMEngine(loaded, block_size=BS)
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, output_kind=RequestOutputKind.DELTA)
    engine.add_request("ok", base[:8], params)
    engine.add_request("bad", base[8:16], params)
    broken = engine._states["bad"].detokenizer

    def delta(*args, **kwargs):
        raise RuntimeError("detokenizer broke")

    monkeypatch.setattr(broken, "delta", delta)
    finals = {}
    while engine.has_unfinished_requests():
        finals |= {o.request_id: o for o in engine.step() if o.finished}
    assert finals["bad"].outputs[0].finish_reason == "error" and "detokenizer broke" in finals["bad"].error
    assert finals["ok"].outputs[0].finish_reason == "length" and finals["ok"].error is None
    assert engine.scheduler.kv_cache_manager.block_pool.num_used_blocks == 0


def test_a_kv_consumer_refuses_kv_computed_under_another_namespace(loaded, base):
    """The producer stamps its namespace on the K/V it saves; K/V from other weights, dtypes or tokenizer
    would decode garbage, so the consumer refuses it with a clear error and holds nothing."""
    consumer = LLMEngine(loaded, block_size=BS, kv_transfer_config=KVTransferConfig(kv_role="kv_consumer"))
    params = KVTransferParams("r", num_tokens=15, num_blocks=4, num_bytes=0, handle=None, saved_at=0.0,
                              cache_namespace="another-model|weights=0")
    with pytest.raises(ValueError, match="cache namespace"):
        consumer.add_remote_prefilled_request("r", base[:16], GREEDY, params)
    assert not consumer.has_unfinished_requests()
    ours = dataclasses.replace(params, cache_namespace=consumer.cache_namespace)
    assert consumer.add_remote_prefilled_request("r", base[:16], GREEDY, ours) is not None
