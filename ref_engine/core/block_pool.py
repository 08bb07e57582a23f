"""`BlockPool`: the fixed set of KV-cache blocks, their reference counts and the free queue.

A block is `block_size` token slots of K and V in every layer. The pool hands out block ids and takes them
back; it never sees a request (that is the KV cache manager's job) and never sees a tensor (that is the
runner's). Invariants, checked by `check_invariants` in the property tests:
- every block is either free (ref count 0, in the free queue exactly once) or used (ref count >= 1);
- number of free blocks + number of used blocks = `num_blocks`.
Reference counts are > 1 only when requests share a block (prefix caching builds on that).

Lesson: lessons/02-paged-attention.md (the KV cache as virtual memory).
"""

from __future__ import annotations

from collections import deque


class BlockPool:
    """`num_blocks` blocks numbered 0..num_blocks-1; freed blocks are reused first-in, first-out."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 0:
            raise ValueError(f"num_blocks must be >= 0, got {num_blocks}")
        self.num_blocks = num_blocks
        self.ref_cnt = [0] * num_blocks
        self._free: deque[int] = deque(range(num_blocks))

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of blocks in use (vLLM's `kv_cache_usage`)."""
        return self.num_used_blocks / self.num_blocks if self.num_blocks else 0.0

    def get_new_blocks(self, n: int) -> list[int]:
        """Take `n` free blocks (ref count 1 each). The caller checks `num_free_blocks` first."""
        if n > len(self._free):
            raise RuntimeError(f"asked for {n} blocks, only {len(self._free)} free")
        blocks = [self._free.popleft() for _ in range(n)]
        for b in blocks:
            self.ref_cnt[b] = 1
        return blocks

    def free_blocks(self, block_ids: list[int]) -> None:
        """Drop one reference to each block; a block whose count reaches 0 goes back to the free queue."""
        for b in block_ids:
            if self.ref_cnt[b] <= 0:
                raise RuntimeError(f"block {b} freed while not in use")
            self.ref_cnt[b] -= 1
            if self.ref_cnt[b] == 0:
                self._free.append(b)

    def check_invariants(self) -> None:
        free = set(self._free)
        assert len(free) == len(self._free), "a block is in the free queue twice"
        for b in range(self.num_blocks):
            assert self.ref_cnt[b] >= 0, f"block {b} has a negative ref count"
            assert (self.ref_cnt[b] == 0) == (b in free), f"block {b}: ref count and free queue disagree"
