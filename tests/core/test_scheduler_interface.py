"""The scheduler's methods for its callers, in small exact cases: drafts in, outputs cut at a stop, prefix
cache explanations out, and the registry of scheduling policies."""

from __future__ import annotations

import pytest

from core import (
    SCHEDULERS,
    EngineConfig,
    Request,
    RequestStatus,
    Scheduler,
    StaticScheduler,
    StepResult,
    make_scheduler,
    register_scheduler,
)


def step(sched, sampled: dict[str, list[int]], now: float) -> list[Request]:
    out = sched.schedule(now)
    return sched.update_from_output(out, StepResult(sampled), now)


def test_a_stop_amid_a_verify_step_cuts_the_outputs_and_every_count_with_them():
    sched = make_scheduler(EngineConfig(block_size=4, max_model_len=64, speculative_method="ngram",
                                        num_speculative_tokens=3), num_kv_blocks=32)
    sched.add_request(Request("0", [1, 2, 3, 4], max_tokens=20))
    step(sched, {"0": [100]}, 0.0)
    sched.update_draft_token_ids({"0": [7, 8, 9], "gone": [1]})  # an id that finished meanwhile is skipped
    step(sched, {"0": [7, 8, 9, 55]}, 1.0)  # every draft accepted, then the target's own token
    req = sched.get_request("0")
    assert req.output_token_ids == [100, 7, 8, 9, 55] and req.num_computed_tokens == 8
    assert len(req.block_hashes) == 2

    # the engine found a stop string ending at the second output token
    assert sched.finish_request("0", RequestStatus.FINISHED_STOPPED, 2.0, num_output_tokens=2) is req
    assert req.output_token_ids == [100, 7] and req.token_times == [0.0, 1.0] and req.first_token_time == 0.0
    assert req.num_computed_tokens == req.num_tokens - 1 == 5
    assert len(req.block_hashes) == 1  # only full blocks of kept tokens
    assert (req.status, req.finish_time) == (RequestStatus.FINISHED_STOPPED, 2.0)
    assert sched.get_request("0") is None and sched.get_num_unfinished_requests() == 0
    assert sched.kv_cache_manager.block_pool.num_free_blocks == 32


def test_an_explanation_describes_the_cache_at_admission_and_is_given_once():
    sched = make_scheduler(EngineConfig(block_size=4, max_model_len=64), num_kv_blocks=32, explain_misses=True)
    prompt = list(range(10, 22))  # three full blocks
    sched.add_request(Request("cold", prompt, max_tokens=1))
    step(sched, {"cold": [5]}, 0.0)
    assert sched.take_prefix_cache_explanation("cold").reason == "never_computed"
    assert sched.take_prefix_cache_explanation("cold") is None
    # after the cold request ran, its blocks are cached: an explanation made now would say "hit"
    assert sched.kv_cache_manager.explain_prefix(Request("probe", prompt, max_tokens=1)).reason == \
        "all_full_blocks_hit"

    sched.add_request(Request("warm", prompt, max_tokens=1))
    step(sched, {"warm": [5]}, 1.0)
    warm = sched.take_prefix_cache_explanation("warm")
    assert (warm.reason, warm.num_cached_tokens) == ("all_full_blocks_hit", 11)

    sched.add_request(Request("aborted", prompt, max_tokens=5))
    step(sched, {"aborted": [5]}, 2.0)
    sched.abort_request("aborted", 3.0)
    assert sched.take_prefix_cache_explanation("aborted") is None  # dropped with the request


def test_without_explain_misses_nothing_is_explained():
    sched = make_scheduler(EngineConfig(block_size=4, max_model_len=64), num_kv_blocks=32)
    sched.add_request(Request("0", list(range(10, 22)), max_tokens=1))
    step(sched, {"0": [5]}, 0.0)
    assert sched.take_prefix_cache_explanation("0") is None


def test_a_policy_name_is_registered_once_and_selects_its_class():
    with pytest.raises(ValueError, match="already registered"):
        register_scheduler("continuous")(type("Impostor", (Scheduler,), {}))
    assert SCHEDULERS["continuous"] is Scheduler
    assert type(make_scheduler(EngineConfig(max_model_len=64, scheduling="static"), 8)) is StaticScheduler
    with pytest.raises(ValueError, match=r"scheduling must be one of \('continuous', 'static'"):
        EngineConfig(scheduling="fifo")
