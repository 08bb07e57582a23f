"""Exercises of lesson 2, "PagedAttention: the KV cache as virtual memory": E02.1 and E02.2.

Write the bodies below, then check them from the repository root:

    pytest tests/exercises/test_e02_paged_attention.py --impl=learner          # both exercises
    pytest tests/exercises/test_e02_paged_attention.py --impl=learner -k e02_2 # one

The tests check E02.1 against the engine's own arithmetic (`ArchConfig.kv_bytes_per_token`, and how
many requests the real `KVCacheManager` admits) and E02.2 against the real `BlockPool`, operation by
operation. Reference solutions: lessons/exercises/solutions/e02_paged_attention.py.

Lesson: lessons/02-paged-attention.md#exercises
"""

from __future__ import annotations

from ref_engine.model.arch_config import ArchConfig


def kv_bytes_per_token(arch: ArchConfig, dtype_bytes: int = 2) -> int:
    """E02.1 (estimate), part a: bytes of K and V that one token leaves in the cache, over all layers.

    Every layer stores one key and one value vector per KV head (`arch.num_kv_heads`, fewer than the query
    heads with grouped-query attention), each `arch.head_dim` numbers of `dtype_bytes` bytes.
    Work it out by hand first for Llama-3.1-8B in bf16 (`ArchConfig.named("llama-3.1-8b")`: 32 layers,
    8 KV heads, head_dim 128), then write the formula.
    """
    raise NotImplementedError("E02.1: KV bytes per token")


def kv_bytes_per_sequence(arch: ArchConfig, num_tokens: int, block_size: int = 16, dtype_bytes: int = 2) -> int:
    """E02.1 (estimate), part b: KV bytes a sequence of `num_tokens` tokens holds in a paged cache.

    The cache hands out whole blocks of `block_size` token slots, so a sequence holds its tokens rounded
    up to a multiple of `block_size`. Example: 20 tokens with 16-token blocks hold 2 blocks = 32 slots.
    """
    raise NotImplementedError("E02.1: KV bytes per sequence, in whole blocks")


def max_num_sequences(arch: ArchConfig, kv_cache_memory: int, num_tokens: int, block_size: int = 16,
                      dtype_bytes: int = 2) -> int:
    """E02.1 (estimate), part c: how many sequences of `num_tokens` tokens fit at once in the KV cache.

    The engine cuts `kv_cache_memory` bytes into as many whole blocks as fit (a block is `block_size`
    tokens of K and V in every layer); each sequence needs its own whole blocks. Example to try by hand:
    Llama-3.1-8B in bf16, 16 GiB of KV cache, 2048-token sequences.

    Interview questions: Q-KV-01, Q-KV-02 (lessons/interview-bank.md#q-kv-01).
    """
    raise NotImplementedError("E02.1: sequences that fit in the KV cache")


class BlockAllocator:
    """E02.2 (implement): the block pool of a paged KV cache, with reference counts.

    `num_blocks` blocks, numbered 0 .. num_blocks - 1, all free at first. A block is free when its
    reference count is 0; an owner (a request's block table) holds one reference. Two owners may share a
    block (a forked sequence, or a cached prompt prefix in lesson 4): the block comes back only when the
    last owner lets go. Free blocks are reused in the order they were freed (first in, first out; at the
    start, in id order): with prefix caching, a freed block still holds its tokens and might be hit again,
    so the one freed longest ago is the best to overwrite.

    Errors raise `RuntimeError`: asking for more blocks than are free, sharing or freeing a free block.
    The engine's version is `BlockPool` in ref_engine/core/block_pool.py: try without reading it.

    Example: with 4 blocks, allocate(3) -> [0, 1, 2]; free([1]); free([0]); allocate(2) -> [3, 1].

    Interview questions: Q-PAGE-01, Q-PAGE-03 (lessons/interview-bank.md#q-page-03).
    """

    def __init__(self, num_blocks: int) -> None:
        raise NotImplementedError("E02.2: set up the free queue and the reference counts")

    @property
    def num_free_blocks(self) -> int:
        """How many blocks are free."""
        raise NotImplementedError("E02.2: count free blocks")

    def ref_count(self, block_id: int) -> int:
        """How many owners hold `block_id` (0 when free)."""
        raise NotImplementedError("E02.2: the reference count of a block")

    def allocate(self, n: int) -> list[int]:
        """Take `n` free blocks, oldest-freed first, each with reference count 1."""
        raise NotImplementedError("E02.2: allocate n blocks")

    def share(self, block_ids: list[int]) -> None:
        """Another owner takes a reference to each of these (used) blocks."""
        raise NotImplementedError("E02.2: share blocks")

    def free(self, block_ids: list[int]) -> None:
        """Drop one reference to each block; a block whose count reaches 0 joins the free queue."""
        raise NotImplementedError("E02.2: free blocks")
