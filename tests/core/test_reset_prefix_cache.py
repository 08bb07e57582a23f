"""`reset_prefix_cache` (vLLM's cache invalidation) never refuses: under load it takes cached blocks out of
the index at once and frees the ones in use when their requests finish; per tenant it leaves the other
tenants' blocks alone. The random-workload version is in test_scheduler_properties.py."""

from core import EngineConfig, Request, StepResult, make_scheduler
from core.block_pool import BlockPool


def test_a_reset_drops_blocks_in_use_and_frees_them_when_their_requests_do():
    pool = BlockPool(4)
    blocks = pool.get_new_blocks(2)
    for i, b in enumerate(blocks):
        pool.cache_block(b, f"hash-{i}".encode(), (i,))
    pool.free_blocks(blocks[1:])  # block 1: cached and free; block 0: cached and in use
    assert pool.reset_prefix_cache() == 2
    assert pool.num_cached_blocks == 0 and pool.get_cached_block(b"hash-0", (0,)) is None
    assert pool.dropped == {blocks[0]} and pool.num_used_blocks == 1
    pool.check_invariants()
    pool.cache_block(blocks[0], b"hash-0", (0,))  # a dropped block is never registered again
    assert pool.num_cached_blocks == 0
    pool.free_blocks(blocks[:1])
    assert not pool.dropped and pool.num_free_blocks == 4
    pool.check_invariants()


def test_a_reset_by_owner_leaves_the_other_owners_blocks():
    pool = BlockPool(4)
    blocks = pool.get_new_blocks(3)
    for i, (b, owner) in enumerate(zip(blocks, ["a", "b", "a"])):
        pool.cache_block(b, f"hash-{i}".encode(), (i,), owner=owner)
    assert pool.reset_prefix_cache(owner="a") == 2
    assert pool.get_cached_block(b"hash-1", (1,)) == blocks[1] and pool.num_cached_blocks == 1
    assert pool.dropped == {blocks[0], blocks[2]}
    pool.check_invariants()


def run(sched, steps: int, start: int = 0) -> None:
    for step in range(start, start + steps):
        out = sched.schedule(float(step))
        sched.update_from_output(out, StepResult({s.request_id: [7] for s in out.scheduled if s.needs_logits}),
                                 float(step))


PROMPT = list(range(100, 140))  # two full blocks of 16, and a partial one


def test_a_reset_under_load_is_never_refused_no_later_request_hits_and_every_block_comes_back():
    sched = make_scheduler(EngineConfig(max_num_batched_tokens=256).for_model(512), 32)
    kv = sched.kv_cache_manager
    sched.add_request(Request("A", PROMPT, 20, ignore_eos=True))
    run(sched, 2)
    sched.add_request(Request("B", PROMPT, 20, ignore_eos=True))
    run(sched, 1, start=2)
    assert sched.get_request("B").num_cached_tokens == 32  # the cache works: B shares A's two blocks
    assert sched.reset_prefix_cache() >= 2  # while A and B run
    assert kv.block_pool.num_cached_blocks == 0 and len(kv.block_pool.dropped) >= 2
    kv.check_invariants()
    sched.add_request(Request("C", PROMPT, 20, ignore_eos=True))
    run(sched, 1, start=3)
    assert sched.get_request("C").num_cached_tokens == 0  # A's blocks are still in use, but out of reach
    run(sched, 40, start=4)
    assert not sched.has_unfinished_requests()
    assert kv.block_pool.num_used_blocks == 0 and not kv.block_pool.dropped
    kv.check_invariants()
    sched.add_request(Request("D", PROMPT, 2, ignore_eos=True))
    run(sched, 1, start=50)
    assert sched.get_request("D").num_cached_tokens == 32  # C's blocks, cached after the reset


def test_a_tenant_reset_forgets_only_that_tenants_blocks():
    sched = make_scheduler(EngineConfig(max_num_batched_tokens=256).for_model(512), 64)
    for tenant, salt in [("a", None), ("a", "s"), ("b", None), (None, None)]:
        sched.add_request(Request(f"{tenant}-{salt}", PROMPT, 2, ignore_eos=True, tenant=tenant, cache_salt=salt))
    run(sched, 3)
    assert sched.reset_prefix_cache("a") == 4  # two blocks under each of a's salts
    for tenant, salt, hit in [("a", None, 0), ("a", "s", 0), ("b", None, 32), (None, None, 32)]:
        request = Request(f"again-{tenant}-{salt}", PROMPT, 2, ignore_eos=True, tenant=tenant, cache_salt=salt)
        sched.add_request(request)
        run(sched, 1, start=10)
        assert request.num_cached_tokens == hit, (tenant, salt)
    assert sched.reset_prefix_cache("default") == 2  # requests without a tenant count as "default"
