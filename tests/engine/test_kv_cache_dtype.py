"""`kv_cache_dtype`: K/V stored in bfloat16 under a float32 model (ref_engine/attention.py).

- a bad value names the knob and its choices, before any model is loaded;
- the same memory holds twice the blocks, and the cache tensors really are bfloat16;
- the engine runs every batched regime (chunked prefill, preemption by recompute and swap, prefix caching,
  speculation) with a bfloat16 cache, every request to its last token and every block back;
- quality on SmolLM2's eval set: rounding K/V once costs little (bounds from the measured cost).
"""

from __future__ import annotations

import pytest
import torch

from ref_engine import LLM, SamplingParams
from ref_engine.engine import LLMEngine
from ref_engine.model.loader import load_model
from serving_lab.eval_set import compare_quality, eval_prompts


def test_a_bad_value_names_the_knob_and_the_choices_before_loading():
    with pytest.raises(ValueError, match=r"kv_cache_dtype='fp4' is not a KV-cache dtype this engine has; "
                                         r"choices: 'auto', 'float32', 'bfloat16'"):
        LLMEngine("/no/such/model.gguf", kv_cache_dtype="fp4")


@pytest.fixture(scope="module")
def tiny(make_tiny_hf_model):
    return load_model(make_tiny_hf_model("llama", name="kv-dtype-llama"))


def test_bfloat16_halves_the_bytes_per_block(tiny):
    memory = 64 * tiny.arch.kv_bytes_per_block(16, 4)  # 64 float32 blocks of 16 tokens
    float32 = LLMEngine(tiny, kv_cache_memory=memory)
    bfloat16 = LLMEngine(tiny, kv_cache_memory=memory, kv_cache_dtype="bfloat16")
    assert (float32.num_kv_blocks, bfloat16.num_kv_blocks) == (64, 128)
    assert {c.dtype for c in bfloat16.runner.kv_caches} == {torch.bfloat16}
    assert {c.dtype for c in float32.runner.kv_caches} == {torch.float32}
    assert LLMEngine(tiny, kv_cache_memory=memory, kv_cache_dtype="float32").num_kv_blocks == 64


@pytest.mark.parametrize("knobs", [
    dict(max_num_batched_tokens=16),  # chunked prefill
    dict(num_kv_blocks=24, max_num_seqs=16, preemption_mode="recompute"),
    dict(num_kv_blocks=24, max_num_seqs=16, preemption_mode="swap", num_swap_blocks=64),
    dict(speculative_method="ngram", num_speculative_tokens=3),
], ids=["chunked-prefill", "preempt-recompute", "preempt-swap", "ngram-speculation"])
def test_a_bfloat16_cache_runs_every_batched_regime_to_the_last_token(tiny, knobs):
    prompts = [[1 + (i * 7 + j) % 200 for j in range(20 + 3 * i)] for i in range(12)]
    prompts += [prompts[0][:16] + [9, 9, 9, i] for i in range(4)]  # a shared 16-token prefix: cache hits
    llm = LLM(tiny, kv_cache_dtype="bfloat16", **knobs)
    outputs = llm.generate(prompts, SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True), use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outputs] == [24] * len(prompts)
    engine = llm.llm_engine
    assert engine.scheduler.kv_cache_manager.block_pool.num_free_blocks == engine.num_kv_blocks
    if "num_kv_blocks" in knobs:
        assert engine.scheduler.num_preemptions > 0, "the pool was meant to be small enough to preempt"


@pytest.mark.slow
def test_a_bfloat16_cache_costs_little_quality_on_smollm2(smollm2):
    """float32 weights with a bfloat16 cache against the float32 reference, 4 eval prompts x 16 tokens.
    Measured on this case: KL 2.1e-5 nats per token, agreement 1.0 (benchmarks/RESULTS.md, "Engine speed"); the
    bounds (KL <= 0.01, agreement >= 0.5) leave room for one flipped near-tie, while a cache that stored
    K/V in the wrong place or dtype gives KL of nats."""
    [quality] = compare_quality(smollm2, [smollm2], eval_prompts(4), max_tokens=16, kv_cache_dtype="bfloat16")
    print(quality)
    assert quality.agreement >= 0.5 and 0 < quality.mean_kl <= 0.01, quality
