"""The whole engine (scheduler + runner + sampler) against transformers, token for token.

A tiny random Llama with GQA serves 36 prompts of 5 to 500 tokens under every scheduling regime the core
has: the default budget, a budget so small (16 tokens) that prompts are chunked, a pool so small that
requests are preempted (by recompute and by swap), and static batching. Each must reproduce transformers'
greedy output for each prompt run alone. Then sampling, stop conditions, bad input and `bench.run`.
"""

from __future__ import annotations

import pytest
import torch
import transformers

from core import EngineConfig, Workload
from ref_engine import LLM, LLMEngine, SamplingParams
from ref_engine.bench import run
from ref_engine.model.loader import load_model

NEW_TOKENS = 32
PROMPT_LENS = [5, 6, 9, 17, 31, 40, 64, 100, 128, 150, 200, 255, 256, 257, 300, 333, 400, 450, 480, 500] + list(
    range(7, 400, 25))


@pytest.fixture(scope="module")
def tiny(make_tiny_hf_model):
    return make_tiny_hf_model("llama", name="engine-llama", max_position_embeddings=1024)


@pytest.fixture(scope="module")
def loaded(tiny, device):
    return load_model(tiny, dtype="float32", device=device)


@pytest.fixture(scope="module")
def prompts():
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, 256, (n,), generator=g).tolist() for n in PROMPT_LENS]


@pytest.fixture(scope="module")
def reference(tiny, prompts):
    """transformers' greedy continuation of each prompt, alone (eager attention, float32, its own KV cache).

    A plain argmax loop rather than `generate`, because the engine runs with `ignore_eos` (EOS may be
    emitted and decoding goes on), which `generate` has no switch for."""
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny, attn_implementation="eager",
                                                              dtype=torch.float32).eval()
    out = []
    with torch.inference_mode():
        for p in prompts:
            step = model(torch.tensor([p]), use_cache=True)
            tokens = [int(step.logits[0, -1].argmax())]
            while len(tokens) < NEW_TOKENS:
                step = model(torch.tensor([[tokens[-1]]]), past_key_values=step.past_key_values, use_cache=True)
                tokens.append(int(step.logits[0, -1].argmax()))
            out.append(tokens)
    return out


GREEDY = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)

REGIMES = {
    "continuous": dict(),
    "chunked-budget-16": dict(max_num_batched_tokens=16),
    "chunked-budget-32-many-seqs": dict(max_num_batched_tokens=32, max_num_seqs=32),
    "preempt-recompute": dict(num_kv_blocks=64, max_num_seqs=32, preemption_mode="recompute"),
    "preempt-swap": dict(num_kv_blocks=64, max_num_seqs=32, preemption_mode="swap", num_swap_blocks=128),
    "static": dict(scheduling="static", max_num_seqs=8),
    "block-size-1": dict(block_size=1, num_kv_blocks=4000, max_num_batched_tokens=64),
}


@pytest.mark.parametrize("regime", list(REGIMES))
def test_batched_greedy_equals_transformers(regime, loaded, prompts, reference):
    llm = LLM(loaded, max_model_len=1024, **REGIMES[regime])
    outputs = llm.generate(prompts, GREEDY, use_tqdm=False)
    for i, (out, expected) in enumerate(zip(outputs, reference)):
        assert out.outputs[0].token_ids == expected, f"prompt {i} ({len(prompts[i])} tokens) differs"
    preemptions = sum(o.num_preemptions for o in outputs)
    if regime.startswith("preempt"):
        assert preemptions > 0, "the pool was meant to be small enough to preempt"
    else:
        assert preemptions == 0
    assert llm.llm_engine.scheduler.kv_cache_manager.block_pool.num_free_blocks == llm.llm_engine.num_kv_blocks


def test_a_step_is_stamped_from_the_clock_reading_its_caller_gives(loaded):
    engine = LLMEngine(loaded)
    engine.add_request("a", [5, 6, 7], SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))
    engine.reset_clock()
    engine.step(now=0.0)
    engine.step()
    first, second = engine.step_records
    assert first.start == 0.0 and first.duration >= 0.0 and first.num_logit_rows == 1
    assert second.start >= first.start + first.duration


def test_seeded_sampling_is_the_same_alone_and_in_a_batch(loaded, prompts):
    params = SamplingParams(max_tokens=20, temperature=0.9, top_p=0.95, seed=1234, ignore_eos=True)
    alone = LLM(loaded).generate([prompts[3]], params, use_tqdm=False)[0].outputs[0].token_ids
    others = [SamplingParams(max_tokens=20, temperature=1.0, ignore_eos=True)] * 5
    batch = LLM(loaded, max_num_batched_tokens=48).generate(
        prompts[:3] + [prompts[3]] + prompts[4:6], others[:3] + [params] + others[3:], use_tqdm=False)
    assert batch[3].outputs[0].token_ids == alone
    other_seed = LLM(loaded).generate([prompts[3]], SamplingParams(
        max_tokens=20, temperature=0.9, top_p=0.95, seed=99, ignore_eos=True), use_tqdm=False)[0]
    assert other_seed.outputs[0].token_ids != alone


def test_stop_token_id_and_stop_string_end_with_reason_stop(loaded, prompts, reference):
    llm = LLM(loaded)
    stop_id = reference[0][5]
    out = llm.generate([prompts[0]], SamplingParams(max_tokens=NEW_TOKENS, temperature=0, stop_token_ids=[stop_id]),
                       use_tqdm=False)[0].outputs[0]
    first = reference[0].index(stop_id)
    assert out.token_ids == reference[0][: first + 1]
    assert (out.finish_reason, out.stop_reason) == ("stop", stop_id)

    full = llm.generate([prompts[1]], GREEDY, use_tqdm=False)[0].outputs[0]
    stop = full.text[10:13]
    assert stop, "the reference text is too short for this test"
    cut = llm.generate([prompts[1]], SamplingParams(max_tokens=NEW_TOKENS, temperature=0, stop=[stop]),
                       use_tqdm=False)[0].outputs[0]
    assert cut.finish_reason == "stop" and cut.stop_reason == stop
    assert cut.text == full.text[: full.text.find(stop)]
    assert len(cut.token_ids) < NEW_TOKENS

    capped = llm.generate([prompts[1]], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True),
                          use_tqdm=False)[0].outputs[0]
    assert capped.finish_reason == "length" and capped.token_ids == reference[1][:4]


def test_logprobs_are_reported_per_token(loaded, prompts, reference):
    out = LLM(loaded).generate([prompts[0]], SamplingParams(max_tokens=5, temperature=0, logprobs=3,
                                                            ignore_eos=True), use_tqdm=False)[0].outputs[0]
    assert len(out.logprobs) == 5
    for token_id, entry in zip(out.token_ids, out.logprobs):
        assert token_id in entry and len(entry) <= 4
        assert entry[token_id] == max(entry.values())  # greedy picks the most likely token


@pytest.mark.parametrize(("prompt", "params", "field"), [
    ([5] * 1024, GREEDY, "max_model_len"),
    ([], GREEDY, "prompt_token_ids"),
    ("", GREEDY, "prompt"),
    ([1, 2, 10**6], GREEDY, "prompt_token_ids"),
    ([1, 2, -1], GREEDY, "prompt_token_ids"),
])
def test_bad_prompts_are_refused_by_name_and_the_engine_keeps_serving(loaded, prompts, reference, prompt, params,
                                                                       field):
    engine = LLMEngine(loaded, max_model_len=1024)
    engine.add_request("good", prompts[0], GREEDY)
    with pytest.raises(ValueError, match=field):
        engine.add_request("bad", prompt, params)
    outputs = []
    while engine.has_unfinished_requests():
        outputs += engine.step()
    assert [o.request_id for o in outputs] == ["good"]
    assert outputs[0].outputs[0].token_ids == reference[0]


@pytest.mark.parametrize(("kwargs", "field"), [
    (dict(max_tokens=0), "max_tokens"),
    (dict(temperature=-0.5), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
])
def test_bad_sampling_params_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_unknown_engine_knob_and_bad_knob_values_are_named(loaded):
    with pytest.raises(ValueError, match="max_num_sequences"):
        LLM(loaded, max_num_sequences=4)
    with pytest.raises(ValueError, match="preemption_mode"):
        LLM(loaded, preemption_mode="evict")
    with pytest.raises(ValueError, match="block_size"):
        LLM(loaded, block_size=0)


def test_a_request_larger_than_the_pool_is_refused(loaded, prompts):
    llm = LLM(loaded, num_kv_blocks=4, block_size=16)
    with pytest.raises(ValueError, match="KV blocks"):
        llm.generate([prompts[-1]], GREEDY, use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()


def test_abort_frees_blocks(loaded, prompts):
    engine = LLMEngine(loaded)
    for i in range(4):
        engine.add_request(str(i), prompts[i], GREEDY)
    engine.step()
    engine.abort_request("1")
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.scheduler.kv_cache_manager.block_pool.num_free_blocks == engine.num_kv_blocks


def test_bench_run_measures_the_workload(loaded):
    workload = Workload.synthetic(12, prompt_len=(5, 60), output_len=(1, 12), seed=3)
    metrics = run(workload, EngineConfig(max_num_seqs=4, max_num_batched_tokens=64), model=loaded)
    assert metrics.completed == 12 and metrics.failed == 0
    assert metrics.total_output_tokens == workload.total_output_tokens
    assert metrics.num_steps == len(metrics.steps) > 0
    assert all(s.num_tokens <= 64 and s.num_seqs <= 4 for s in metrics.steps)
    assert metrics.output_throughput == pytest.approx(metrics.total_output_tokens / metrics.duration)
    assert 0 < metrics.mean_ttft_ms <= metrics.mean_e2el_ms
