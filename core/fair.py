"""Per-tenant fair scheduling with virtual token counters (VTC: Sheng et al., "Fairness in Serving Large
Language Models", OSDI'24), `scheduling_policy="fair"`.

Each tenant has a virtual counter of the service it has received: every prompt token computed for it and
every output token it gets, divided by its weight (`EngineConfig.tenant_weights`; missing tenants weigh 1).
A request's tenant here is `Request.group_key`: its authenticated tenant, or without one the `user` label
its client chose (a grouping for fairness, never an isolation boundary), or `DEFAULT_TENANT`. As in the paper, a request's uncomputed prompt tokens are
charged when it is admitted and its output tokens as they are produced; a recompute after preemption is
charged again, since the device computes it again.
- Admission takes the next request of the backlogged tenant with the lowest counter, so over any stretch
  in which two tenants are both backlogged their weighted service stays within a bounded distance (the
  paper's guarantee); with equal weights and equal requests this is round-robin between tenants. Ties go
  to the tenant with fewer running requests, then to the earlier head request.
- A tenant that becomes active (its first unfinished request arrives) is lifted to the lowest counter
  among the active tenants, or to the highest counter if none is active, so it cannot bank credit while
  idle and then starve the others.
- `EngineConfig.tenant_max_num_seqs` caps an authenticated tenant's running requests, as under every policy
  (`Scheduler.at_tenant_cap`): admission passes over its requests while it is at its cap.
- Preemption picks its victim from the most-served tenant among the requests not yet scheduled this step
  (the highest counter), its most recently admitted request.
Within a tenant, requests go first come, first served, and a preempted one goes back to its tenant's head.
State stays bounded however many labels clients invent: a tenant with nothing queued loses its queue, one
with nothing unfinished loses its counts, and an idle tenant's counter is forgotten once the lift would
give it at least as much (its counter is at or below the floor it would be lifted to).

Lesson: lessons/03-chunked-prefill-and-disaggregation.md#fairness.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterator, Sequence

from core.config import EngineConfig
from core.request import Request
from core.request_queue import RequestQueue
from core.scheduler import Scheduler
from core.scheduler_registry import register_scheduler


class FairRequestQueue(RequestQueue):
    """One first-come-first-served queue per tenant (`Request.group_key`), kept only while it holds
    requests; the head is that of the backlogged tenant with the lowest virtual counter. It reads the
    scheduler's counters and running counts, which change between calls, so its order is always the
    current one."""

    def __init__(self, counters: dict[str, float], num_running: Counter[str]) -> None:
        self._queues: dict[str, deque[Request]] = {}
        self._counters = counters
        self._num_running = num_running
        self._len = 0

    def _order(self, tenant: str) -> tuple[float, int, float, str]:
        return self._counters[tenant], self._num_running[tenant], self._queues[tenant][0].arrival_time, tenant

    def add_request(self, request: Request) -> None:
        self._queues.setdefault(request.group_key, deque()).append(request)
        self._len += 1

    def prepend_request(self, request: Request) -> None:
        self._queues.setdefault(request.group_key, deque()).appendleft(request)
        self._len += 1

    def peek_request(self) -> Request:
        if not self._queues:
            raise IndexError("peek from an empty queue")
        return self._queues[min(self._queues, key=self._order)][0]

    def pop_request(self) -> Request:
        request = self.peek_request()
        self._queues[request.group_key].popleft()
        self._taken(request.group_key)
        return request

    def remove_request(self, request: Request) -> None:
        self._queues.get(request.group_key, deque()).remove(request)  # ValueError if not queued
        self._taken(request.group_key)

    def _taken(self, tenant: str) -> None:
        self._len -= 1
        if not self._queues[tenant]:
            del self._queues[tenant]

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[Request]:
        """Tenants in the current order (lowest counter first), each tenant's requests in its order."""
        return (request for tenant in sorted(self._queues, key=self._order) for request in self._queues[tenant])


@register_scheduler("fair", policy=True)
class FairScheduler(Scheduler):
    """Continuous batching that admits by virtual token counters and preempts the most-served tenant: the
    counters and counts follow each request through the scheduler's hooks."""

    def __init__(self, config: EngineConfig, num_kv_blocks: int, *, cache_namespace: str = "",
                 explain_misses: bool = False) -> None:
        # Before the base's __init__, which builds the queue that reads them (`make_request_queue`).
        self.tenant_weights = dict(config.tenant_weights or ())
        self.virtual_counters: dict[str, float] = {}  # tenant (group_key) -> weighted tokens served
        self.num_running_by_group: Counter[str] = Counter()  # no zero entries, as the next
        self.num_unfinished_by_group: Counter[str] = Counter()
        super().__init__(config, num_kv_blocks, cache_namespace=cache_namespace, explain_misses=explain_misses)

    def make_request_queue(self) -> FairRequestQueue:
        return FairRequestQueue(self.virtual_counters, self.num_running_by_group)

    def on_added(self, request: Request) -> None:
        """A tenant that had nothing unfinished is lifted (no credit banked idle), and idle tenants whose
        counters the lift would overtake anyway are forgotten."""
        tenant = request.group_key
        counters = self.virtual_counters
        if tenant not in self.num_unfinished_by_group:
            active = [counters[t] for t in self.num_unfinished_by_group]
            floor = min(active) if active else max(counters.values(), default=0.0)
            for idle in [t for t, c in counters.items() if c < floor and t not in self.num_unfinished_by_group]:
                del counters[idle]
            counters[tenant] = max(counters.get(tenant, 0.0), floor)
        self.num_unfinished_by_group[tenant] += 1

    def on_admitted(self, request: Request) -> None:
        """Charge the tenant the tokens the request will now compute (its prompt, less the cache)."""
        self.num_running_by_group[request.group_key] += 1
        self._charge(request, request.num_tokens - request.num_computed_tokens)

    def on_computed(self, request: Request, num_new_tokens: int) -> None:
        """Charge the tenant the output tokens the request got."""
        self._charge(request, num_new_tokens)

    def on_left_running(self, request: Request) -> None:
        _decrement(self.num_running_by_group, request.group_key)

    def on_released(self, request: Request) -> None:
        _decrement(self.num_unfinished_by_group, request.group_key)

    def select_victim(self, candidates: Sequence[Request]) -> Request:
        """The most recently admitted request of the most-served tenant among `candidates`."""
        counters = self.virtual_counters
        most = max(counters[r.group_key] for r in candidates)
        return next(r for r in reversed(candidates) if counters[r.group_key] == most)

    def _charge(self, request: Request, num_tokens: int) -> None:
        tenant = request.group_key
        self.virtual_counters[tenant] += num_tokens / self.tenant_weights.get(tenant, 1.0)


def _decrement(counts: Counter[str], tenant: str) -> None:
    """One fewer for `tenant`, and no entry at zero: a long-running engine sees tenants come and go."""
    counts[tenant] -= 1
    if not counts[tenant]:
        del counts[tenant]
