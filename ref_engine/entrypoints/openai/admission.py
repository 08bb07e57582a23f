"""Admission control in the API server: how many requests may be open at once, in all and per tenant, and
how many tokens a tenant may send per time window.

A request is admitted or refused in one synchronous call (`Admission.admit`) that checks every limit and
reserves its slots before the server awaits anything, so requests arriving together cannot all pass the
check before any of them is counted. The slots are released one by one as the request's engine requests
end (`Reservation.release`), however they end.

What is refused, and how:
- a request that could never be admitted (`n` beyond a pending cap, more tokens than a whole budget): 400,
  since retrying cannot help;
- the server's or the tenant's pending cap reached: 429, retry later;
- the tenant's token budget spent for this window: 429 with `Retry-After`, the seconds until enough of the
  window's spending ages out. A budget counts what a request may cost: its prompt tokens plus `max_tokens`,
  charged at admission.

Every structure here is bounded: pending counts exist only for tenants with open requests, and a budget's
window only for tenants that have a budget (the key file's or manifest's tenants).

Lesson: lessons/06-architecture-map.md (the API server).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from ref_engine.entrypoints.openai.tenants import TenantPolicy


class AdmissionRefused(Exception):
    """Why a request was not admitted: its HTTP status, a reason (a metric label), and for a spent budget
    the seconds after which a retry can succeed."""

    def __init__(self, status: int, reason: str, message: str, param: str | None = None,
                 retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.status, self.reason, self.message, self.param = status, reason, message, param
        self.retry_after_s = retry_after_s


@dataclass
class Reservation:
    """The slots one admitted HTTP request holds: one per engine request."""

    admission: Admission
    tenant: str | None
    num_slots: int

    def release(self) -> None:
        """One engine request ended; safe to call once per slot, and no more."""
        if self.num_slots > 0:
            self.num_slots -= 1
            self.admission._release(self.tenant)


class Admission:
    def __init__(self, max_pending_requests: int, policies: dict[str, TenantPolicy] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """`policies`: by tenant (authenticated); a tenant not named has no limits of its own. `clock`:
        seconds, for the budget windows (a test passes its own)."""
        self.max_pending_requests = max_pending_requests
        self.policies = policies or {}
        self.clock = clock
        self.num_pending = 0
        self._pending_by_tenant: dict[str | None, int] = {}
        self._spent: dict[str, deque[tuple[float, int]]] = {}  # tenant -> (when, tokens), oldest first

    def pending(self, tenant: str | None) -> int:
        return self._pending_by_tenant.get(tenant, 0)

    def admit(self, tenant: str | None, num_requests: int, num_tokens: int) -> Reservation:
        """Reserve `num_requests` slots and charge `num_tokens` to the tenant's budget, or refuse
        (`AdmissionRefused`) changing nothing. Synchronous on purpose: see the module docstring."""
        policy = self.policies.get(tenant) if tenant is not None else None
        tenant_cap = policy.max_pending_requests if policy else None
        caps = [(self.max_pending_requests, "the server", self.num_pending, "max_pending_requests")]
        if tenant_cap is not None:
            caps.append((tenant_cap, f"tenant {tenant!r}", self.pending(tenant), "tenant_max_pending_requests"))
        for cap, who, _, _ in caps:
            if num_requests > cap:
                raise AdmissionRefused(400, "too_many_choices", f"this request needs {num_requests} engine "
                                       f"requests (prompts x n) but {who} allows at most {cap} open at once", "n")
        for cap, who, open_now, reason in caps:
            if open_now + num_requests > cap:
                raise AdmissionRefused(429, reason, f"{who} is at its limit of {cap} open requests; retry later")
        if policy is not None and policy.token_budget is not None:
            self._check_budget(tenant, policy, num_tokens)
            self._spent.setdefault(tenant, deque()).append((self.clock(), num_tokens))
        self.num_pending += num_requests
        self._pending_by_tenant[tenant] = self.pending(tenant) + num_requests
        return Reservation(self, tenant, num_requests)

    def _check_budget(self, tenant: str, policy: TenantPolicy, num_tokens: int) -> None:
        budget, window = policy.token_budget, policy.budget_window_s
        if num_tokens > budget:
            raise AdmissionRefused(400, "over_token_budget", f"this request may use {num_tokens} tokens (prompt + "
                                   f"max_tokens) but tenant {tenant!r} has a budget of {budget} per "
                                   f"{window:g} s; send a shorter prompt or a smaller max_tokens", "max_tokens")
        now = self.clock()
        spent = self._spent.get(tenant, deque())
        while spent and spent[0][0] <= now - window:
            spent.popleft()
        used = sum(tokens for _, tokens in spent)
        if used + num_tokens <= budget:
            return
        freed, wait = used + num_tokens - budget, 0.0  # the oldest spending that must age out first
        for when, tokens in spent:
            freed -= tokens
            wait = when + window - now
            if freed <= 0:
                break
        raise AdmissionRefused(429, "token_budget", f"tenant {tenant!r} has used {used} of its {budget} tokens "
                               f"per {window:g} s; this request needs {num_tokens}", "max_tokens",
                               retry_after_s=max(1, math.ceil(wait)))

    def _release(self, tenant: str | None) -> None:
        self.num_pending -= 1
        left = self.pending(tenant) - 1
        if left:
            self._pending_by_tenant[tenant] = left
        else:
            del self._pending_by_tenant[tenant]
