"""Exercises of lesson 4, "Prefix caching": E04.1, E04.2 and E04.3.

Write the bodies below, then check them from the repository root:

    pytest tests/exercises/test_e04_prefix_caching.py --impl=learner          # all three exercises
    pytest tests/exercises/test_e04_prefix_caching.py --impl=learner -k e04_1 # one

The tests check E04.1 against the engine's own hash chain (`extend_block_hashes`) and lookup
(`KVCacheManager.get_computed_blocks`), on random prompts that share random prefixes, and E04.2 against
the prefix-cache hits the simulator counts when it serves a shared-prefix workload after a warm-up.
E04.3 is a debug exercise: its code is written and has a bug, which its tests' traces expose.
Reference solutions: lessons/exercises/solutions/e04_prefix_caching.py.

Lesson: lessons/04-prefix-caching.md#exercises
"""

from __future__ import annotations

from collections.abc import Sequence

from core.block_hash import (
    extend_block_hashes,
    hash_block_tokens,  # noqa: F401  (one link of the chain: use it, don't rewrite it)
)
from core.block_pool import BlockPool


def block_hashes(token_ids: Sequence[int], block_size: int, extra_keys: bytes = b"") -> list[bytes]:
    """E04.1 (implement), part a: the hash chain of the full blocks of `token_ids`.

    Block i holds tokens [i * block_size, (i + 1) * block_size). Its hash is
    `hash_block_tokens(parent, tokens of block i, extra_keys)`, where `parent` is the hash of block i - 1
    (None for block 0). A trailing partial block has no hash: it can still change. Example with
    block_size 4: 10 tokens give 2 hashes; 3 tokens give none.

    Interview questions: Q-PREFIX-02 (lessons/interview-bank.md#q-prefix-02).
    """
    raise NotImplementedError("E04.1: the hash chain of the full blocks")


def num_cached_tokens(token_ids: Sequence[int], cache: dict[bytes, tuple[int, ...]], block_size: int,
                      extra_keys: bytes = b"") -> int:
    """E04.1 (implement), part b: how many leading tokens of this prompt the prefix cache serves.

    `cache` maps the hash of every cached block to the tokens stored in that block. Walk the prompt's
    chain from block 0 and stop at the first block that is not in the cache, or whose stored tokens
    differ from the prompt's (a hash collision must be a miss, never wrong K/V). Then apply the
    last-token rule: the engine needs the logits of the prompt's last token, so it always computes at
    least that one token; the answer is at most len(token_ids) - 1.

    Examples with block_size 4, after the 8-token prompt [1..8] was computed and cached:
    [1..8, 9, 10] -> 8; [1, 2, 3, 4, 0, 0, 0, 0, 9] -> 4; [1..8] itself -> 7; [1, 2, 3] -> 0.

    Interview questions: Q-PREFIX-02, Q-PREFIX-03 (lessons/interview-bank.md#q-prefix-03).
    """
    raise NotImplementedError("E04.1: the longest cached prefix, with the last-token rule")


def cached_tokens_per_request(prefix_len: int, suffix_len: int, block_size: int) -> int:
    """E04.2 (estimate), part a: prompt tokens the cache serves to one request of a warm shared-prefix
    workload.

    Every prompt is the same `prefix_len`-token prefix (a system prompt) followed by its own
    `suffix_len` tokens (the user's question), and an earlier request with the same prefix has already
    been served. Work it out by hand first for a 100-token system prompt, 20-token questions and
    16-token blocks. Mind the last token when `suffix_len` is 0.
    """
    raise NotImplementedError("E04.2: cached tokens per request")


def prefix_cache_hit_rate(prefix_len: int, suffix_len: int, block_size: int) -> float:
    """E04.2 (estimate), part b: the prefix-cache hit rate of that workload, as vLLM counts it: cached
    prompt tokens / prompt tokens looked up (`prefix_cache_hits / prefix_cache_queries`).

    Interview questions: Q-PREFIX-01, Q-PREFIX-03 (lessons/interview-bank.md#q-prefix-03).
    """
    raise NotImplementedError("E04.2: the hit rate")


def prefill_tokens_saved(num_requests: int, prefix_len: int, suffix_len: int, block_size: int) -> int:
    """E04.2 (estimate), part c: prompt tokens `num_requests` such requests do not prefill, compared with
    the same requests served with prefix caching off."""
    raise NotImplementedError("E04.2: prefill tokens saved")


class SmallPrefixCache:
    """E04.3 (debug): a prefix cache whose repeats miss although their blocks are still cached.

    A prefix cache in miniature, on the engine's own `BlockPool` and hash chain: `serve` admits a request,
    reusing its cached leading blocks; `finish` hands its blocks back to the free queue, where they stay
    findable until an allocation evicts them, least recently freed first (lesson 4, "Eviction under memory
    pressure"). No request ever gets a wrong K/V here, and the pool's invariants hold. Yet under memory
    pressure the hit rate is lower than it should be: `pytest tests/exercises --impl=learner -k e04_3`
    replays a trace where a prompt comes back after one unrelated request and hits nothing, although most of
    its blocks are still in the cache, and random traces that end in the same state. Find out why from the
    traces, fix it here, and keep the method signatures: the tests call them.

    Interview questions: Q-PREFIX-05, Q-PREFIX-03 (lessons/interview-bank.md#q-prefix-05).
    """

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
        self.pool.free_blocks(table)
