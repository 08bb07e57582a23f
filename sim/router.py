"""Routers: which replica of a fleet serves a request. Policies are plug-ins, looked up by name.

This module owns the routing decision of a simulated fleet (`sim.cluster.Cluster`): a router sees the
request and the replicas that can take work now, and picks one. It reads only what a real router can know:
each replica's queue (requests waiting or running there), its KV-cache usage as the engine reports it
(vLLM's `kv_cache_usage_perc` gauge), and what the router itself routed before.

Policies (`ROUTERS`; `make_router(name, fleet)`)
- "round_robin": replica 0, 1, 2, ... in turn.
- "least_loaded": the replica with the fewest outstanding (waiting + running) requests, as the vLLM
  router's and Envoy's "least request" policies; lowest index on ties.
- "least_kv": the replica whose KV pool is least used; ties by outstanding requests. It sees memory
  pressure (long contexts) that a request count hides.
- "prefix_aware": the replica most likely to hold the prompt's prefix in its cache, as SGLang's
  cache-aware router, the vLLM router and llm-d's prefix scorer do. The router keeps its own index: per
  replica, the hash chains of the prompts it sent there (core/block_hash.py's chain, one per full
  block), bounded to the replica's KV pool in blocks and forgetting the least recently routed first, so it
  approximates what the replica's cache still holds without asking it. A request goes to the replica with
  the longest indexed prefix if that covers at least `cache_threshold` of its full blocks and that replica
  is not more than `balance_slack` requests busier than the least loaded one; otherwise to the least
  loaded. Without the two guards a prefix every request shares (one system prompt) would send the whole
  stream to one replica. The index is blind to tenants: a prompt another tenant sent draws the request
  to where that tenant's blocks are (the engine still never shares them: core/block_hash.py keys blocks by
  tenant).
- "tenant_aware": "prefix_aware" with every chain keyed by the request's tenant and cache salt, the same
  isolation key the engine's cache uses, so a tenant's prefixes never route-share with another's: where a
  request goes never depends on what another tenant sent (access-aware routing; lesson 4's side channel,
  one level up).
- "session_affinity": the first request of a session (the OpenAI `user` field, `Request.user`) goes to
  the least loaded replica, and every later one of that session to the same replica while it can take
  work, so a conversation's history stays in one cache; requests without a session go to the least loaded.

A plug-in: a class with `route(request, replicas) -> replica` (and, optionally, `forget(replica)`, called
when a replica leaves the fleet), registered with `@register_router("name")`; its constructor receives the
`Fleet` facts. `replicas` is never empty and holds only replicas that take new work (an autoscaled fleet
leaves out those starting or draining), in a stable order.

Lesson: lessons/07-tuning-knobs.md#from-one-replica-to-a-fleet (the routers compared on a shared-prefix
workload); lessons/04-prefix-caching.md#tenant-isolation (why the index is keyed by tenant).
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from core.block_hash import BlockHash, extend_block_hashes, isolation_key
from core.request import Request
from sim.executor import SimulatedExecutor


@dataclass(frozen=True)
class Fleet:
    """What every replica of a fleet shares, as a router needs it: the model (whose name namespaces block
    hashes), the block size, and one replica's KV pool in blocks (the bound of a prefix index)."""

    model: str
    block_size: int
    num_kv_blocks: int


class Router(Protocol):
    def route(self, request: Request, replicas: Sequence[SimulatedExecutor]) -> SimulatedExecutor: ...


RouterFactory = Callable[[Fleet], Router]
ROUTERS: dict[str, RouterFactory] = {}


def register_router(name: str) -> Callable[[RouterFactory], RouterFactory]:
    """Class decorator: make a policy available to `Cluster(router=name)`."""
    def register(factory: RouterFactory) -> RouterFactory:
        if name in ROUTERS:
            raise ValueError(f"a router named {name!r} is already registered")
        ROUTERS[name] = factory
        return factory
    return register


def make_router(name: str, fleet: Fleet) -> Router:
    if name not in ROUTERS:
        raise ValueError(f"unknown router {name!r}; known: {', '.join(ROUTERS)}")
    return ROUTERS[name](fleet)


def least_loaded(replicas: Sequence[SimulatedExecutor]) -> SimulatedExecutor:
    """The replica with the fewest outstanding requests; `min` keeps the first of equals."""
    return min(replicas, key=lambda replica: replica.num_unfinished)


@register_router("round_robin")
class RoundRobinRouter:
    def __init__(self, fleet: Fleet) -> None:
        self._turn = itertools.count()

    def route(self, request: Request, replicas: Sequence[SimulatedExecutor]) -> SimulatedExecutor:
        return replicas[next(self._turn) % len(replicas)]


@register_router("least_loaded")
class LeastLoadedRouter:
    def __init__(self, fleet: Fleet) -> None:
        pass

    def route(self, request: Request, replicas: Sequence[SimulatedExecutor]) -> SimulatedExecutor:
        return least_loaded(replicas)


@register_router("least_kv")
class LeastKVRouter:
    def __init__(self, fleet: Fleet) -> None:
        pass

    def route(self, request: Request, replicas: Sequence[SimulatedExecutor]) -> SimulatedExecutor:
        return min(replicas, key=lambda replica: (replica.scheduler.make_stats().kv_cache_usage,
                                                  replica.num_unfinished))


@register_router("prefix_aware")
class PrefixAwareRouter:
    """Longest routed prefix wins, within the two guards (module docstring). `last_decision`: the replica
    the last request went to and how many of its leading blocks that replica's index held."""

    isolate_tenants = False
    cache_threshold = 0.5  # the fraction of a prompt's full blocks a match must cover to count
    balance_slack = 16  # how many more outstanding requests than the least loaded a match may sit behind

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self._index: dict[str, OrderedDict[BlockHash, None]] = {}  # replica name -> routed block hashes, LRU
        self.last_decision: tuple[str, int] | None = None

    def chain(self, request: Request) -> list[BlockHash]:
        """The prompt's full blocks as a hash chain, keyed by the tenant only if this router isolates them."""
        tenant, salt = (request.tenant, request.cache_salt) if self.isolate_tenants else (None, None)
        hashes: list[BlockHash] = []
        extend_block_hashes(hashes, request.prompt_token_ids, self.fleet.block_size,
                            isolation_key(self.fleet.model, tenant, salt))
        return hashes

    def route(self, request: Request, replicas: Sequence[SimulatedExecutor]) -> SimulatedExecutor:
        chain = self.chain(request)
        match = {replica.name: self._match(self._index.get(replica.name), chain) for replica in replicas}
        fallback = least_loaded(replicas)
        limit = fallback.num_unfinished + self.balance_slack
        best = max((r for r in replicas if r.num_unfinished <= limit), key=lambda r: match[r.name])  # first of equals
        if not match[best.name] or match[best.name] < self.cache_threshold * len(chain):
            best = fallback
        self._remember(best.name, chain)
        self.last_decision = (best.name, match[best.name])
        return best

    @staticmethod
    def _match(index: OrderedDict[BlockHash, None] | None, chain: list[BlockHash]) -> int:
        """Leading blocks of `chain` in `index`: a chain link names its whole prefix, so the first miss ends it."""
        if not index:
            return 0
        n = 0
        for block_hash in chain:
            if block_hash not in index:
                break
            n += 1
        return n

    def _remember(self, name: str, chain: list[BlockHash]) -> None:
        index = self._index.setdefault(name, OrderedDict())
        for block_hash in chain:
            index[block_hash] = None
            index.move_to_end(block_hash)
        while len(index) > self.fleet.num_kv_blocks:
            index.popitem(last=False)

    def forget(self, replica: SimulatedExecutor) -> None:
        """A replica left the fleet: its cache went with it."""
        self._index.pop(replica.name, None)


@register_router("tenant_aware")
class TenantAwareRouter(PrefixAwareRouter):
    isolate_tenants = True


@register_router("session_affinity")
class SessionAffinityRouter:
    def __init__(self, fleet: Fleet) -> None:
        self._home: dict[str, str] = {}  # session -> replica name

    def route(self, request: Request, replicas: Sequence[SimulatedExecutor]) -> SimulatedExecutor:
        if request.user is not None:
            home = self._home.get(request.user)
            for replica in replicas:
                if replica.name == home:
                    return replica
        replica = least_loaded(replicas)
        if request.user is not None:
            self._home[request.user] = replica.name
        return replica

    def forget(self, replica: SimulatedExecutor) -> None:
        self._home = {session: name for session, name in self._home.items() if name != replica.name}
