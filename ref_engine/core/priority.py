"""Priority scheduling, as vLLM's `scheduling_policy="priority"`: each request has an integer `priority`,
lower runs first, ties by arrival time.

What follows vLLM V1's scheduler (vllm/v1/core/sched/scheduler.py):
- the waiting queue is a heap on (priority, arrival time): admission takes the highest priority first, and
  a preempted request goes back in by the same key (there is no "head" to put it at);
- when a running request needs a KV block and none is free, the victim is the lowest-priority running
  request: the largest (priority, arrival time), which may be the request itself.
What differs: vLLM keeps the running list in admission order and, if its victim was already scheduled in
this step, takes the victim's tokens back out of the step. Here the running list is kept sorted by the same
key (ties in admission order), so the step's budget goes to the highest priorities first and the lowest
priority is always the last: `Scheduler.select_victim`'s default (the last candidate) is vLLM's choice, and
it is never a request already scheduled in this step. A waiting request does not push a running one out
directly (neither does vLLM V1): a higher-priority arrival waits for the next admission, and it is next
the moment a running request runs out of blocks and the lowest priority is preempted.

Lesson: lessons/03-chunked-prefill-and-disaggregation.md#priority.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections.abc import Iterator

from ref_engine.core.request import Request
from ref_engine.core.request_queue import RequestQueue
from ref_engine.core.scheduler import Scheduler
from ref_engine.core.scheduler_registry import register_scheduler


def priority_key(request: Request) -> tuple[int, float]:
    """The order of "priority": lower priority value first, then earlier arrival."""
    return request.priority, request.arrival_time


class PriorityRequestQueue(RequestQueue):
    """Waiting requests in `priority_key` order, ties by the order they were queued; a request put back
    (preempted, or passed over at its tenant's cap) goes ahead of its ties, as at the head of a deque."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, float, int, Request]] = []
        self._order = itertools.count()  # the last tie-break: never compare two Requests
        self._put_back_order = itertools.count(-1, -1)  # below every added one, the latest put back first

    def add_request(self, request: Request) -> None:
        heapq.heappush(self._heap, (*priority_key(request), next(self._order), request))

    def prepend_request(self, request: Request) -> None:
        heapq.heappush(self._heap, (*priority_key(request), next(self._put_back_order), request))

    def peek_request(self) -> Request:
        return self._heap[0][-1]

    def pop_request(self) -> Request:
        return heapq.heappop(self._heap)[-1]

    def remove_request(self, request: Request) -> None:
        entries = [entry for entry in self._heap if entry[-1] is not request]
        if len(entries) == len(self._heap):
            raise ValueError(f"request {request.request_id!r} is not queued")
        self._heap = entries
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[Request]:
        return (entry[-1] for entry in sorted(self._heap, key=lambda entry: entry[:3]))


@register_scheduler("priority", policy=True)
class PriorityScheduler(Scheduler):
    """Continuous batching that admits, schedules and preempts by priority (see the module docstring)."""

    request_queue_class = PriorityRequestQueue

    def admit(self, request: Request, now: float, num_cached_tokens: int = 0) -> None:
        """Admit as usual, then file the request in the running list by `priority_key`."""
        super().admit(request, now, num_cached_tokens)
        self.running.pop()
        bisect.insort_right(self.running, request, key=priority_key)
