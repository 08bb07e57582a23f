"""The eval set: what a knob that changes the engine's numbers (dtype, quantization, KV-cache dtype) costs
in quality.

A speed-up is only half of a knob's story; the other half is how far its outputs move from the float32
reference. The eval set is 200 chat prompts the project writes (`eval_prompts`: ten kinds of request,
from explaining to coding to translating, about twenty topics each), and a knob is judged against the
reference on two numbers (`compare_quality`):

- greedy agreement: the share of positions, over `max_tokens` new tokens, where the knob's greedy output
  has the reference's token. Harsh: one flipped near-tie and the rest of the text differs;
- mean KL divergence KL(reference || knob) of the next-token distributions, teacher-forced along the
  reference's greedy continuation (both models read the same tokens), in nats per token. Smooth: it
  sees a distribution move before its argmax flips.

Lesson: lessons/01-continuous-batching.md (the cost of a step: faster steps, and what they cost).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ref_engine.attention import AttentionMetadata, allocate_kv_cache, kv_cache_torch_dtype
from ref_engine.engine import LLM
from ref_engine.model.loader import LoadedModel
from ref_engine.sampling_params import SamplingParams

TASKS = (
    "Explain {} to a new engineer in one paragraph.",
    "Give three facts about {}.",
    "Write a short Python function related to {}, with a docstring.",
    "What is a common misconception about {}?",
    "Summarize the history of {} in two sentences.",
    "Translate to French: 'I am learning about {} today.'",
    "Write a haiku about {}.",
    "List the pros and cons of {}.",
    "Compare {} with something similar, briefly.",
    "Ask me three quiz questions about {}.",
)
TOPICS = (
    "the KV cache", "photosynthesis", "binary search", "the French Revolution", "black holes",
    "sorting algorithms", "climate change", "the human heart", "prime numbers", "the Roman Empire",
    "neural networks", "volcanoes", "hash tables", "the water cycle", "electric cars", "jazz music",
    "vaccines", "the stock market", "recursion", "coffee",
)


def eval_prompts(num_prompts: int | None = None) -> list[str]:
    """The first `num_prompts` (default all 200) user messages of the eval set, ordered so that any
    prefix mixes kinds of request and topics."""
    prompts = [TASKS[i % len(TASKS)].format(TOPICS[(i + i // len(TOPICS)) % len(TOPICS)])
               for i in range(len(TASKS) * len(TOPICS))]
    return prompts if num_prompts is None else prompts[:num_prompts]


@dataclass(frozen=True)
class Quality:
    """A knob against the float32 reference on the eval set."""

    agreement: float  # share of greedy positions with the reference's token
    mean_kl: float  # mean KL(reference || knob) per token, nats
    num_prompts: int
    max_tokens: int


def chat_token_ids(loaded: LoadedModel, prompts: list[str]) -> list[list[int]]:
    """Each user message rendered with the model's chat template, as token ids."""
    tokenizer = loaded.tokenizer
    return [tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": p}]),
                             add_special_tokens=False) for p in prompts]


def greedy_continuations(loaded: LoadedModel, prompt_ids: list[list[int]], max_tokens: int,
                         kv_cache_dtype: str = "auto") -> list[list[int]]:
    """`max_tokens` greedy tokens after each prompt (EOS ignored, so every continuation is full length),
    generated in one continuously batched run."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    llm = LLM(loaded, kv_cache_dtype=kv_cache_dtype)
    outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


@torch.inference_mode()
def sequence_hidden_states(loaded: LoadedModel, token_ids: list[int], block_size: int = 16,
                           kv_cache_dtype: str = "auto") -> torch.Tensor:
    """The final hidden states `[len(token_ids), hidden]` (what the LM head reads) after each position: one
    prefill of the whole sequence through the engine's model (its own paged attention, a pool just big enough)."""
    model, n = loaded.model, len(token_ids)
    device = next(model.parameters()).device
    num_blocks = -(-n // block_size)
    cache_dtype = kv_cache_torch_dtype(kv_cache_dtype, next(model.parameters()).dtype)
    kv_caches = allocate_kv_cache(loaded.arch, num_blocks, block_size, cache_dtype, device)
    meta = AttentionMetadata.build([n], [n], [list(range(num_blocks))], block_size, device)
    return model(torch.tensor(token_ids, device=device), torch.arange(n, device=device), kv_caches, meta)


@torch.inference_mode()
def sequence_logprobs(loaded: LoadedModel, token_ids: list[int], block_size: int = 16,
                      kv_cache_dtype: str = "auto") -> torch.Tensor:
    """Log-probabilities `[len(token_ids), vocab]` of the next token after each position
    (`sequence_hidden_states`, then the model's LM head)."""
    hidden = sequence_hidden_states(loaded, token_ids, block_size, kv_cache_dtype)
    return torch.log_softmax(loaded.model.compute_logits(hidden).float(), dim=-1)


def compare_quality(reference: LoadedModel, candidates: Sequence[LoadedModel], prompts: list[str],
                    max_tokens: int = 64, kv_cache_dtype: str = "auto") -> list[Quality]:
    """Each of `candidates` (dtypes or quantizations of `reference`'s weights), run with `kv_cache_dtype`,
    against `reference` with its own dtype's cache on `prompts`; the reference's greedy texts and
    distributions are computed once for all of them."""
    prompt_ids = chat_token_ids(reference, prompts)
    expected = greedy_continuations(reference, prompt_ids, max_tokens)
    got = [greedy_continuations(candidate, prompt_ids, max_tokens, kv_cache_dtype) for candidate in candidates]
    kl_sums = [0.0] * len(candidates)
    for ids, continuation in zip(prompt_ids, expected):
        sequence = ids + continuation
        # the distributions that chose each continuation token: after the prompt's last token, and so on
        rows = slice(len(ids) - 1, len(sequence) - 1)
        p = sequence_logprobs(reference, sequence)[rows]
        for c, candidate in enumerate(candidates):
            q = sequence_logprobs(candidate, sequence, kv_cache_dtype=kv_cache_dtype)[rows]
            kl_sums[c] += float((p.exp() * (p - q)).sum())
    num_tokens = len(prompts) * max_tokens
    return [Quality(sum(sum(a == b for a, b in zip(e, g)) for e, g in zip(expected, texts)) / num_tokens,
                    kl_sum / num_tokens, len(prompts), max_tokens)
            for texts, kl_sum in zip(got, kl_sums)]
