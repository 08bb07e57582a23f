"""Reference solutions of lesson 1's exercises (E01.1, E01.2). Try them yourself first.

E01.1 is the engine's own rule, so its reference is a thin wrapper: it builds the engine's `Scheduler`
in the state the toy requests describe and asks it for one step. Read `Scheduler.schedule` in
ref_engine/core/scheduler.py for the real loop. E01.2 is closed-form arithmetic that the engine does not
contain, so it is written out here; the tests check it against the engine's two schedulers.

Lesson: lessons/01-continuous-batching.md#exercises
"""

from __future__ import annotations

import heapq

from lessons.exercises.e01_continuous_batching import ToyRequest
from ref_engine.core.config import EngineConfig
from ref_engine.core.request import Request, RequestStatus
from ref_engine.core.scheduler import Scheduler

__all__ = ["ToyRequest", "continuous_steps", "schedule_step", "static_steps", "throughput_ratio"]

_BLOCK_SIZE = 16


def _as_request(toy: ToyRequest) -> Request:
    request = Request(request_id=toy.request_id, prompt_token_ids=[0] * toy.num_prompt_tokens,
                      max_tokens=toy.num_output_tokens + 1)
    request.output_token_ids = [0] * toy.num_output_tokens
    request.num_computed_tokens = toy.num_computed_tokens
    return request


def schedule_step(running: list[ToyRequest], waiting: list[ToyRequest], max_num_batched_tokens: int,
                  max_num_seqs: int, enable_chunked_prefill: bool = True) -> dict[str, int]:
    """E01.1: one step of the engine's continuous-batching scheduler, on toy requests."""
    everyone = running + waiting
    longest = max((r.num_tokens for r in everyone), default=1)
    config = EngineConfig(
        block_size=_BLOCK_SIZE, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
        # without chunking the engine insists that any prompt fits one step's budget
        max_model_len=max_num_batched_tokens if not enable_chunked_prefill else max(longest + 1, 2),
        enable_chunked_prefill=enable_chunked_prefill)
    # memory is plentiful: every request could hold its tokens plus a whole budget
    num_blocks = sum(r.num_tokens + max_num_batched_tokens for r in everyone) // _BLOCK_SIZE + len(everyone) + 1
    scheduler = Scheduler(config, num_kv_blocks=num_blocks)
    # put the scheduler in the state the toy lists describe (what earlier steps would have left)
    for toy in running:
        request = _as_request(toy)
        request.status = RequestStatus.RUNNING
        scheduler.kv_cache_manager.allocate_slots(request, 0)  # blocks for the tokens already cached
        scheduler.running.append(request)
        scheduler.requests[request.request_id] = request
    for toy in waiting:
        request = _as_request(toy)
        scheduler.waiting.add_request(request)
        scheduler.requests[request.request_id] = request
    output = scheduler.schedule(now=0.0)
    return {s.request_id: s.num_scheduled_tokens for s in output.scheduled}


def static_steps(output_lens: list[int], batch_size: int) -> int:
    """E01.2a: each batch of `batch_size` consecutive requests lasts as long as its longest member."""
    return sum(max(output_lens[i:i + batch_size]) for i in range(0, len(output_lens), batch_size))


def continuous_steps(output_lens: list[int], batch_size: int) -> int:
    """E01.2b: `batch_size` slots; each request takes the slot that frees first, in list order."""
    free_at = [0] * min(batch_size, len(output_lens))  # the step after which each slot is free
    for n in output_lens:
        heapq.heappush(free_at, heapq.heappop(free_at) + n)
    return max(free_at, default=0)


def throughput_ratio(output_lens: list[int], batch_size: int) -> float:
    """E01.2c: same tokens in fewer steps; the ratio of throughputs is the inverse ratio of steps."""
    return static_steps(output_lens, batch_size) / continuous_steps(output_lens, batch_size)
