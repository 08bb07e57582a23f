"""`KVCacheManager`: each request's block table, on top of the block pool.

A block table maps a request's token positions to physical blocks: position p lives in block
`table[p // block_size]`, slot `p % block_size`. PagedAttention's point is that these blocks need not be
contiguous, so a request takes a block only when its tokens reach it, and frees them all when done.

Three allocation modes (`EngineConfig.kv_allocation`) let lesson 2 measure what paging saves:
- "paged": take blocks as tokens arrive (vLLM);
- "contiguous": reserve `max_model_len` tokens up front, as pre-vLLM servers did;
- "contiguous_exact": reserve prompt + max_tokens up front (an oracle that knows the output length).
Live tokens (the scheduler counts them) vs `num_reserved_slots` is the fragmentation a lesson plots.

Preemption by swap moves a request's blocks to a host pool and back; the manager only decides which block
goes where and returns the copy plan, which executors carry out.

Lesson: lessons/02-paged-attention.md (block tables and allocation).
"""

from __future__ import annotations

from ref_engine.core.block_pool import BlockPool
from ref_engine.core.config import KVAllocation
from ref_engine.core.request import Request


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    def __init__(self, block_size: int, num_blocks: int, *, num_swap_blocks: int = 0,
                 allocation: KVAllocation = "paged", max_model_len: int = 2048) -> None:
        self.block_size = block_size
        self.allocation = allocation
        self.max_model_len = max_model_len
        self.block_pool = BlockPool(num_blocks)
        self.host_pool = BlockPool(num_swap_blocks)
        self.block_tables: dict[str, list[int]] = {}
        self.host_block_tables: dict[str, list[int]] = {}

    # ---- sizing ----

    def tokens_to_hold(self, request: Request, num_new_tokens: int) -> int:
        """How many token slots the request's table must cover after this step, by allocation mode."""
        needed = request.num_computed_tokens + num_new_tokens
        if self.allocation == "contiguous":
            return max(needed, self.max_model_len)
        if self.allocation == "contiguous_exact":
            return max(needed, request.max_total_tokens)
        return needed

    def max_blocks_needed(self, request: Request) -> int:
        """Blocks the request will hold at its largest; admission refuses one that exceeds the pool."""
        return cdiv(self.tokens_to_hold(request, request.max_total_tokens - request.num_computed_tokens),
                    self.block_size)

    # ---- allocation ----

    def allocate_slots(self, request: Request, num_new_tokens: int) -> list[int] | None:
        """Make room for `num_new_tokens` more tokens of `request`.

        Returns the newly taken block ids (possibly none), or None if the pool lacks free blocks, in which
        case nothing changes and the scheduler must wait or preempt.
        """
        table = self.block_tables.get(request.request_id)
        held = len(table) if table is not None else 0
        missing = cdiv(self.tokens_to_hold(request, num_new_tokens), self.block_size) - held
        if missing <= 0:
            return []  # the common decode step: the last block still has room
        if missing > self.block_pool.num_free_blocks:
            return None
        new_blocks = self.block_pool.get_new_blocks(missing)
        if table is None:
            self.block_tables[request.request_id] = new_blocks[:]
        else:
            table.extend(new_blocks)
        return new_blocks

    def free(self, request_id: str) -> None:
        """Give back every block the request holds, on the device and on the host."""
        self.block_pool.free_blocks(self.block_tables.pop(request_id, []))
        self.host_pool.free_blocks(self.host_block_tables.pop(request_id, []))

    def get_block_ids(self, request_id: str) -> list[int]:
        return self.block_tables.get(request_id, [])

    # ---- swapping (preemption_mode="swap") ----

    def swap_out(self, request_id: str) -> list[tuple[int, int]] | None:
        """Move the request's blocks to the host pool; None if the host pool is too small."""
        table = self.block_tables.get(request_id, [])
        if len(table) > self.host_pool.num_free_blocks:
            return None
        host_blocks = self.host_pool.get_new_blocks(len(table))
        self.block_pool.free_blocks(self.block_tables.pop(request_id))
        self.host_block_tables[request_id] = host_blocks
        return list(zip(table, host_blocks))

    def swap_in(self, request: Request, num_new_tokens: int) -> list[tuple[int, int]] | None:
        """Bring the request's blocks back to the device and make room for `num_new_tokens` more, all or
        nothing; None if the device pool is too small."""
        host_blocks = self.host_block_tables[request.request_id]
        total = max(cdiv(self.tokens_to_hold(request, num_new_tokens), self.block_size), len(host_blocks))
        if total > self.block_pool.num_free_blocks:
            return None
        device_blocks = self.block_pool.get_new_blocks(len(host_blocks))
        self.host_pool.free_blocks(self.host_block_tables.pop(request.request_id))
        self.block_tables[request.request_id] = device_blocks
        self.allocate_slots(request, num_new_tokens)
        return list(zip(host_blocks, device_blocks))

    # ---- statistics ----

    @property
    def usage(self) -> float:
        return self.block_pool.usage

    @property
    def num_reserved_slots(self) -> int:
        """Token slots held by requests on the device (used blocks x block size)."""
        return self.block_pool.num_used_blocks * self.block_size

    def check_invariants(self) -> None:
        """Ref counts equal block-table entries; no block is in two tables (no sharing without caching)."""
        for pool, tables in ((self.block_pool, self.block_tables), (self.host_pool, self.host_block_tables)):
            pool.check_invariants()
            held = [b for t in tables.values() for b in t]
            assert len(held) == len(set(held)), "a block appears in two block tables"
            counts = [0] * pool.num_blocks
            for b in held:
                counts[b] += 1
            assert counts == pool.ref_cnt, "ref counts differ from block-table entries"
