"""Reference solutions of lesson 2's exercises (E02.1, E02.2, E02.3). Try them yourself first.

E02.1 is the arithmetic of `ArchConfig.kv_bytes_per_token` (core/arch_config.py) plus the
rounding to whole blocks that `KVCacheManager` does (core/kv_cache_manager.py). E02.2 wraps the
engine's `BlockPool` (core/block_pool.py), which already keeps a FIFO free queue and reference
counts; only `share` is new here (the engine adds sharing with prefix caching, lesson 4). E02.3 is the
stub's code with its one bug fixed.

Lesson: lessons/02-paged-attention.md#exercises
"""

from __future__ import annotations

from core.arch_config import ArchConfig
from core.block_pool import BlockPool
from core.math_utils import cdiv

__all__ = ["BlockAllocator", "SequenceBlockTables", "kv_bytes_per_sequence", "kv_bytes_per_token",
           "max_num_sequences"]


def kv_bytes_per_token(arch: ArchConfig, dtype_bytes: int = 2) -> int:
    """E02.1a: K and V (2) x layers x KV heads x head_dim x bytes per number; the engine's own method."""
    return arch.kv_bytes_per_token(dtype_bytes)


def kv_bytes_per_sequence(arch: ArchConfig, num_tokens: int, block_size: int = 16, dtype_bytes: int = 2) -> int:
    """E02.1b: whole blocks: ceil(tokens / block_size) x block_size slots x bytes per token."""
    return cdiv(num_tokens, block_size) * block_size * kv_bytes_per_token(arch, dtype_bytes)


def max_num_sequences(arch: ArchConfig, kv_cache_memory: int, num_tokens: int, block_size: int = 16,
                      dtype_bytes: int = 2) -> int:
    """E02.1c: whole blocks in the memory, divided by whole blocks per sequence (both rounded down/up)."""
    num_blocks = kv_cache_memory // (block_size * kv_bytes_per_token(arch, dtype_bytes))
    return num_blocks // cdiv(num_tokens, block_size)


class BlockAllocator:
    """E02.2: the engine's `BlockPool` under the exercise's names, plus `share`."""

    def __init__(self, num_blocks: int) -> None:
        self._pool = BlockPool(num_blocks)

    @property
    def num_free_blocks(self) -> int:
        return self._pool.num_free_blocks

    def ref_count(self, block_id: int) -> int:
        return self._pool.ref_cnt[block_id]

    def allocate(self, n: int) -> list[int]:
        return self._pool.get_new_blocks(n)

    def share(self, block_ids: list[int]) -> None:
        for b in block_ids:
            if self._pool.ref_cnt[b] <= 0:
                raise RuntimeError(f"block {b} is free, so there is nothing to share")
        for b in block_ids:
            self._pool.ref_cnt[b] += 1

    def free(self, block_ids: list[int]) -> None:
        self._pool.free_blocks(block_ids)


class SequenceBlockTables:
    """E02.3 (debug), fixed: `fork` must take a reference to every block the child now shares
    (`BlockPool.touch` adds one to each count). Without it the counts say 1 while two tables hold the
    block, so copy-on-write never triggers (both sequences write into the shared last block) and the
    parent's `free` returns blocks the child still uses to the free queue."""

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
        self.pool.touch(blocks)  # the child now holds these blocks too: one more reference each
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
