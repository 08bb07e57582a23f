"""`StepFeed`: what the API server keeps of the engine core's steps for `serve --dashboard`.

With the dashboard on, the engine core ships a `StepSummary` per step with its outputs
(core/step_summary.py); `AsyncLLM` hands them here. The feed keeps only the newest `max_steps`, each
numbered, so a page that connects late still gets a full timeline and one that falls behind skips ahead:
it never grows, and the engine core never waits for it (nothing here is sent back). The newest KV pool
snapshot is kept apart, since only some summaries carry one.

It also counts each tenant's service as `RunMetrics.jain_fairness` defines it: a request's prompt tokens
once its first token is out (its prefill is done), then its output tokens as they stream. Those are
counted from the outputs this process routes, where the tenant of each stream is known; the engine core
need not say whose rows a step ran.

Lesson: lessons/06-architecture-map.md (what the API server sees of the loop).
"""

from __future__ import annotations

from collections import Counter, deque

from core.kv_pool_snapshot import KVPoolSnapshot
from core.step_summary import StepSummary

MAX_STEPS = 1024  # newest step summaries kept: a page's timeline draws fewer


class StepFeed:
    def __init__(self, max_steps: int = MAX_STEPS) -> None:
        if max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        self.steps: deque[StepSummary] = deque(maxlen=max_steps)
        self.num_steps = 0  # every summary ever added: the newest one's number
        self.kv_pool: KVPoolSnapshot | None = None
        self.num_kv_pools = 0  # snapshots ever seen: tells a reader whether `kv_pool` is new to it
        self.tenant_service: Counter[str] = Counter()  # tenant -> tokens served

    def add(self, summaries: list[StepSummary]) -> None:
        for summary in summaries:
            self.steps.append(summary)
            if summary.kv_pool is not None:
                self.kv_pool = summary.kv_pool
                self.num_kv_pools += 1
        self.num_steps += len(summaries)

    def add_service(self, tenant: str, num_tokens: int) -> None:
        self.tenant_service[tenant] += num_tokens

    def steps_after(self, number: int) -> list[StepSummary]:
        """The kept summaries numbered above `number` (1 is the first ever), oldest first."""
        new = self.num_steps - number
        if new <= 0:
            return []
        return list(self.steps)[-new:] if new < len(self.steps) else list(self.steps)
