"""Reference solutions of lesson 4's exercises (E04.1, E04.2, E04.3). Try them yourself first.

E04.1 is what `extend_block_hashes` (core/block_hash.py) and
`KVCacheManager.get_computed_blocks` (core/kv_cache_manager.py) do, without the block pool:
the cache is a plain dict from hash to the block's tokens. E04.2 is the whole-block arithmetic the
simulator's hits follow (`hit_rate_sweep` in course/prefix_caching.py prints the same formula).
E04.3 is the stub's code with its bug fixed.

Lesson: lessons/04-prefix-caching.md#exercises
"""

from __future__ import annotations

from collections.abc import Sequence

from core.block_hash import extend_block_hashes, hash_block_tokens
from core.block_pool import BlockPool

__all__ = ["SmallPrefixCache", "block_hashes", "cached_tokens_per_request", "num_cached_tokens",
           "prefill_tokens_saved", "prefix_cache_hit_rate"]


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


class SmallPrefixCache:
    """E04.3 (debug), fixed: `finish` must free a request's blocks last block first. The free queue evicts in
    the order blocks were freed, and a chain is only as long as its first missing block: freed head first, a
    prefix loses its head to the next allocation while its tail stays cached, unreachable, and takes room
    from blocks that could still hit. Freed tail first, eviction eats prefixes from the end, which more
    requests share least (`KVCacheManager.free` does this, as vLLM does)."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.pool = BlockPool(num_blocks)
        self.block_size = block_size
        self.tables: dict[str, list[int]] = {}  # running request id -> its block ids, in position order

    def chain(self, token_ids: Sequence[int]) -> list[bytes]:
        """The hash chain of the full blocks of `token_ids` (the engine's own `extend_block_hashes`)."""
        hashes: list[bytes] = []
        extend_block_hashes(hashes, list(token_ids), self.block_size, b"")
        return hashes

    def serve(self, request_id: str, token_ids: Sequence[int]) -> int:
        """Admit a request and return how many of its prompt tokens come from the cache.

        Its leading full blocks are looked up along the chain, stopping at the first miss; only the blocks
        of all tokens but the last are looked up, since the last token must be computed for its logits. Hit
        blocks are shared (one more reference each); the rest of the prompt gets fresh blocks from the head
        of the free queue, evicting whatever they cached; every full block is then registered under its hash.
        Raises RuntimeError, changing nothing, when the pool cannot hold the request."""
        bs = self.block_size
        hits: list[int] = []
        for i, block_hash in enumerate(self.chain(token_ids[:-1])):
            block = self.pool.get_cached_block(block_hash, tuple(token_ids[i * bs:(i + 1) * bs]))
            if block is None:
                break
            hits.append(block)
        needed = -(-len(token_ids) // bs) - len(hits)
        available = self.pool.num_free_blocks - sum(1 for b in hits if self.pool.ref_cnt[b] == 0)
        if needed > available:
            raise RuntimeError(f"{needed} blocks needed, {available} free")
        self.pool.touch(hits)
        table = hits + self.pool.get_new_blocks(needed)
        for i, block_hash in enumerate(self.chain(token_ids)):
            if i >= len(hits):
                self.pool.cache_block(table[i], block_hash, tuple(token_ids[i * bs:(i + 1) * bs]))
        self.tables[request_id] = table
        return len(hits) * bs

    def finish(self, request_id: str) -> None:
        """The request is done: its blocks go back to the free queue, contents kept, for later hits."""
        table = self.tables.pop(request_id)
        self.pool.free_blocks(table[::-1])  # last block first: tails are evicted before heads
