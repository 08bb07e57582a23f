"""What a live view sees of a step (core/step_summary.py) and of the KV pool (core/kv_pool_snapshot.py), on a
small scheduler stepped by hand: the batch split into decode and prefill, the pool's four states with the
tenant of each used block, snapshots spaced by the clock but always taken when the engine goes idle, and
the pool's count of evictions."""

from __future__ import annotations

import pytest

from core import EngineConfig, Request, StepResult, make_scheduler
from core.kv_pool_snapshot import CACHED_FREE, FREE, MAX_BLOCKS_DRAWN, SHARED, USED_BY, KVPoolSnapshot
from core.metrics import StepRecord
from core.step_summary import StepSummarizer

PROMPT = list(range(100, 140))  # two full blocks of 16, and a partial one


def step(scheduler, summarizer, now: float):
    output = scheduler.schedule(now)
    result = StepResult({s.request_id: [7] for s in output.scheduled if s.needs_logits})
    scheduler.update_from_output(output, result, now + 0.01)
    return summarizer.summarize(StepRecord.from_output(output, now, 0.01, result), now)


def test_a_step_is_split_into_decode_rows_and_prefill_chunks_and_the_pool_into_its_states():
    scheduler = make_scheduler(EngineConfig(max_num_batched_tokens=64).for_model(512), 32)
    summarizer = StepSummarizer(scheduler, pool_interval=10.0)
    scheduler.add_request(Request("A", PROMPT, 4, ignore_eos=True, tenant="acme"))
    first = step(scheduler, summarizer, 0.0)
    assert (first.num_prefill_rows, first.num_prefill_tokens, first.num_decode_rows) == (1, 40, 0)
    assert first.token_budget == 64 and first.num_running == 1 and first.kv_pool is not None
    # B shares A's two full blocks; C, another tenant, waits behind B's chunk for the budget
    scheduler.add_request(Request("B", PROMPT + [1], 4, ignore_eos=True, tenant="acme"))
    scheduler.add_request(Request("C", [5] * 60, 4, ignore_eos=True, tenant="globex"))
    second = step(scheduler, summarizer, 1.0)
    assert (second.num_decode_rows, second.num_decode_tokens) == (1, 1)  # A
    assert second.num_prefill_rows == 2 and second.num_prefill_tokens == 63  # B's 9 uncached, C's first 54
    assert (second.num_running, second.num_waiting, second.num_swapped) == (3, 0, 0)
    assert second.kv_pool is None  # the last snapshot is younger than the interval

    pool = KVPoolSnapshot.of(scheduler.kv_cache_manager, scheduler.requests)
    states = pool.block_states
    assert pool.tenants == ("acme", "globex") or pool.tenants == ("globex", "acme")
    acme, globex = (USED_BY + pool.tenants.index(t) for t in ("acme", "globex"))
    assert states.count(SHARED) == pool.num_shared == 2
    assert states.count(acme) == 2  # the third blocks of A and B
    assert states.count(globex) == 4 and pool.num_used == 6
    assert states.count(FREE) == pool.num_free == 32 - 8 and pool.num_cached_free == 0

    while scheduler.has_unfinished_requests():
        last = step(scheduler, summarizer, 1.5)
    assert last.kv_pool is not None, "the last step before idling always takes a snapshot"
    idle = last.kv_pool
    assert idle.num_used == idle.num_shared == 0 and idle.num_cached_free > 0
    assert idle.block_states.count(CACHED_FREE) == idle.num_cached_free
    assert idle.num_free + idle.num_cached_free == 32


def test_evictions_are_counted_and_a_large_pool_is_counted_not_drawn():
    scheduler = make_scheduler(EngineConfig(max_num_batched_tokens=64).for_model(512), 4)
    summarizer = StepSummarizer(scheduler)
    scheduler.add_request(Request("A", PROMPT, 2, ignore_eos=True))
    while scheduler.has_unfinished_requests():
        step(scheduler, summarizer, 0.0)
    scheduler.add_request(Request("B", [9] * 60, 2, ignore_eos=True))  # every block: evicts the two A left
    while scheduler.has_unfinished_requests():
        last = step(scheduler, summarizer, 0.0)
    assert last.kv_pool.num_evictions == scheduler.kv_cache_manager.block_pool.num_evictions == 2

    large = make_scheduler(EngineConfig().for_model(512), MAX_BLOCKS_DRAWN + 1)
    snapshot = KVPoolSnapshot.of(large.kv_cache_manager, large.requests)
    assert snapshot.block_states is None and snapshot.num_free == MAX_BLOCKS_DRAWN + 1
    assert StepSummarizer(large, pool_interval=0.0).pool_interval > 0.1  # a larger pool, rarer snapshots
    with pytest.raises(ValueError, match="pool_interval"):
        StepSummarizer(large, pool_interval=-1)
