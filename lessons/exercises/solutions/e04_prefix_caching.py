"""Reference solutions of lesson 4's exercises (E04.1, E04.2). Try them yourself first.

E04.1 is what `extend_block_hashes` (ref_engine/core/block_hash.py) and
`KVCacheManager.get_computed_blocks` (ref_engine/core/kv_cache_manager.py) do, without the block pool:
the cache is a plain dict from hash to the block's tokens. E04.2 is the whole-block arithmetic the
simulator's hits follow (`hit_rate_sweep` in serving_lab/experiments/prefix.py prints the same formula).

Lesson: lessons/04-prefix-caching.md#exercises
"""

from __future__ import annotations

from collections.abc import Sequence

from ref_engine.core.block_hash import hash_block_tokens

__all__ = ["block_hashes", "cached_tokens_per_request", "num_cached_tokens", "prefill_tokens_saved",
           "prefix_cache_hit_rate"]


def block_hashes(token_ids: Sequence[int], block_size: int, extra_keys: bytes = b"") -> list[bytes]:
    """E04.1a: one link per full block, each chained to its parent's hash."""
    hashes: list[bytes] = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hashes[-1] if hashes else None
        hashes.append(hash_block_tokens(parent, list(token_ids[start:start + block_size]), extra_keys))
    return hashes


def num_cached_tokens(token_ids: Sequence[int], cache: dict[bytes, tuple[int, ...]], block_size: int,
                      extra_keys: bytes = b"") -> int:
    """E04.1b: walk the chain while the hash is cached and its tokens match; cap at n - 1 tokens."""
    hits = 0
    for i, block_hash in enumerate(block_hashes(token_ids, block_size, extra_keys)):
        tokens = tuple(token_ids[i * block_size:(i + 1) * block_size])
        if cache.get(block_hash) != tokens:  # absent, or a collision: a miss either way
            break
        hits += 1
    return max(0, min(hits * block_size, len(token_ids) - 1))


def cached_tokens_per_request(prefix_len: int, suffix_len: int, block_size: int) -> int:
    """E04.2a: whole blocks of the prefix, but never the prompt's last token."""
    return min((prefix_len // block_size) * block_size, max(prefix_len + suffix_len - 1, 0))


def prefix_cache_hit_rate(prefix_len: int, suffix_len: int, block_size: int) -> float:
    """E04.2b: cached tokens / prompt tokens."""
    prompt_len = prefix_len + suffix_len
    return cached_tokens_per_request(prefix_len, suffix_len, block_size) / prompt_len if prompt_len else 0.0


def prefill_tokens_saved(num_requests: int, prefix_len: int, suffix_len: int, block_size: int) -> int:
    """E04.2c: every request skips its cached tokens."""
    return num_requests * cached_tokens_per_request(prefix_len, suffix_len, block_size)
