"""The batched regimes every engine fast path must survive (tests/engine/test_fast_paths.py, test_compile.py):
chunked prefill, preemption by recompute and by swap, prefix-cache hits and n-gram speculation, on one set of
prompts on a tiny model. `BATCHED_REGIMES` parametrizes a test's `knobs` (the LLM's keyword arguments)."""

from __future__ import annotations

import pytest

BATCHED_REGIMES = pytest.mark.parametrize("knobs", [
    dict(max_num_batched_tokens=16),  # chunked prefill
    dict(num_kv_blocks=24, max_num_seqs=16, preemption_mode="recompute"),
    dict(num_kv_blocks=24, max_num_seqs=16, preemption_mode="swap", num_swap_blocks=64),
    dict(speculative_method="ngram", num_speculative_tokens=3),
], ids=["chunked-prefill", "preempt-recompute", "preempt-swap", "ngram-speculation"])


def regime_prompts() -> list[list[int]]:
    """12 prompts of 20-53 tokens, then 4 sharing the first one's 16-token prefix (prefix-cache hits)."""
    prompts = [[1 + (i * 7 + j) % 200 for j in range(20 + 3 * i)] for i in range(12)]
    return prompts + [prompts[0][:16] + [9, 9, 9, i] for i in range(4)]
