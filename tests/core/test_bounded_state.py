"""What a long-running engine keeps must not grow with the requests it has served, and what it does per
admission must not grow with the pool: the evicted-hash record, the isolation keys a miss explanation
tries, and the work of one explanation (counted in hash computations, not timed)."""

from __future__ import annotations

import pytest

from core import EngineConfig, Request, StepResult, block_hash, make_scheduler
from core.block_pool import BlockPool

BLOCK = 4


def serve(sched, requests: list[Request]) -> None:
    """Run the requests to completion with a fake executor (every sampled token is 7)."""
    for request in requests:
        sched.add_request(request)
    step = 0
    while sched.has_unfinished_requests():
        out = sched.schedule(float(step))
        sched.update_from_output(out, StepResult({s.request_id: [7] for s in out.scheduled if s.needs_logits}),
                                 float(step))
        step += 1


def filled_scheduler(num_blocks: int):
    """An explaining scheduler whose pool is full of cached two-block prompts of 20 tenants (more than an
    explanation tries); every prompt starts with the same block, so the block after it has many cached
    siblings."""
    config = EngineConfig(block_size=BLOCK, max_num_seqs=64, max_num_batched_tokens=4096, max_model_len=64)
    sched = make_scheduler(config, num_blocks, explain_misses=True)
    serve(sched, [Request(f"r{i}", [1, 2, 3, 4] + [10 + i * 4 + t for t in range(4)], 1, ignore_eos=True,
                          tenant=f"t{i % 20}") for i in range(num_blocks // 2)])
    return sched


@pytest.mark.parametrize(("tenant", "first", "reason"), [
    ("t0", 1, "different_tokens"),  # t0 cached the first block, and many second blocks after it
    ("nobody", 1, "other_isolation_key"),  # the first block is cached, but only under other tenants' keys
    ("nobody", 5, "never_computed"),  # every key tried, and no sibling: the most work an explanation does
])
def test_an_explanations_work_stays_flat_as_the_pool_grows_100x(monkeypatch, tenant, first, reason):
    calls = []
    link = block_hash._hash_link
    monkeypatch.setattr(block_hash, "_hash_link", lambda *args: calls.append(1) or link(*args))
    work = []
    for num_blocks in (40, 4000):
        sched = filled_scheduler(num_blocks)
        probe = Request("probe", [first, 2, 3, 4, 9, 9, 9, 9, 9], 1, tenant=tenant)
        sched.kv_cache_manager.block_hashes(probe)
        calls.clear()
        assert sched.kv_cache_manager.explain_prefix(probe).reason == reason
        work.append(len(calls))
    assert work[0] == work[1], f"hash computations per explanation: {work} (pool of 40 and of 4000 blocks)"


def test_the_eviction_record_and_the_isolation_keys_are_bounded(monkeypatch):
    monkeypatch.setattr(BlockPool, "MIN_EVICTIONS_REMEMBERED", 32)
    config = EngineConfig(block_size=BLOCK, max_num_seqs=8, max_num_batched_tokens=4096, max_model_len=64)
    sched = make_scheduler(config, 16, explain_misses=True)
    serve(sched, [Request(f"r{i}", [i * 8 + t for t in range(8)], 1, ignore_eos=True, cache_salt=f"s{i}")
                  for i in range(300)])  # 600 blocks cached and evicted through a pool of 16, 300 salts
    kv = sched.kv_cache_manager
    assert len(kv.block_pool.evicted) == 32  # of 600 evicted
    assert len(kv._recent_keys) <= 17
    kv.check_invariants()
    assert not kv._num_registered and not kv.block_tables
