"""Prefill/decode disaggregation in the real engine: `DisaggregatedLLM` against one colocated `LLM`.

Two engine processes (prefill: `kv_producer`, decode: `kv_consumer`) and the shared-memory KV connector
must give token-for-token the greedy outputs of one engine, for prompts of every shape (one token, one
block exactly, one past a block, chunked on the prefill side, text). Failures stay with their requests: a
K/V save or load that fails (an injected connector), a prompt too long for the decode pool, a killed decode
process. Each gets a clear error, the rest finish, nothing hangs, and both pools end with every block free
and no shared-memory segment left behind.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch

from core import EngineConfig
from core.math_utils import cdiv
from ref_engine import LLM, SamplingParams
from ref_engine.disagg import DisaggregatedGenerateError, DisaggregatedLLM
from ref_engine.engine_core.client import EngineDeadError
from ref_engine.kv_transfer.shared_memory_connector import SEGMENT_PREFIX

NEW_TOKENS = 8
GREEDY = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
PROMPT_LENS = [1, 5, 16, 17, 33, 70]  # one token; one block exactly; one past a block (block_size 16); chunked
TIMEOUTS = dict(timeout_s=60.0, startup_timeout_s=120.0)
PREFILL = EngineConfig(num_kv_blocks=64, max_num_batched_tokens=32)  # a 70-token prompt takes 3 chunks


@pytest.fixture(scope="module")
def tiny(make_tiny_hf_model) -> Path:
    return make_tiny_hf_model("llama", name="disagg-llama")


@pytest.fixture(scope="module")
def colocated(tiny, device):
    return LLM(tiny, device=device, num_kv_blocks=64)


def token_prompts(lens: list[int], seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (n,), generator=g).tolist() for n in lens]


def kv_segments() -> list[str]:
    return sorted(name for name in os.listdir("/dev/shm") if name.startswith(SEGMENT_PREFIX))


def assert_all_blocks_free(llm: DisaggregatedLLM) -> None:
    for role, stats in llm.stats().items():
        assert stats.num_free_blocks == stats.num_kv_blocks, f"{role} engine leaked blocks: {stats}"
        assert stats.num_unfinished_requests == stats.num_staged_requests == 0, f"{role}: {stats}"


def test_greedy_outputs_equal_one_colocated_engine(tiny, colocated, device):
    prompts = [*token_prompts(PROMPT_LENS), "Disaggregated prefill, then decode."]
    expected = colocated.generate(prompts, GREEDY, use_tqdm=False)
    arch = colocated.llm_engine.arch
    block_bytes = arch.kv_bytes_per_block(16, 4)
    with DisaggregatedLLM(tiny, PREFILL, EngineConfig(num_kv_blocks=32), device=device, **TIMEOUTS) as llm:
        outputs = llm.generate(prompts, GREEDY)
        for i, (out, ref) in enumerate(zip(outputs, expected)):
            assert out.outputs[0].token_ids == ref.outputs[0].token_ids, f"prompt {i} differs"
            assert out.outputs[0].text == ref.outputs[0].text and out.prompt == ref.prompt
            assert out.prompt_token_ids == ref.prompt_token_ids and out.outputs[0].finish_reason == "length"
            t = out.disagg_timings
            num_prompt = len(out.prompt_token_ids)
            assert t.transfer_bytes == cdiv(num_prompt - 1, 16) * block_bytes
            assert t.prefill_s > 0 and t.transfer_s > 0 and t.decode_s > 0 and len(t.itl_s) == NEW_TOKENS - 1
            assert t.ttft_s < t.e2e_s and t.e2e_s == pytest.approx(t.ttft_s + sum(t.itl_s))
        assert_all_blocks_free(llm)
        assert llm.generate(prompts[1], GREEDY)[0].outputs[0].token_ids == expected[1].outputs[0].token_ids
    assert kv_segments() == []


def test_failures_stay_with_their_requests(tiny, colocated, device):
    """Request 1's K/V fails to save, request 2's fails to load, prompt 3 needs more blocks than the decode
    pool has; 0 and 4 finish as a colocated engine would."""
    prompts = token_prompts([20, 30, 25, 150, 40], seed=1)
    expected = colocated.generate(prompts, GREEDY, use_tqdm=False)
    with DisaggregatedLLM(tiny, PREFILL, EngineConfig(num_kv_blocks=8), device=device, kv_connector="FaultyConnector",
                          kv_connector_module_path="disagg_faults",
                          kv_connector_extra_config={"fail_save": ["1"], "fail_load": ["2"]}, **TIMEOUTS) as llm:
        with pytest.raises(DisaggregatedGenerateError) as failed:
            llm.generate(prompts, GREEDY)
        errors = failed.value.errors
        assert sorted(errors) == [1, 2, 3]
        assert "saving its KV failed" in errors[1] and "link to the decode engine is down" in errors[1]
        assert "decode engine could not serve it" in errors[2] and "arrived corrupted" in errors[2]
        assert "needs 10 KV blocks" in errors[3] and "the pool has 8" in errors[3]
        for i in (0, 4):
            assert failed.value.outputs[i].outputs[0].token_ids == expected[i].outputs[0].token_ids
        assert_all_blocks_free(llm)
    assert kv_segments() == []


def test_a_killed_decode_engine_fails_its_requests_and_nothing_hangs(tiny, colocated, device):
    prompts = token_prompts([12, 40, 27], seed=2)
    llm = DisaggregatedLLM(tiny, PREFILL, EngineConfig(num_kv_blocks=32), device=device, **TIMEOUTS)
    try:
        assert (llm.generate(prompts[0], GREEDY)[0].outputs[0].token_ids
                == colocated.generate(prompts[0], GREEDY, use_tqdm=False)[0].outputs[0].token_ids)
        os.kill(llm.decode.process.pid, signal.SIGKILL)
        with pytest.raises(DisaggregatedGenerateError) as failed:
            llm.generate(prompts[1:], GREEDY)
        assert failed.value.outputs == [None, None]
        assert all("decode engine process died (exit code -9)" in e for e in failed.value.errors.values())
        stats = llm.prefill.stats(timeout_s=30)  # answered after the discards sent before it
        assert stats.num_free_blocks == stats.num_kv_blocks and stats.num_unfinished_requests == 0
        assert kv_segments() == []
        with pytest.raises(EngineDeadError, match="decode engine process died"):
            llm.generate(prompts[0], GREEDY)
    finally:
        llm.close()
    assert not llm.prefill.process.is_alive() and not llm.decode.process.is_alive()


@pytest.mark.slow
@pytest.mark.long  # 27 s: test_greedy_outputs_equal_one_colocated_engine checks the same equality on a tiny model
def test_smollm2_greedy_outputs_equal_one_colocated_engine(smollm2_path, device):
    prompts = ["The capital of France is", "Write a haiku about the sea.", "1, 2, 3, 4,"]
    params = SamplingParams(max_tokens=12, temperature=0.0)
    expected = LLM(str(smollm2_path), device=device).generate(prompts, params, use_tqdm=False)
    with DisaggregatedLLM(str(smollm2_path), device=device, **TIMEOUTS) as llm:
        outputs = llm.generate(prompts, params)
        assert_all_blocks_free(llm)
    for out, ref in zip(outputs, expected):
        assert out.outputs[0].token_ids == ref.outputs[0].token_ids and out.outputs[0].text == ref.outputs[0].text
