"""`RequestQueue`: the waiting requests, in the order the scheduler should admit them.

The order of the waiting queue is a scheduling policy of its own, so it is an object the scheduler holds
(`Scheduler.request_queue_class`), as in vLLM V1. The scheduler only ever looks at the head: it peeks at
the request to admit next, pops it once admitted, and stops at the first one that does not fit, so the
queue alone decides who goes first. A preempted request goes back with `prepend_request`: first come,
first served puts it at the head (it arrived before everyone waiting); a queue with its own order (by
priority, or fair shares between tenants) may simply file it by that order.

`FCFSRequestQueue` is vLLM's default: arrival order, a deque. `KeyedRequestQueue` is any order given by a
key (the priority policy's, or a plug-in's); other orders subclass `RequestQueue` and implement its methods.
`__iter__` lists the requests in the order they would be popped. Per-tenant caps are
not the queue's business: the scheduler passes over a capped tenant's requests and puts them back
(`Scheduler.schedule_waiting`), whatever the order.

Lesson: lessons/01-continuous-batching.md (who joins the batch next).
"""

from __future__ import annotations

import heapq
import itertools
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from core.request import Request


class RequestQueue(ABC):
    """The waiting queue's interface: what the scheduler calls, and nothing else."""

    @abstractmethod
    def add_request(self, request: Request) -> None:
        """Queue a new arrival."""

    @abstractmethod
    def prepend_request(self, request: Request) -> None:
        """Put back a preempted request, which has waited longest of all (FCFS: at the head)."""

    @abstractmethod
    def peek_request(self) -> Request:
        """The request to admit next, left in the queue; IndexError if the queue is empty."""

    @abstractmethod
    def pop_request(self) -> Request:
        """Remove and return the request `peek_request` names."""

    @abstractmethod
    def remove_request(self, request: Request) -> None:
        """Take out a request wherever it is (an abort); ValueError if it is not queued."""

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def __iter__(self) -> Iterator[Request]:
        """The queued requests in the order they would be popped."""


class FCFSRequestQueue(deque, RequestQueue):  # deque first: its C len and iter serve the loops
    """First come, first served: arrival order, preempted requests at the head."""

    def add_request(self, request: Request) -> None:
        self.append(request)

    def prepend_request(self, request: Request) -> None:
        self.appendleft(request)

    def peek_request(self) -> Request:
        return self[0]

    def pop_request(self) -> Request:
        return self.popleft()

    def remove_request(self, request: Request) -> None:
        self.remove(request)


class KeyedRequestQueue(RequestQueue):
    """Waiting requests by `key(request)`, lowest first, taken when a request is filed; ties in the order
    filed, except that a request put back (preempted, or passed over at its tenant's cap) goes ahead of its
    ties, as at the head of a deque."""

    def __init__(self, key: Callable[[Request], Any]) -> None:
        self._key = key
        self._heap: list[tuple[Any, int, Request]] = []
        self._order = itertools.count()  # the last tie-break: never compare two Requests
        self._put_back_order = itertools.count(-1, -1)  # below every added one, the latest put back first

    def add_request(self, request: Request) -> None:
        heapq.heappush(self._heap, (self._key(request), next(self._order), request))

    def prepend_request(self, request: Request) -> None:
        heapq.heappush(self._heap, (self._key(request), next(self._put_back_order), request))

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
        return (entry[-1] for entry in sorted(self._heap, key=lambda entry: entry[:2]))
