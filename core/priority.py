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

from core.request import Request
from core.request_queue import KeyedRequestQueue
from core.scheduler import Scheduler
from core.scheduler_registry import register_scheduler


def priority_key(request: Request) -> tuple[int, float]:
    """The order of "priority": lower priority value first, then earlier arrival."""
    return request.priority, request.arrival_time


class PriorityRequestQueue(KeyedRequestQueue):
    """Waiting requests in `priority_key` order, ties by the order they were queued; a request put back
    (preempted, or passed over at its tenant's cap) goes ahead of its ties, as at the head of a deque."""

    def __init__(self) -> None:
        super().__init__(priority_key)


@register_scheduler("priority", policy=True)
class PriorityScheduler(Scheduler):
    """Continuous batching that admits, schedules and preempts by priority (see the module docstring)."""

    request_queue_class = PriorityRequestQueue

    def on_admitted(self, request: Request) -> None:
        """File the request, just appended to the running list, in its place by `priority_key`."""
        self.running.pop()
        bisect.insort_right(self.running, request, key=priority_key)
