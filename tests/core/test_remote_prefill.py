"""`Scheduler.add_remote_prefilled_request`: a decode engine admits a request whose prompt K/V arrives
from a prefill engine (disaggregated prefill), straight to running, or not at all (nothing changes)."""

from __future__ import annotations

import pytest

from core import EngineConfig, Request, StepResult, make_scheduler


def scheduler(**knobs):
    config = EngineConfig(block_size=4, max_model_len=64, **knobs)
    return make_scheduler(config, config.num_kv_blocks or 16)


def test_admitted_running_with_all_but_the_last_prompt_token_computed():
    sched = scheduler()
    request = Request("r", list(range(10)), max_tokens=3)
    blocks = sched.add_remote_prefilled_request(request, 9, now=1.0)
    assert blocks == sched.kv_cache_manager.get_block_ids("r") and len(blocks) == 3  # room for all 10 tokens
    assert request.num_computed_tokens == 9 and sched.running == [request] and request.first_scheduled_time == 1.0
    out = sched.schedule(2.0)
    (scheduled,) = out.scheduled
    assert scheduled.token_ids == [9] and scheduled.num_computed_tokens == 9 and scheduled.needs_logits
    sched.update_from_output(out, StepResult({"r": [42]}), 2.0)
    assert request.output_token_ids == [42] and request.num_computed_tokens == 10


@pytest.mark.parametrize("busy", ["waiting", "max_num_seqs", "blocks"])
def test_while_it_cannot_start_nothing_changes(busy):
    sched = scheduler(max_num_seqs=1 if busy == "max_num_seqs" else 4, num_kv_blocks=4 if busy == "blocks" else 16)
    other = Request("other", list(range(12 if busy == "blocks" else 3)), max_tokens=1)
    sched.add_request(other)
    if busy != "waiting":
        sched.schedule(0.0)  # `other` runs and holds its blocks
    free = sched.kv_cache_manager.block_pool.num_free_blocks
    request = Request("r", list(range(6)), max_tokens=2)
    assert sched.add_remote_prefilled_request(request, 5, now=1.0) is None
    assert sched.get_request("r") is None and request not in sched.running and len(sched.waiting) == (busy == "waiting")
    assert sched.kv_cache_manager.block_pool.num_free_blocks == free
    assert sched.add_request(request) is None  # the id is free again


def test_a_request_that_could_never_run_is_refused():
    sched = scheduler(num_kv_blocks=2)
    with pytest.raises(ValueError, match="needs 3 KV blocks"):
        sched.add_remote_prefilled_request(Request("r", list(range(10)), max_tokens=1), 9, now=0.0)
    with pytest.raises(ValueError, match="external tokens"):
        sched.add_remote_prefilled_request(Request("s", list(range(4)), max_tokens=1), 4, now=0.0)
    assert not sched.has_unfinished_requests() and sched.kv_cache_manager.block_pool.num_free_blocks == 2
