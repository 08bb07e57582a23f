"""Streamed outputs (`RequestOutputKind.DELTA`): each step's new tokens and text, `finished` only at the end.

The tiny models' byte-level tokenizer gives every UTF-8 byte its own token, so a multi-byte character
arrives over several steps: the exact case where a careless stream would send half a character.
"""

from __future__ import annotations

import dataclasses

import pytest

from ref_engine import LLM, LLMEngine, SamplingParams
from ref_engine.detokenizer import REPLACEMENT_CHAR, IncrementalDetokenizer
from ref_engine.model.loader import load_model
from ref_engine.model.tokenizer import Tokenizer
from ref_engine.outputs import RequestOutput
from ref_engine.sampling_params import RequestOutputKind

PROMPTS = ["Hello, wörld", "naïve café 🙂", "abc"]
SMALL_POOL = {"num_kv_blocks": 64}  # the CPU default pool takes seconds to allocate per engine


@pytest.fixture(scope="module")
def tiny(make_tiny_hf_model):
    return make_tiny_hf_model("llama", name="stream-llama")


@pytest.fixture(scope="module")
def loaded(tiny, device):
    return load_model(tiny, dtype="float32", device=device)


def stream(engine: LLMEngine, prompts: list[str], params: SamplingParams) -> dict[str, list[RequestOutput]]:
    """Every output step() returns, per request, in order."""
    delta = dataclasses.replace(params, output_kind=RequestOutputKind.DELTA)
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, delta)
    outputs: dict[str, list[RequestOutput]] = {str(i): [] for i in range(len(prompts))}
    while engine.has_unfinished_requests():
        for out in engine.step():
            outputs[out.request_id].append(out)
    return outputs


def test_a_multi_byte_character_is_never_split(tiny):
    tokenizer = Tokenizer.from_hf_folder(tiny)
    text = "añ€🙂z"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) == len(text.encode())  # one token per byte
    detokenizer = IncrementalDetokenizer(tokenizer, stop=[])
    deltas = [detokenizer.delta(ids[:n])[1] for n in range(1, len(ids) + 1)]
    assert [d for d in deltas if d] == list(text)  # whole characters only, each once
    assert not any(REPLACEMENT_CHAR in d for d in deltas)


@pytest.mark.parametrize("params", [
    SamplingParams(max_tokens=24, temperature=1.0, seed=1, ignore_eos=True),
    SamplingParams(max_tokens=24, temperature=0.0, logprobs=2),
], ids=["sampled", "greedy-logprobs"])
def test_deltas_concatenate_to_the_offline_output(loaded, params):
    final = LLM(loaded, **SMALL_POOL).generate(PROMPTS, params, use_tqdm=False)
    streamed = stream(LLMEngine(loaded, **SMALL_POOL), PROMPTS, params)
    for i, offline in enumerate(final):
        outs = streamed[str(i)]
        assert [o.finished for o in outs] == [False] * (len(outs) - 1) + [True]
        assert [o.outputs[0].finish_reason for o in outs[:-1]] == [None] * (len(outs) - 1)
        assert outs[-1].outputs[0].finish_reason == offline.outputs[0].finish_reason
        assert "".join(o.outputs[0].text for o in outs) == offline.outputs[0].text
        assert sum((o.outputs[0].token_ids for o in outs), []) == offline.outputs[0].token_ids
        if params.logprobs is not None:
            assert sum((o.outputs[0].logprobs for o in outs), []) == offline.outputs[0].logprobs
        assert outs[-1].metrics is not None and outs[-1].metrics.first_token_time is not None


def test_a_stop_string_is_held_back_and_never_streamed(loaded):
    greedy = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    (full,) = LLM(loaded, **SMALL_POOL).generate(PROMPTS[:1], greedy, use_tqdm=False)
    text = full.outputs[0].text
    start = next(i for i in range(1, len(text) - 2) if REPLACEMENT_CHAR not in text[i:i + 2]
                 and text[i:i + 2] not in text[:i + 1])  # the stop string's first occurrence is at i
    stop = text[start:start + 2]
    outs = stream(LLMEngine(loaded, **SMALL_POOL), PROMPTS[:1], dataclasses.replace(greedy, stop=[stop]))["0"]
    assert "".join(o.outputs[0].text for o in outs) == text[:start]
    assert outs[-1].finished and outs[-1].outputs[0].finish_reason == "stop"
    assert outs[-1].outputs[0].stop_reason == stop


def test_finish_reasons_length_and_stop_token(loaded):
    greedy = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    (length,) = stream(LLMEngine(loaded, **SMALL_POOL), PROMPTS[:1], greedy).values()
    assert length[-1].outputs[0].finish_reason == "length"
    assert sum(len(o.outputs[0].token_ids) for o in length) == 6
    third = sum((o.outputs[0].token_ids for o in length), [])[2]
    (stopped,) = stream(LLMEngine(loaded, **SMALL_POOL), PROMPTS[:1],
                        dataclasses.replace(greedy, stop_token_ids=[third])).values()
    out = stopped[-1].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == third
    assert sum(len(o.outputs[0].token_ids) for o in stopped) <= 3


def test_the_prefix_cache_key_names_the_tokenizer(loaded, tiny):
    """Same weights, another tokenizer: the same token ids are other text, so no cached block is shared."""
    tokenizer = Tokenizer.from_hf_folder(tiny)
    other = Tokenizer.from_hf_folder(tiny)
    other.backend.add_tokens(["<extra>"])
    assert tokenizer.fingerprint == Tokenizer.from_hf_folder(tiny).fingerprint != other.fingerprint
    engine = LLMEngine(loaded, **SMALL_POOL)
    assert f"tokenizer={tokenizer.fingerprint}" in engine.scheduler.kv_cache_manager.cache_namespace
