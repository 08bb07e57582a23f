"""`reset_prefix_cache` (vLLM's cache invalidation): refused while a block is in use, else forgets every
cached block."""

from ref_engine.core.block_pool import BlockPool


def test_reset_is_refused_while_blocks_are_in_use_then_forgets_every_cached_block():
    pool = BlockPool(4)
    blocks = pool.get_new_blocks(2)
    for i, b in enumerate(blocks):
        pool.cache_block(b, f"hash-{i}".encode(), (i,))
    assert not pool.reset_prefix_cache() and pool.num_cached_blocks == 2  # refused: nothing changed
    pool.free_blocks(blocks)
    assert pool.reset_prefix_cache()
    assert pool.num_cached_blocks == 0 and pool.get_cached_block(b"hash-0", (0,)) is None
    pool.check_invariants()
