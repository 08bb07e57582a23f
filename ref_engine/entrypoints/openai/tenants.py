"""Tenants as the server knows them: who a request belongs to, and what that tenant may use.

A tenant comes from authentication only (an API key), never from a field the client fills in: the
tenant is the prefix cache's isolation boundary, so a client that could name another tenant could probe
that tenant's cached prefixes by timing. Without API keys the whole server is one tenant, as in vLLM
(everyone shares the cache; `cache_salt` still splits it); the request's `user` field may then group
requests for the "fair" policy, which is scheduling, not security.

`TenantPolicy` is one tenant's limits, from an API-key file (`--api-key-file`) or a deployment
manifest's `tenants:` section: its weight and running cap go to the engine's scheduler, its pending cap
and token budget are admission control in the API server (a 429, with `Retry-After` for the budget).

Lesson: lessons/06-architecture-map.md (the API server).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TenantPolicy:
    """One tenant's share and limits; None means "no limit of that kind"."""

    weight: float = 1.0  # the "fair" policy's share of the device
    max_num_seqs: int | None = None  # most of its requests running at once (engine)
    max_pending_requests: int | None = None  # most of its requests open in the server at once (429 past it)
    token_budget: int | None = None  # prompt + max_tokens it may send per window (429 + Retry-After past it)
    budget_window_s: float = 60.0  # the window `token_budget` counts over
