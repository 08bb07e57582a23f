"""Per-tenant fair scheduling with virtual token counters (VTC: Sheng et al., "Fairness in Serving Large
Language Models", OSDI'24), `scheduling_policy="fair"`.

Each tenant has a virtual counter of the service it has received: every prompt token computed for it and
every output token it gets, divided by its weight (`EngineConfig.tenant_weights`; missing tenants weigh 1,
requests without a tenant belong to `DEFAULT_TENANT`, "default"). As in the paper, a request's uncomputed prompt tokens are
charged when it is admitted and its output tokens as they are produced; a recompute after preemption is
charged again, since the device computes it again.
- Admission takes the next request of the backlogged tenant with the lowest counter, so over any stretch
  in which two tenants are both backlogged their weighted service stays within a bounded distance (the
  paper's guarantee); with equal weights and equal requests this is round-robin between tenants. Ties go
  to the tenant with fewer running requests, then to the earlier head request.
- A tenant that becomes active (its first unfinished request arrives) is lifted to the lowest counter
  among the active tenants, or to the highest counter if none is active, so it cannot bank credit while
  idle and then starve the others.
- `EngineConfig.tenant_max_num_seqs` caps a tenant's running requests: admission skips a tenant at its cap.
- Preemption picks its victim from the most-served tenant among the requests not yet scheduled this step
  (the highest counter), its most recently admitted request.
Within a tenant, requests go first come, first served, and a preempted one goes back to its tenant's head.

Lesson: lessons/03-chunked-prefill-and-disaggregation.md#fairness.
"""

from __future__ import annotations

import sys
from collections import Counter, deque
from collections.abc import Iterator, Sequence

from ref_engine.core.config import EngineConfig
from ref_engine.core.interfaces import SchedulerOutput, StepResult
from ref_engine.core.request import Request, RequestStatus
from ref_engine.core.request_queue import RequestQueue
from ref_engine.core.scheduler import Scheduler, StepPlan
from ref_engine.core.scheduler_registry import register_scheduler


class FairRequestQueue(RequestQueue):
    """One first-come-first-served queue per tenant; the head is that of the backlogged tenant, under its
    cap, with the lowest virtual counter. It reads the scheduler's counters and running counts, which
    change between calls, so its order is always the current one. Truth says whether a request can be
    admitted now: false when every backlogged tenant is at its cap, though requests are queued."""

    def __init__(self, counters: dict[str, float], num_running: Counter[str], caps: dict[str, int]) -> None:
        self._queues: dict[str, deque[Request]] = {}
        self._counters = counters
        self._num_running = num_running
        self._caps = caps
        self._len = 0

    def _next_tenant(self) -> str | None:
        best, best_key = None, None
        for tenant, queue in self._queues.items():
            if queue and self._num_running[tenant] < self._caps.get(tenant, sys.maxsize):
                key = (self._counters[tenant], self._num_running[tenant], queue[0].arrival_time, tenant)
                if best_key is None or key < best_key:
                    best, best_key = tenant, key
        return best

    def add_request(self, request: Request) -> None:
        self._queues.setdefault(request.tenant_key, deque()).append(request)
        self._len += 1

    def prepend_request(self, request: Request) -> None:
        self._queues.setdefault(request.tenant_key, deque()).appendleft(request)
        self._len += 1

    def peek_request(self) -> Request:
        tenant = self._next_tenant()
        if tenant is None:
            raise IndexError("no tenant has a request it may admit")
        return self._queues[tenant][0]

    def pop_request(self) -> Request:
        request = self.peek_request()
        self._queues[request.tenant_key].popleft()
        self._len -= 1
        return request

    def remove_request(self, request: Request) -> None:
        self._queues.get(request.tenant_key, deque()).remove(request)  # ValueError if not queued
        self._len -= 1

    def __len__(self) -> int:
        return self._len

    def __bool__(self) -> bool:
        return self._next_tenant() is not None

    def __iter__(self) -> Iterator[Request]:
        """Tenants in the current order (lowest counter first), each tenant's requests in its order."""
        tenants = sorted((t for t, q in self._queues.items() if q),
                         key=lambda t: (self._counters[t], self._num_running[t], self._queues[t][0].arrival_time, t))
        return (request for tenant in tenants for request in self._queues[tenant])


@register_scheduler("fair", policy=True)
class FairScheduler(Scheduler):
    """Continuous batching that admits by virtual token counters and preempts the most-served tenant."""

    def __init__(self, config: EngineConfig, num_kv_blocks: int, *, cache_namespace: str = "",
                 explain_misses: bool = False) -> None:
        super().__init__(config, num_kv_blocks, cache_namespace=cache_namespace, explain_misses=explain_misses)
        self.tenant_weights = dict(config.tenant_weights or ())
        self.virtual_counters: dict[str, float] = {}  # tenant -> weighted tokens served
        self.num_running_by_tenant: Counter[str] = Counter()
        self.num_unfinished_by_tenant: Counter[str] = Counter()
        # The queue reads the counters above, so it is built here rather than by `request_queue_class`.
        self.waiting = FairRequestQueue(self.virtual_counters, self.num_running_by_tenant,
                                        dict(config.tenant_max_num_seqs or ()))

    def add_request(self, request: Request) -> None:
        """Queue as usual; a tenant that had nothing unfinished is lifted first (no credit banked idle)."""
        super().add_request(request)
        tenant = request.tenant_key
        if not self.num_unfinished_by_tenant[tenant]:
            active = [self.virtual_counters[t] for t, n in self.num_unfinished_by_tenant.items() if n]
            floor = min(active) if active else max(self.virtual_counters.values(), default=0.0)
            self.virtual_counters[tenant] = max(self.virtual_counters.get(tenant, 0.0), floor)
        self.num_unfinished_by_tenant[tenant] += 1

    def admit(self, request: Request, now: float, num_cached_tokens: int = 0) -> None:
        """Admit as usual and charge the tenant the tokens it will now compute (its prompt, less the cache)."""
        super().admit(request, now, num_cached_tokens)
        self.num_running_by_tenant[request.tenant_key] += 1
        self._charge(request, request.num_tokens - request.num_computed_tokens)

    def preempt(self, request: Request, plan: StepPlan) -> None:
        super().preempt(request, plan)
        self.num_running_by_tenant[request.tenant_key] -= 1

    def select_victim(self, candidates: Sequence[Request]) -> Request:
        """The most recently admitted request of the most-served tenant among `candidates`."""
        counters = self.virtual_counters
        most = max(counters[r.tenant_key] for r in candidates)
        return next(r for r in reversed(candidates) if counters[r.tenant_key] == most)

    def update_from_output(self, output: SchedulerOutput, result: StepResult, now: float) -> list[Request]:
        """Update as usual, charging each tenant the output tokens its requests got."""
        served = [(r, r.num_output_tokens) for s in output.scheduled if (r := self.requests.get(s.request_id))]
        finished = super().update_from_output(output, result, now)
        for request, before in served:
            self._charge(request, request.num_output_tokens - before)
        for request in finished:
            self._forget(request, was_running=True)
        return finished

    def finish_request(self, request_id: str, status: RequestStatus, now: float, *,
                       num_output_tokens: int | None = None) -> Request | None:
        request = self.requests.get(request_id)
        was_running = request is not None and request.status is RequestStatus.RUNNING
        request = super().finish_request(request_id, status, now, num_output_tokens=num_output_tokens)
        if request is not None:
            self._forget(request, was_running)
        return request

    def add_remote_prefilled_request(self, request: Request, num_external_tokens: int,
                                     now: float) -> list[int] | None:
        """As the base (admitted and charged like any request); one it refuses or rejects leaves the
        tenant's count of unfinished requests as it was."""
        tenant = request.tenant_key
        before = self.num_unfinished_by_tenant[tenant]
        try:
            return super().add_remote_prefilled_request(request, num_external_tokens, now)
        finally:
            if self.requests.get(request.request_id) is not request:
                self.num_unfinished_by_tenant[tenant] = before

    def _charge(self, request: Request, num_tokens: int) -> None:
        tenant = request.tenant_key
        self.virtual_counters[tenant] += num_tokens / self.tenant_weights.get(tenant, 1.0)

    def _forget(self, request: Request, was_running: bool) -> None:
        tenant = request.tenant_key
        self.num_unfinished_by_tenant[tenant] -= 1
        if was_running:
            self.num_running_by_tenant[tenant] -= 1
