"""Exercises of lesson 2, "PagedAttention: the KV cache as virtual memory": E02.1, E02.2 and E02.3.

Write the bodies below, then check them from the repository root:

    pytest tests/exercises/test_e02_paged_attention.py --impl=learner          # all three exercises
    pytest tests/exercises/test_e02_paged_attention.py --impl=learner -k e02_2 # one

The tests check E02.1 against the engine's own arithmetic (`ArchConfig.kv_bytes_per_token`, and how
many requests the real `KVCacheManager` admits) and E02.2 against the real `BlockPool`, operation by
operation. Reference solutions: lessons/exercises/solutions/e02_paged_attention.py.

Lesson: lessons/02-paged-attention.md#exercises
"""

from __future__ import annotations

from core.arch_config import ArchConfig
from core.block_pool import BlockPool


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
    The engine's version is `BlockPool` in core/block_pool.py: try without reading it.

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


class SequenceBlockTables:
    """E02.3 (debug): block tables for sequences that can fork, and a bug that corrupts the KV cache.

    This is the layer above the block pool (lesson 2, "The block pool"): it keeps each sequence's block
    table, grows it one token at a time, and lets a sequence fork into a child that shares all the blocks
    written so far, as parallel sampling (n > 1) and beam search do. A shared block must never be written:
    when a sequence is about to write into a last block that someone else also holds, it first gets its own
    copy (copy-on-write). The pool underneath is the engine's `BlockPool`, whose reference counts say how
    many tables hold each block.

    The code below runs, and most of the time it looks right. It is not: `pytest tests/exercises
    --impl=learner -k e02_3` replays a short trace in which two sequences write their next token into the
    same KV slot, so one of them later reads the other's keys and values, and a random trace that breaks an
    invariant of the pool. Read the traces, find the mistake, fix it here. Keep the method
    signatures: the tests call them.

    Interview questions: Q-PAGE-03, Q-PAGE-01 (lessons/interview-bank.md#q-page-03).
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.pool = BlockPool(num_blocks)
        self.block_size = block_size
        self.tables: dict[str, list[int]] = {}  # sequence id -> its block ids, in position order
        self.num_tokens: dict[str, int] = {}  # sequence id -> tokens whose K/V it holds
        self.copies: list[tuple[int, int]] = []  # (source, destination) block copies the runner must do

    def table(self, seq_id: str) -> list[int]:
        """The block table of a sequence: position p lives in block `table[p // block_size]`."""
        return list(self.tables[seq_id])

    def add(self, seq_id: str, num_tokens: int) -> list[int]:
        """A new sequence whose prompt has `num_tokens` tokens: ceil(num_tokens / block_size) fresh blocks."""
        if seq_id in self.tables:
            raise ValueError(f"sequence {seq_id!r} exists already")
        needed = -(-num_tokens // self.block_size)
        if needed > self.pool.num_free_blocks:
            raise RuntimeError(f"{needed} blocks needed, {self.pool.num_free_blocks} free")
        self.tables[seq_id] = self.pool.get_new_blocks(needed)
        self.num_tokens[seq_id] = num_tokens
        return self.table(seq_id)

    def fork(self, parent_id: str, child_id: str) -> list[int]:
        """A child that continues from everything the parent holds (parallel sampling, beam search): it
        shares all of the parent's blocks instead of copying them."""
        if child_id in self.tables:
            raise ValueError(f"sequence {child_id!r} exists already")
        blocks = list(self.tables[parent_id])
        self.tables[child_id] = blocks
        self.num_tokens[child_id] = self.num_tokens[parent_id]
        return self.table(child_id)

    def append_slot(self, seq_id: str) -> int:
        """Make room for the sequence's next token and return the slot its K/V will be written to.

        A full last block (or none at all) means a new block. A last block with room that another sequence
        also holds must not be written: copy-on-write gives this sequence a fresh block, records the copy
        (old, new) in `copies` for the runner, and drops this sequence's reference to the old block."""
        table, pos = self.tables[seq_id], self.num_tokens[seq_id]
        if pos == len(table) * self.block_size:
            if self.pool.num_free_blocks < 1:
                raise RuntimeError("no free block")
            table.append(self.pool.get_new_blocks(1)[0])
        elif self.pool.ref_cnt[table[-1]] > 1:
            if self.pool.num_free_blocks < 1:
                raise RuntimeError("no free block")
            new = self.pool.get_new_blocks(1)[0]
            self.copies.append((table[-1], new))
            self.pool.free_blocks([table[-1]])
            table[-1] = new
        self.num_tokens[seq_id] = pos + 1
        return table[pos // self.block_size] * self.block_size + pos % self.block_size

    def free(self, seq_id: str) -> None:
        """The sequence is finished: drop its reference to each of its blocks, last block first."""
        table = self.tables.pop(seq_id)
        del self.num_tokens[seq_id]
        self.pool.free_blocks(table[::-1])
