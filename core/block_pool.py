"""`BlockPool`: the fixed set of KV-cache blocks, their reference counts, the free queue and the prefix cache.

A block is `block_size` token slots of K and V in every layer. The pool hands out block ids and takes them
back; it never sees a request (that is the KV cache manager's job) and never sees a tensor (that is the
runner's).

Prefix caching adds one idea: a freed block keeps its contents. A full block can be registered under its
content hash (`core/block_hash.py`); when its last user frees it, it goes to the free queue but
stays findable, as an *evictable cached block*. A later request with the same prefix takes it back
(`touch`) instead of recomputing it. Allocation takes blocks from the head of the free queue, which holds
the least recently freed blocks, and only then evicts whatever cached content they held: so eviction is
least-recently-used, and a block someone is using (ref count >= 1) is never evicted.

Invalidation (`reset_prefix_cache`, vLLM's) never waits for the pool to be idle: every cached block, or
those one owner registered, leaves the hash map at once, so no later lookup can find it. A free one is
then a plain free block; one in use stays with the requests that hold it (*dropped*) and goes back to the
free queue, uncached, when the last of them frees it. The owner is an opaque label the caller registers
a block under (the KV cache manager passes the tenant); the pool never learns what it means.

Invariants, checked by `check_invariants` in the property tests:
- every block is either free (ref count 0, in the free queue exactly once) or used (ref count >= 1);
- number of free blocks + number of used blocks = `num_blocks`;
- the hash map and the blocks agree: `cached[h] == b` exactly when `block_hash[b] == h`;
- a dropped block is in use and uncached.
Ref counts are > 1 only when requests share a cached (or dropped) block.

What the pool keeps for miss explanations (`explainable`) is bounded: the last `evictions_remembered`
evicted hashes (the pool's size, and at least `MIN_EVICTIONS_REMEMBERED`), and each cached block's parent
(the index of siblings dies with the blocks).

Lesson: lessons/02-paged-attention.md (the KV cache as virtual memory); lessons/04-prefix-caching.md
(evictable cached blocks, LRU eviction).
"""

from __future__ import annotations

from collections import OrderedDict

from core.block_hash import BlockHash

ParentLink = bytes  # a cached block's parent hash, or for a first block the isolation key it was hashed with


class BlockPool:
    """`num_blocks` blocks numbered 0..num_blocks-1; freed blocks are reused first-in, first-out."""

    MIN_EVICTIONS_REMEMBERED = 4096  # a small pool evicts often; its misses are still worth explaining

    def __init__(self, num_blocks: int, *, explainable: bool = False) -> None:
        """`explainable` keeps what a miss explanation reads (recently evicted hashes, each cached block's
        parent), bounded by the pool's size; the simulator leaves it off and pays nothing."""
        if num_blocks < 0:
            raise ValueError(f"num_blocks must be >= 0, got {num_blocks}")
        self.num_blocks = num_blocks
        self.ref_cnt = [0] * num_blocks
        # An ordered set: O(1) removal from the middle, which a cache hit on a free block needs.
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.cached: dict[BlockHash, int] = {}  # content hash -> the block holding it
        self.block_hash: list[BlockHash | None] = [None] * num_blocks
        self.block_tokens: list[tuple[int, ...] | None] = [None] * num_blocks  # compared on a hit
        self.block_owner: list[str | None] = [None] * num_blocks  # the label a cached block was registered under
        self.dropped: set[int] = set()  # blocks in use that a reset took out of the cache
        self.num_evictions = 0  # cached blocks whose contents an allocation evicted, so far (for live views)
        self.explainable = explainable
        # An ordered set of the hashes evicted last (the oldest forgotten first).
        self.evicted: OrderedDict[BlockHash, None] = OrderedDict()
        self.evictions_remembered = max(num_blocks, self.MIN_EVICTIONS_REMEMBERED)
        self.block_parent: list[ParentLink | None] = [None] * num_blocks
        self._children: dict[ParentLink, dict[int, None]] = {}  # parent -> its cached children, oldest first

    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation can take, including evictable cached blocks."""
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of blocks in use (vLLM's `kv_cache_usage`); evictable cached blocks count as free."""
        return self.num_used_blocks / self.num_blocks if self.num_blocks else 0.0

    def get_new_blocks(self, n: int) -> list[int]:
        """Take `n` free blocks (ref count 1 each), evicting the cached contents of the oldest ones.
        The caller checks `num_free_blocks` first."""
        if n > len(self._free):
            raise RuntimeError(f"asked for {n} blocks, only {len(self._free)} free")
        blocks = []
        for _ in range(n):
            b, _ = self._free.popitem(last=False)
            if self.block_hash[b] is not None:
                self._uncache(b)
                self.num_evictions += 1
            self.ref_cnt[b] = 1
            blocks.append(b)
        return blocks

    def free_blocks(self, block_ids: list[int]) -> None:
        """Drop one reference to each block; a block whose count reaches 0 goes to the back of the free
        queue (cached contents kept). Callers pass a request's blocks last-first, so a prefix's tail is
        evicted before its head, which more requests share."""
        for b in block_ids:
            if self.ref_cnt[b] <= 0:
                raise RuntimeError(f"block {b} freed while not in use")
            self.ref_cnt[b] -= 1
            if self.ref_cnt[b] == 0:
                self._free[b] = None
                if self.dropped:
                    self.dropped.discard(b)

    # ---- the prefix cache ----

    def get_cached_block(self, block_hash: BlockHash, token_ids: tuple[int, ...]) -> int | None:
        """The block holding this content, or None. Tokens are compared, so a hash collision is a miss."""
        b = self.cached.get(block_hash)
        if b is None or self.block_tokens[b] != token_ids:
            return None
        return b

    def touch(self, block_ids: list[int]) -> None:
        """Take one more reference to cached blocks a request reuses; a free one leaves the free queue."""
        for b in block_ids:
            if self.ref_cnt[b] == 0:
                del self._free[b]
            self.ref_cnt[b] += 1

    def cache_block(self, b: int, block_hash: BlockHash, token_ids: tuple[int, ...], *,
                    owner: str | None = None, parent: ParentLink | None = None) -> None:
        """Register a full, computed block under its hash, labelled `owner` (what a reset may select by),
        its `parent` recorded when `explainable`. If another block already holds that content (two
        requests computed the same prefix at once), or this block was dropped by a reset, it stays
        unregistered."""
        if block_hash in self.cached or self.block_hash[b] is not None or b in self.dropped:
            return
        self.cached[block_hash] = b
        self.block_hash[b] = block_hash
        self.block_tokens[b] = token_ids
        self.block_owner[b] = owner
        if self.explainable:
            self.evicted.pop(block_hash, None)
            if parent is not None:
                self.block_parent[b] = parent
                self._children.setdefault(parent, {})[b] = None

    def _uncache(self, b: int, *, evicted: bool = True) -> None:
        block_hash = self.block_hash[b]
        del self.cached[block_hash]
        self.block_hash[b] = None
        self.block_tokens[b] = None
        self.block_owner[b] = None
        if self.explainable:
            parent = self.block_parent[b]
            if parent is not None:
                self.block_parent[b] = None
                siblings = self._children[parent]
                del siblings[b]
                if not siblings:
                    del self._children[parent]
            if evicted:
                self.evicted[block_hash] = None
                if len(self.evicted) > self.evictions_remembered:
                    self.evicted.popitem(last=False)

    def children(self, parent: ParentLink) -> list[int]:
        """Cached blocks registered with this parent, most recent first (empty unless `explainable`)."""
        return list(reversed(self._children.get(parent, {})))

    def reset_prefix_cache(self, owner: str | None = None) -> int:
        """Take every cached block, or those registered under `owner`, out of the prefix cache now (cache
        invalidation, e.g. after new weights or for one tenant), as vLLM's `reset_prefix_cache`. Free ones
        are plain free blocks at once; those in use are dropped: no lookup finds them, and they return to
        the free queue when their requests free them. Returns how many blocks left the cache."""
        selected = [b for b in self.cached.values() if owner is None or self.block_owner[b] == owner]
        for b in selected:
            self._uncache(b, evicted=False)
            if self.ref_cnt[b]:
                self.dropped.add(b)
        if owner is None:
            self.evicted.clear()
        return len(selected)

    @property
    def num_cached_blocks(self) -> int:
        return len(self.cached)

    def check_invariants(self) -> None:
        assert len(self._free) + sum(1 for c in self.ref_cnt if c > 0) == self.num_blocks, \
            "a block is both free and in use, or neither"
        for b in range(self.num_blocks):
            assert self.ref_cnt[b] >= 0, f"block {b} has a negative ref count"
            assert (self.ref_cnt[b] == 0) == (b in self._free), f"block {b}: ref count and free queue disagree"
            h = self.block_hash[b]
            assert h is None or self.cached.get(h) == b, f"block {b} has a hash the map does not point back from"
        for h, b in self.cached.items():
            assert self.block_hash[b] == h, f"hash map points to block {b}, which holds other content"
        for b in self.dropped:
            assert self.ref_cnt[b] > 0 and self.block_hash[b] is None, f"dropped block {b} is free or cached"
        assert len(self.evicted) <= self.evictions_remembered, "the record of evicted hashes outgrew its bound"
        for parent, siblings in self._children.items():
            assert siblings and all(self.block_parent[b] == parent for b in siblings), "the sibling index is stale"
