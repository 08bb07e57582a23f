"""`KVCacheManager`: each request's block table, on top of the block pool.

A block table maps a request's token positions to physical blocks: position p lives in block
`table[p // block_size]`, slot `p % block_size`. PagedAttention's point is that these blocks need not be
contiguous, so a request takes a block only when its tokens reach it, and frees them all when done.

Three allocation modes (`EngineConfig.kv_allocation`) let lesson 2 measure what paging saves:
- "paged": take blocks as tokens arrive (vLLM);
- "contiguous": reserve `max_model_len` tokens up front, as pre-vLLM servers did;
- "contiguous_exact": reserve prompt + max_tokens up front (an oracle that knows the output length).
Live tokens (the scheduler counts them) vs `num_reserved_slots` is the fragmentation a lesson plots.

With prefix caching (`enable_caching`), a request first looks up the longest run of its leading full
blocks that some earlier request already computed (`get_computed_blocks`, by content hash) and shares them
instead of computing them again; each block it completes is registered for later requests
(`cache_full_blocks`). `explain_prefix` says why a lookup stopped where it did. With `explain_misses`
(the engine's choice; the simulator leaves it off and pays nothing), each admitted request's explanation
is recorded as its table is first allocated, from the cache as its lookup saw it: explaining later would
describe another cache (its own blocks registered, others evicted), and explaining every lookup would
cost work each step a request waits at the head of the queue. An explanation's work does not grow with
the pool: it reads the pool's bounded record of evictions, tries the `MAX_KEYS_EXPLAINED` isolation keys
seen most recently, and compares at most `MAX_SIBLINGS_EXPLAINED` cached blocks that continue the prefix.

`reset_prefix_cache(tenant)` takes every cached block (or one tenant's: blocks are registered in the pool
under their request's tenant, never under the request) out of the cache at once, even under load; blocks
in use are freed when their requests finish.

Preemption by swap moves a request's blocks to a host pool and back; the manager only decides which block
goes where and returns the copy plan, which executors carry out.

Lesson: lessons/02-paged-attention.md (block tables and allocation); lessons/04-prefix-caching.md
(lookup, sharing and miss explanations).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Literal

from core.block_hash import BlockHash, extend_block_hashes, isolation_key
from core.block_pool import BlockPool
from core.config import KVAllocation
from core.math_utils import cdiv
from core.request import Request

MissReason = Literal["caching_disabled", "shorter_than_block", "all_full_blocks_hit", "evicted",
                     "other_isolation_key", "different_tokens", "never_computed"]

MAX_KEYS_EXPLAINED = 16  # other isolation keys (tenants, salts) a miss explanation tries, most recent first
MAX_SIBLINGS_EXPLAINED = 16  # cached blocks continuing the prefix whose tokens an explanation compares


@dataclass(frozen=True)
class PrefixCacheExplanation:
    """How much of a request's prompt hit the prefix cache, and why the next block missed."""

    num_tokens: int  # tokens the lookup covered (the prompt, plus outputs after a preemption)
    num_cached_tokens: int
    reason: MissReason
    position: int | None = None  # token index where the miss starts (the first differing token if known)

    def __str__(self) -> str:
        hit = f"{self.num_cached_tokens} of {self.num_tokens} tokens hit"
        where = f" at token {self.position}" if self.position is not None else ""
        why = {
            "caching_disabled": "prefix caching is off",
            "shorter_than_block": "the prompt does not fill one block (only whole blocks are cached)",
            "all_full_blocks_hit": "every full block hit; the rest (a partial block, or just the last "
                                   "token, whose logits are needed) is computed",
            "evicted": f"the next block{where} was cached but has been evicted",
            "other_isolation_key": f"the next block{where} is cached, but for another tenant or cache_salt",
            "different_tokens": f"a cached block continues this prefix, but its tokens differ{where}",
            "never_computed": f"no request has computed the next block{where} yet",
        }[self.reason]
        return f"{hit}: {why}"


@dataclass(frozen=True)
class CachedPrefix:
    """A lookup's result: cached blocks that start a request's table, and how many tokens they give.

    `num_tokens` is len(blocks) * block_size, except when a whole block-aligned prompt hit: then it is one
    less, because the last token is computed again for its logits. Its slot sits in the last block, which
    other requests may be reading, so that block is copied (copy-on-write) instead of shared.
    """

    blocks: list[int]
    num_tokens: int

    def needs_copy(self, block_size: int) -> bool:
        return self.num_tokens < len(self.blocks) * block_size


NO_PREFIX = CachedPrefix([], 0)


class KVCacheManager:
    def __init__(self, block_size: int, num_blocks: int, *, num_swap_blocks: int = 0,
                 allocation: KVAllocation = "paged", max_model_len: int = 2048, enable_caching: bool = False,
                 cache_namespace: str = "", explain_misses: bool = False) -> None:
        """`cache_namespace` names the model, so hashes from two models never meet; `explain_misses`
        records a `PrefixCacheExplanation` per admitted request (the engine turns it on)."""
        self.block_size = block_size
        self.allocation = allocation
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.cache_namespace = cache_namespace
        self.explain_misses = explain_misses and enable_caching
        self.block_pool = BlockPool(num_blocks, explainable=self.explain_misses)
        self.host_pool = BlockPool(num_swap_blocks)
        self.block_tables: dict[str, list[int]] = {}
        self.host_block_tables: dict[str, list[int]] = {}
        self._num_registered: dict[str, int] = {}  # leading blocks of each table already in the cache
        # The isolation keys explained most recently (an ordered set, newest last), for cross-tenant misses.
        self._recent_keys: OrderedDict[bytes, None] = OrderedDict()
        self._explanations: dict[str, PrefixCacheExplanation] = {}  # by request id, until taken
        self.pending_copies: list[tuple[int, int]] = []  # copy-on-write (src, dst) for this step

    # ---- sizing ----

    def tokens_to_hold(self, request: Request, num_tokens: int) -> int:
        """How many token slots the request's table must cover once it holds `num_tokens`, by mode."""
        if self.allocation == "contiguous":
            return max(num_tokens, self.max_model_len)
        if self.allocation == "contiguous_exact":
            return max(num_tokens, request.max_total_tokens)
        return num_tokens

    def max_blocks_needed(self, request: Request) -> int:
        """Blocks the request will hold at its largest; admission refuses one that exceeds the pool."""
        return cdiv(self.tokens_to_hold(request, request.max_total_tokens), self.block_size)

    # ---- the prefix cache ----

    def block_hashes(self, request: Request) -> list[BlockHash]:
        """The hash chain of the request's full blocks of known tokens, extended as tokens arrive."""
        hashes = request.block_hashes
        done = len(hashes) * self.block_size
        if request.num_tokens - done >= self.block_size:
            extend_block_hashes(hashes, request.token_ids(done, request.num_tokens), self.block_size,
                                self.isolation_key(request))
        return hashes

    def isolation_key(self, request: Request) -> bytes:
        """The extra keys of the request's block hashes: this manager's model namespace, its tenant and
        cache salt (never its `user` label, which the client chooses)."""
        return isolation_key(self.cache_namespace, request.tenant, request.cache_salt)

    def get_computed_blocks(self, request: Request) -> CachedPrefix:
        """The longest run of the request's leading full blocks already in the cache (not yet referenced).

        At most num_tokens - 1 tokens: the last known token is always computed, because the step needs its
        logits. Only a request with nothing computed looks up (not a swapped one).
        """
        if not self.enable_caching or request.num_computed_tokens:
            return NO_PREFIX
        return self._lookup(request)

    def _lookup(self, request: Request) -> CachedPrefix:
        hashes = self.block_hashes(request)
        blocks = []
        for i, block_hash in enumerate(hashes):
            b = self.block_pool.get_cached_block(block_hash, self._block_tokens(request, i))
            if b is None:
                break
            blocks.append(b)
        return CachedPrefix(blocks, min(len(blocks) * self.block_size, request.num_tokens - 1))

    def cache_full_blocks(self, request: Request) -> None:
        """Register the blocks the request has completed since the last call (after each step). Only known
        tokens count: a stop token amid accepted draft tokens leaves computed slots past the last kept token."""
        num_full = min(request.num_computed_tokens, request.num_tokens) // self.block_size
        start = self._num_registered.get(request.request_id, 0)
        if not self.enable_caching or num_full <= start:
            return
        hashes = self.block_hashes(request)
        table = self.block_tables[request.request_id]
        pool = self.block_pool
        owner = request.tenant_key
        root = self.isolation_key(request) if self.explain_misses else None  # the first block's parent link
        for i in range(start, num_full):
            pool.cache_block(table[i], hashes[i], self._block_tokens(request, i), owner=owner,
                             parent=hashes[i - 1] if i else root)
        self._num_registered[request.request_id] = num_full

    def _block_tokens(self, request: Request, i: int) -> tuple[int, ...]:
        return tuple(request.token_ids(i * self.block_size, (i + 1) * self.block_size))

    def explain_prefix(self, request: Request) -> PrefixCacheExplanation:
        """What a lookup for this request would find now, and why it would stop there (no side effects)."""
        if not self.enable_caching:
            return PrefixCacheExplanation(request.num_tokens, 0, "caching_disabled")
        return self._explain(request, self._lookup(request))

    def take_explanation(self, request_id: str) -> PrefixCacheExplanation | None:
        """The explanation recorded at the request's last admission (see `explain_misses`), given once."""
        return self._explanations.pop(request_id, None)

    def _explain(self, request: Request, prefix: CachedPrefix) -> PrefixCacheExplanation:
        bs = self.block_size
        n = request.num_tokens
        hashes = self.block_hashes(request)
        hits = len(prefix.blocks)
        own_key = self.isolation_key(request)
        recent = self._recent_keys
        recent[own_key] = None
        recent.move_to_end(own_key)
        if len(recent) > MAX_KEYS_EXPLAINED + 1:  # the others, and this one
            recent.popitem(last=False)
        if not hashes:
            return PrefixCacheExplanation(n, 0, "shorter_than_block")
        if hits == len(hashes):
            return PrefixCacheExplanation(n, prefix.num_tokens, "all_full_blocks_hit")
        pool = self.block_pool
        if hashes[hits] in pool.evicted:
            return PrefixCacheExplanation(n, hits * bs, "evicted", hits * bs)
        for key in reversed(recent):
            if key != own_key:
                other: list[BlockHash] = []
                extend_block_hashes(other, request.token_ids(0, (hits + 1) * bs), bs, key)
                if other[hits] in pool.cached:
                    return PrefixCacheExplanation(n, hits * bs, "other_isolation_key", hits * bs)
        # A cached block that continues our last hit (same parent, so same key), but with other tokens?
        mine = self._block_tokens(request, hits)
        best = None
        for b in pool.children(hashes[hits - 1] if hits else own_key)[:MAX_SIBLINGS_EXPLAINED]:
            tokens = pool.block_tokens[b]
            same = next((j for j, (x, y) in enumerate(zip(tokens, mine)) if x != y), bs)
            best = same if best is None else max(best, same)
        if best is not None:
            return PrefixCacheExplanation(n, hits * bs, "different_tokens", hits * bs + best)
        return PrefixCacheExplanation(n, hits * bs, "never_computed", hits * bs)

    # ---- allocation ----

    def allocate_slots(self, request: Request, num_new_tokens: int,
                       prefix: CachedPrefix = NO_PREFIX) -> list[int] | None:
        """Make room for `num_new_tokens` more tokens of `request`, after `prefix` (the cache hits from
        `get_computed_blocks` that a new request's table starts with).

        Returns the newly taken block ids (possibly none), or None if the pool lacks free blocks, in which
        case nothing changes and the scheduler must wait or preempt.
        """
        table = self.block_tables.get(request.request_id)
        num_tokens = request.num_computed_tokens + prefix.num_tokens + num_new_tokens
        if table is not None and num_tokens <= len(table) * self.block_size and not prefix.blocks:
            # The table already covers these tokens: every decode step but one in block_size. (A reserving
            # mode's table covers its reservation from the start, so the formula below gives 0 here too.)
            return []
        shared = prefix.blocks[:-1] if prefix.needs_copy(self.block_size) else prefix.blocks
        held = (len(table) if table is not None else 0) + len(shared)
        missing = max(cdiv(self.tokens_to_hold(request, num_tokens), self.block_size) - held, 0)
        pool = self.block_pool
        reclaimed = sum(1 for b in shared if pool.ref_cnt[b] == 0)  # hits that sit in the free queue
        if missing + reclaimed > pool.num_free_blocks:
            return None
        if table is None and self.explain_misses:  # an admission: explain before this allocation evicts
            self._explanations[request.request_id] = self._explain(request, prefix)
        pool.touch(shared)  # before allocating, so the hits cannot be evicted by it
        new_blocks = pool.get_new_blocks(missing)
        if table is None:
            self.block_tables[request.request_id] = shared + new_blocks
            self._num_registered[request.request_id] = len(shared)
        elif new_blocks:
            # A new list, not an in-place extend: steps already scheduled hand out the old one (see
            # `get_block_ids`), so a table is copied once per block added rather than once per step.
            self.block_tables[request.request_id] = table + new_blocks
        if len(shared) < len(prefix.blocks):
            # Executors copy before any block is written, so the source may even be reallocated this step.
            self.pending_copies.append((prefix.blocks[-1], new_blocks[0]))
        return new_blocks

    def take_copies(self) -> list[tuple[int, int]]:
        """The copy-on-write plan of this step's allocations, handed to the executor once."""
        copies, self.pending_copies = self.pending_copies, []
        return copies

    def free(self, request_id: str) -> None:
        """Give back every block the request holds, on the device and on the host (last block first, so
        a cached prefix is evicted from its tail)."""
        self.block_pool.free_blocks(self.block_tables.pop(request_id, [])[::-1])
        self.host_pool.free_blocks(self.host_block_tables.pop(request_id, []))
        self._num_registered.pop(request_id, None)

    def get_block_ids(self, request_id: str) -> list[int]:
        """The request's block table as of now. Read only: the manager replaces a table when it grows and
        never changes one in place, so a step's `ScheduledRequest` can hold it without a copy."""
        return self.block_tables.get(request_id, [])

    # ---- swapping (preemption_mode="swap") ----

    def swap_out(self, request_id: str) -> list[tuple[int, int]] | None:
        """Move the request's blocks to the host pool; None if the host pool is too small."""
        table = self.block_tables.get(request_id, [])
        if len(table) > self.host_pool.num_free_blocks:
            return None
        host_blocks = self.host_pool.get_new_blocks(len(table))
        self.block_pool.free_blocks(self.block_tables.pop(request_id)[::-1])
        self._num_registered.pop(request_id, None)
        self.host_block_tables[request_id] = host_blocks
        return list(zip(table, host_blocks))

    def swap_in(self, request: Request, num_new_tokens: int) -> list[tuple[int, int]] | None:
        """Bring the request's blocks back to the device and make room for `num_new_tokens` more, all or
        nothing; None if the device pool is too small. (The copies are fresh blocks: they register in the
        prefix cache again only where their content was evicted meanwhile.)"""
        host_blocks = self.host_block_tables[request.request_id]
        total = max(cdiv(self.tokens_to_hold(request, request.num_computed_tokens + num_new_tokens),
                         self.block_size), len(host_blocks))
        if total > self.block_pool.num_free_blocks:
            return None
        device_blocks = self.block_pool.get_new_blocks(len(host_blocks))
        self.host_pool.free_blocks(self.host_block_tables.pop(request.request_id))
        self.block_tables[request.request_id] = device_blocks
        self.allocate_slots(request, num_new_tokens)
        return list(zip(host_blocks, device_blocks))

    def reset_prefix_cache(self, tenant: str | None = None) -> int:
        """Take every cached block, or those cached by `tenant`'s requests (under any cache salt; requests
        without a tenant count as `DEFAULT_TENANT`), out of the prefix cache now; blocks in use are freed
        when their requests finish. Returns how many blocks left the cache."""
        return self.block_pool.reset_prefix_cache(owner=tenant)

    # ---- statistics ----

    @property
    def usage(self) -> float:
        return self.block_pool.usage

    @property
    def num_reserved_slots(self) -> int:
        """Token slots held by requests on the device (used blocks x block size)."""
        return self.block_pool.num_used_blocks * self.block_size

    def check_invariants(self) -> None:
        """Ref counts equal block-table entries; only cached blocks are shared between tables."""
        for pool, tables in ((self.block_pool, self.block_tables), (self.host_pool, self.host_block_tables)):
            pool.check_invariants()
            counts = [0] * pool.num_blocks
            for table in tables.values():
                assert len(table) == len(set(table)), "a block appears twice in one block table"
                for b in table:
                    counts[b] += 1
            assert counts == pool.ref_cnt, "ref counts differ from block-table entries"
            shared = [b for b, c in enumerate(counts)
                      if c > 1 and pool.block_hash[b] is None and b not in pool.dropped]
            assert not shared, f"blocks {shared[:5]} are shared but not cached"
