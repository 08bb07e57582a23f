"""`KVPoolSnapshot`: the device's KV block pool at one instant, for a live picture of it (the dashboard).

Every block is in one of four states:
- free: ref count 0 and no cached content;
- cached-free: ref count 0, still in the prefix cache (an evictable cached block: a hit takes it back,
  an allocation evicts it);
- used: held by one request;
- shared: ref count > 1, one block read by several requests (prefix-cache hits).
`counts` gives each state's total for any pool. `block_states` gives every block's state, a used block
labelled by the tenant of the request holding it (an index into `tenants`), only for a pool of at most
`MAX_BLOCKS_DRAWN` blocks: a picture redrawn several times a second has no room for more cells, and
walking a GPU's hundred thousand blocks that often would cost the engine more than the picture is worth.

The walk is over the pool's own lists at C speed where it can be (`count`, `map`); the block tables are
visited only for a small pool. `num_evictions` is the pool's running count of cached blocks evicted, so a
view flashes when it moves.

Lesson: lessons/02-paged-attention.md (the pool); lessons/04-prefix-caching.md (cached-free blocks, eviction).
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from dataclasses import dataclass

from core.kv_cache_manager import KVCacheManager
from core.request import Request

MAX_BLOCKS_DRAWN = 4096  # larger pools get counts only
MAX_TENANTS_DRAWN = 250  # tenant labels a snapshot tells apart; the rest are drawn as the last one, "other"

# a block's state in `block_states`: one byte each; USED_BY + i is used by a request of tenants[i]
FREE, CACHED_FREE, SHARED, USED_BY = 0, 1, 2, 3
OTHER_TENANTS = "other"


@dataclass(frozen=True)
class KVPoolSnapshot:
    num_blocks: int
    block_size: int
    num_free: int  # free, nothing cached
    num_cached_free: int  # free, still cached (evictable)
    num_used: int  # held by one request
    num_shared: int  # held by several
    num_evictions: int  # cached blocks evicted so far (the pool's count)
    block_states: bytes | None = None  # one state per block (FREE, CACHED_FREE, SHARED, USED_BY + tenant)
    tenants: tuple[str, ...] = ()  # the tenants `block_states` names, in order

    @classmethod
    def of(cls, kv: KVCacheManager, requests: Mapping[str, Request]) -> KVPoolSnapshot:
        """The pool of `kv` now; `requests` (the scheduler's unfinished ones, by id) name each table's tenant."""
        pool = kv.block_pool
        ref_cnt = pool.ref_cnt
        num_zero, num_one = ref_cnt.count(0), ref_cnt.count(1)
        num_cached_free = operator.countOf(map(ref_cnt.__getitem__, pool.cached.values()), 0)
        counts = dict(num_blocks=pool.num_blocks, block_size=kv.block_size, num_free=num_zero - num_cached_free,
                      num_cached_free=num_cached_free, num_used=num_one,
                      num_shared=pool.num_blocks - num_zero - num_one, num_evictions=pool.num_evictions)
        if pool.num_blocks > MAX_BLOCKS_DRAWN:
            return cls(**counts)
        states = bytearray(pool.num_blocks)
        for b in pool.cached.values():
            if not ref_cnt[b]:
                states[b] = CACHED_FREE
        tenant_codes: dict[str, int] = {}
        for request_id, blocks in kv.block_tables.items():
            request = requests.get(request_id)
            tenant = request.tenant_key if request is not None else OTHER_TENANTS
            code = tenant_codes.get(tenant)
            if code is None:
                code = tenant_codes[tenant] = USED_BY + min(len(tenant_codes), MAX_TENANTS_DRAWN - 1)
            for b in blocks:
                states[b] = SHARED if ref_cnt[b] > 1 else code
        tenants = list(tenant_codes)[:MAX_TENANTS_DRAWN]
        if len(tenant_codes) > MAX_TENANTS_DRAWN:
            tenants[-1] = OTHER_TENANTS
        return cls(**counts, block_states=bytes(states), tenants=tuple(tenants))
