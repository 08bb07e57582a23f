"""`kv_cache_dtype`: K/V stored in bfloat16 under a float32 model (ref_engine/attention.py).

- a bad value names the knob and its choices, before any model is loaded;
- the same memory holds twice the blocks, and the cache tensors really are bfloat16.
The batched regimes and the quality bound are in tests/engine/test_fast_paths.py, with the other fast paths.
"""

from __future__ import annotations

import pytest
import torch

from ref_engine.engine import LLMEngine
from ref_engine.model.loader import load_model


def test_a_bad_value_names_the_knob_and_the_choices_before_loading():
    with pytest.raises(ValueError, match=r"kv_cache_dtype='fp4' is not a KV-cache dtype this engine has; "
                                         r"choices: 'auto', 'float32', 'bfloat16'"):
        LLMEngine("/no/such/model.gguf", kv_cache_dtype="fp4")


@pytest.fixture(scope="module")
def tiny(make_tiny_hf_model, device):
    return load_model(make_tiny_hf_model("llama", name="kv-dtype-llama"), device=device)


def test_bfloat16_halves_the_bytes_per_block(tiny):
    memory = 64 * tiny.arch.kv_bytes_per_block(16, 4)  # 64 float32 blocks of 16 tokens
    float32 = LLMEngine(tiny, kv_cache_memory=memory)
    bfloat16 = LLMEngine(tiny, kv_cache_memory=memory, kv_cache_dtype="bfloat16")
    assert (float32.num_kv_blocks, bfloat16.num_kv_blocks) == (64, 128)
    assert {c.dtype for c in bfloat16.runner.kv_caches} == {torch.bfloat16}
    assert {c.dtype for c in float32.runner.kv_caches} == {torch.float32}
    assert LLMEngine(tiny, kv_cache_memory=memory, kv_cache_dtype="float32").num_kv_blocks == 64
