"""Our model against transformers, token for token.

Tiny random models of every supported family are saved with transformers, loaded with our Hugging Face
loader and decoded greedily through the paged KV cache by a minimal scheduler written here: whole-prompt
prefill, several requests sharing one flat batch (prefills next to decodes) and chunked prefill. The
reference is transformers' own `generate` with eager attention in float32.

Then the real SmolLM2-135M-Instruct GGUF, against transformers loading the same file.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
import transformers

from ref_engine.attention import AttentionMetadata, allocate_kv_cache
from ref_engine.model.llama import LlamaForCausalLM
from ref_engine.model.loader import load_model

MAX_NEW_TOKENS = 32
BLOCK_SIZE = 4
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16}

TINY_MODELS = {
    "llama-gqa": dict(family="llama"),
    "llama3-rope-tied": dict(family="llama", rope_scaling=LLAMA3_ROPE, rope_theta=50000.0, tie_word_embeddings=True),
    "qwen2-bias-tied": dict(family="qwen2", tie_word_embeddings=True),
    "mistral-mqa": dict(family="mistral", num_key_value_heads=1),
}
TINY_PROMPTS = [torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (1, 7, 40)]

# How requests reach the model: arrival step of each prompt and prefill chunk size (None: whole prompt).
SCENARIOS = {
    "one-request-at-a-time": dict(arrivals=None, chunk_size=None),
    "mixed-prefill-and-decode": dict(arrivals=[0, 3, 6], chunk_size=None),
    "chunked-prefill-5": dict(arrivals=[0, 2, 4], chunk_size=5),
}


# ---- a minimal greedy engine over the paged cache ----


@dataclass
class Sequence:
    tokens: list[int]  # prompt + generated so far
    prompt_len: int
    arrival: int
    num_computed: int = 0  # tokens whose K/V are in the cache
    block_table: list[int] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)  # one row per generated token

    @property
    def output(self) -> list[int]:
        return self.tokens[self.prompt_len:]


def greedy_generate(model: LlamaForCausalLM, prompts: list[list[int]], max_new_tokens: int = MAX_NEW_TOKENS,
                    arrivals: list[int] | None = None, chunk_size: int | None = None,
                    num_blocks: int = 96) -> list[Sequence]:
    """Greedy decoding of all prompts, sharing one flat batch per step.

    `arrivals=None` runs the prompts one after another (batch of one). Blocks are handed out from the top
    of the pool down, so block tables are non-contiguous, reversed and interleaved between requests. Runs on
    the model's device; the logits kept are on the CPU, where the reference's are.
    """
    arch = model.arch
    dtype = model.model.norm.weight.dtype
    device = model.model.norm.weight.device
    if arrivals is None:
        return [greedy_generate(model, [p], max_new_tokens, [0], chunk_size, num_blocks)[0] for p in prompts]
    free_blocks = list(range(num_blocks))  # pop() takes the highest id first
    kv_caches = allocate_kv_cache(arch, num_blocks, BLOCK_SIZE, dtype, device)
    seqs = [Sequence(tokens=list(p), prompt_len=len(p), arrival=a) for p, a in zip(prompts, arrivals)]
    step = 0
    while any(len(s.output) < max_new_tokens for s in seqs):
        scheduled = [s for s in seqs if s.arrival <= step and len(s.output) < max_new_tokens]
        query_lens = []
        for s in scheduled:
            n = len(s.tokens) - s.num_computed  # the rest of the prompt, or the last sampled token
            n = min(n, chunk_size) if chunk_size else n
            while len(s.block_table) * BLOCK_SIZE < s.num_computed + n:
                s.block_table.append(free_blocks.pop())
            query_lens.append(n)
        input_ids = [t for s, n in zip(scheduled, query_lens) for t in s.tokens[s.num_computed:s.num_computed + n]]
        positions = [p for s, n in zip(scheduled, query_lens) for p in range(s.num_computed, s.num_computed + n)]
        seq_lens = [s.num_computed + n for s, n in zip(scheduled, query_lens)]
        meta = AttentionMetadata.build(query_lens, seq_lens, [s.block_table for s in scheduled], BLOCK_SIZE, device)
        with torch.inference_mode():
            hidden = model(torch.tensor(input_ids, device=device), torch.tensor(positions, device=device), kv_caches,
                           meta)
            last_rows = meta.query_start_loc[1:] - 1  # each request's last new token
            logits = model.compute_logits(hidden[last_rows]).cpu()
        for s, n, row in zip(scheduled, query_lens, logits):
            s.num_computed += n
            if s.num_computed == len(s.tokens):  # caught up: this row predicts the next token
                s.logits.append(row)
                s.tokens.append(int(row.argmax()))
        step += 1
    return seqs


# ---- the transformers reference ----


@dataclass
class Reference:
    outputs: list[list[int]]
    logits: list[torch.Tensor]  # [MAX_NEW_TOKENS, vocab] per prompt: the logits that chose each output token


def hf_reference(hf_model: transformers.PreTrainedModel, prompts: list[list[int]]) -> Reference:
    """Greedy tokens from `generate`, then the logits of the whole sequence from one plain forward."""
    hf_model.generation_config.eos_token_id = None  # decode exactly MAX_NEW_TOKENS
    hf_model.generation_config.pad_token_id = 0
    outputs, logits = [], []
    with torch.inference_mode():
        for prompt in prompts:
            ids = torch.tensor([prompt])
            sequence = hf_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_NEW_TOKENS,
                                         do_sample=False)[0]
            outputs.append(sequence[len(prompt):].tolist())
            full = hf_model(sequence[None, :-1]).logits[0].float()
            logits.append(full[len(prompt) - 1:])
    return Reference(outputs, logits)


def assert_matches(seqs: list[Sequence], ref: Reference, logits_atol: float) -> None:
    for i, (seq, expected, expected_logits) in enumerate(zip(seqs, ref.outputs, ref.logits)):
        assert seq.output == expected, f"prompt {i}: tokens differ from transformers"
        diff = (torch.stack(seq.logits) - expected_logits).abs().max().item()
        assert diff <= logits_atol, f"prompt {i}: logits differ by {diff:.2e} > {logits_atol:.0e}"


# ---- tiny random models ----


@pytest.fixture(scope="module", params=list(TINY_MODELS))
def tiny(request, make_tiny_hf_model, device):
    """(our model, transformers reference) for one tiny family."""
    spec = dict(TINY_MODELS[request.param])
    folder = make_tiny_hf_model(spec.pop("family"), name=request.param, **spec)
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager",
                                                                 dtype=torch.float32)
    ref = hf_reference(hf_model, TINY_PROMPTS)
    assert all(len(set(out)) > 3 for out in ref.outputs), "degenerate reference: raise the init scale"
    return load_model(folder, dtype="float32", device=device).model, ref


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_tiny_models_match_transformers(tiny, scenario):
    model, ref = tiny
    seqs = greedy_generate(model, TINY_PROMPTS, **SCENARIOS[scenario])
    assert_matches(seqs, ref, logits_atol=1e-4)


def test_hf_loader_reads_rope_parameters_and_ties(make_tiny_hf_model, device):
    """transformers 5 nests rope settings under `rope_parameters`; the loader must still see them."""
    folder = make_tiny_hf_model("llama", name="rope-check", rope_scaling=LLAMA3_ROPE, rope_theta=50000.0,
                                tie_word_embeddings=True)
    loaded = load_model(folder, device=device)
    assert loaded.arch.rope_theta == 50000.0
    assert loaded.arch.rope_scaling["rope_type"] == "llama3"
    assert loaded.model.lm_head is loaded.model.model.embed_tokens
    assert loaded.eos_token_ids == {257}


# ---- the real SmolLM2-135M-Instruct GGUF ----

SMOLLM2_CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You answer in one word."}, {"role": "user", "content": "Color of the sky?"}],
    [{"role": "user", "content": "Write a Python function that reverses a string."}],
]
SMOLLM2_RAW = ["Once upon a time, in a small village by the sea,", "1, 2, 3, 5, 8, 13,"]
# Our model and transformers dequantize the same blocks with the same `gguf` code, so the weights are
# bit-identical; the logits differ only by float32 summation order (fused q|k|v and gate|up matmuls,
# `x @ W` vs `F.linear`, SDPA vs eager softmax), measured at ~5e-5 on logits of magnitude ~25. 1e-3
# leaves margin for other BLAS builds while still catching any real mistake (those move logits by >0.1).
SMOLLM2_LOGITS_ATOL = 1e-3


@pytest.fixture(scope="module")
def smollm2_hf(smollm2_path: Path):
    return transformers.AutoModelForCausalLM.from_pretrained(smollm2_path.parent, gguf_file=smollm2_path.name,
                                                             dtype=torch.float32)


@pytest.mark.slow
def test_smollm2_gguf_matches_transformers(smollm2, smollm2_hf):
    tokenizer = smollm2.tokenizer
    prompts = [tokenizer.encode(tokenizer.apply_chat_template(chat)) for chat in SMOLLM2_CHATS]
    prompts += [tokenizer.encode(text) for text in SMOLLM2_RAW]
    ref = hf_reference(smollm2_hf, prompts)
    # all five requests in one flat batch, arriving at different steps, prompts cut into chunks of 16
    seqs = greedy_generate(smollm2.model, prompts, arrivals=[0, 1, 2, 3, 4], chunk_size=16, num_blocks=128)
    assert_matches(seqs, ref, logits_atol=SMOLLM2_LOGITS_ATOL)


@pytest.mark.slow
def test_smollm2_bfloat16_agrees_with_float32(smollm2):
    """bfloat16 rounds every activation to 8 bits of mantissa: not bitwise parity, but the same first
    greedy token on every prompt and closely correlated logits. (Casting the float32 model equals loading
    in bfloat16: both round the same float32 weights and rotary tables once.)"""
    bf16_model = copy.deepcopy(smollm2.model).to(torch.bfloat16)
    prompts = [smollm2.tokenizer.encode(text) for text in SMOLLM2_RAW]
    fp32_seqs = greedy_generate(smollm2.model, prompts, max_new_tokens=1, arrivals=[0, 0])
    bf16_seqs = greedy_generate(bf16_model, prompts, max_new_tokens=1, arrivals=[0, 0])
    for a, b in zip(fp32_seqs, bf16_seqs):
        assert a.output == b.output
        assert torch.corrcoef(torch.stack([a.logits[0], b.logits[0]]))[0, 1] > 0.99
