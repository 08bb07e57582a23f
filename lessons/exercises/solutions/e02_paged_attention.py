"""Reference solutions of lesson 2's exercises (E02.1, E02.2). Try them yourself first.

E02.1 is the arithmetic of `ArchConfig.kv_bytes_per_token` (ref_engine/model/arch_config.py) plus the
rounding to whole blocks that `KVCacheManager` does (ref_engine/core/kv_cache_manager.py). E02.2 wraps the
engine's `BlockPool` (ref_engine/core/block_pool.py), which already keeps a FIFO free queue and reference
counts; only `share` is new here (the engine adds sharing with prefix caching, lesson 4).

Lesson: lessons/02-paged-attention.md#exercises
"""

from __future__ import annotations

from ref_engine.core.block_pool import BlockPool
from ref_engine.core.math_utils import cdiv
from ref_engine.model.arch_config import ArchConfig

__all__ = ["BlockAllocator", "kv_bytes_per_sequence", "kv_bytes_per_token", "max_num_sequences"]


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
