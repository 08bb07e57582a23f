"""The seam between policy and execution: what the scheduler decided, and what the step produced.

`SchedulerOutput` is everything an executor needs to run one step, and `StepResult` everything the
scheduler needs back. Both are plain data: the real runner turns a `SchedulerOutput` into tensors, the
simulator turns it into a `BatchShape` for the cost model, and neither can tell who made it.

`SchedulerInterface` is the whole of what the engine may call on a scheduler, so every policy (a subclass
of `Scheduler`) is reached the same way and no caller reads its queues or its KV cache manager;
`SchedulerStats` is what it reports about itself (the gauges of a server's /metrics, a pool left clean).

Lesson: lessons/06-architecture-map.md (the boxes and the arrows between them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from core.kv_cache_manager import PrefixCacheExplanation
    from core.request import Request, RequestStatus


@dataclass(slots=True)  # not frozen: the simulator builds millions of these, and frozen init is slow
class ScheduledRequest:
    """One request's share of a step: run `token_ids`, which sit at positions
    num_computed_tokens .. num_computed_tokens + len(token_ids) - 1 of the sequence."""

    request_id: str
    token_ids: list[int]
    num_computed_tokens: int  # tokens whose K/V is already cached (the position of token_ids[0])
    block_ids: list[int]  # the request's whole block table after this step's allocation (the KV cache
    # manager's own list, which it replaces rather than changes as the table grows: read only)
    needs_logits: bool  # this chunk reaches the last known token, so the step samples a new one
    num_draft_tokens: int = 0  # the last this many of token_ids are draft tokens to verify (lesson 5)

    @property
    def num_scheduled_tokens(self) -> int:
        return len(self.token_ids)


@dataclass(frozen=True)
class SchedulerOutput:
    """One step's plan. Executors copy blocks before running the model, in this order: `swap_out`, then
    `copy_blocks`, then `swap_in`, so every copy reads a block before anything overwrites it."""

    step_id: int
    scheduled: list[ScheduledRequest]
    preempted_request_ids: list[str] = field(default_factory=list)
    swap_out: list[tuple[int, int]] = field(default_factory=list)  # (device block, host block)
    swap_in: list[tuple[int, int]] = field(default_factory=list)  # (host block, device block)
    copy_blocks: list[tuple[int, int]] = field(default_factory=list)  # copy-on-write (src, dst), on the device
    # memory snapshot after this step's allocation, for KV-utilization plots
    kv_usage: float = 0.0  # fraction of device blocks in use
    num_live_tokens: int = 0  # tokens whose K/V sits (or is written this step) in device blocks, per
    # request: a prefix block shared by k requests counts k times, so it can exceed num_reserved_slots
    num_reserved_slots: int = 0  # token slots of all device blocks in use
    # drafts each running request brought to this step, before any budget cut or preemption (lesson 5)
    num_proposed_tokens: dict[str, int] = field(default_factory=dict)

    @property
    def num_scheduled_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.scheduled)

    @property
    def num_seqs(self) -> int:
        return len(self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled

    @cached_property
    def batch_shape(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(query lengths, cached context lengths) per request: with `num_logit_rows`, all a cost model needs
        to price a step."""
        return (tuple([len(s.token_ids) for s in self.scheduled]),  # a list comprehension: faster than a
                tuple([s.num_computed_tokens for s in self.scheduled]))  # generator, and this runs every step

    @cached_property
    def num_logit_rows(self) -> int:
        """Rows the LM head runs on, as in the real runner: a mid-prompt chunk needs none, a plain decode or a
        prompt's last chunk one, a verify of k drafts 1 + k (every draft is scored)."""
        return sum([1 + s.num_draft_tokens for s in self.scheduled if s.needs_logits])  # a list: faster


@dataclass(frozen=True)
class StepResult:
    """New tokens per request that needed logits: one, or for a speculative step the accepted draft tokens
    followed by one token of the target's own (so 1 .. num_draft_tokens + 1)."""

    sampled_token_ids: dict[str, list[int]]


@dataclass(frozen=True)
class SchedulerStats:
    """The scheduler now (vLLM's name): its queues and pool, and its preemptions since it was built.
    The preemption counts are running totals, so a reader that missed a snapshot misses nothing."""

    num_running_reqs: int
    num_waiting_reqs: int  # waiting or swapped out
    num_kv_blocks: int
    num_free_blocks: int  # evictable prefix-cache blocks count as free
    num_preemptions: int = 0  # preemption events
    num_preempted_reqs: int = 0  # requests preempted at least once
    num_waiting_preempted_reqs: int = 0  # requests waiting (or swapped out) to resume after a preemption

    @property
    def num_unfinished_requests(self) -> int:
        return self.num_running_reqs + self.num_waiting_reqs

    @property
    def kv_cache_usage(self) -> float:
        """Fraction of KV blocks in use (vLLM's `kv_cache_usage`)."""
        return 1 - self.num_free_blocks / self.num_kv_blocks if self.num_kv_blocks else 0.0


class SchedulerInterface(Protocol):
    """What `LLMEngine` calls on its scheduler, and nothing else (`Scheduler` and every policy satisfy it)."""

    num_swap_blocks: int  # the host pool's size, for the runner's swap space

    def add_request(self, request: Request) -> None: ...

    def add_remote_prefilled_request(self, request: Request, num_external_tokens: int,
                                     now: float) -> list[int] | None: ...

    def schedule(self, now: float) -> SchedulerOutput: ...

    def update_from_output(self, output: SchedulerOutput, result: StepResult, now: float) -> list[Request]: ...

    def finish_request(self, request_id: str, status: RequestStatus, now: float, *,
                       num_output_tokens: int | None = None) -> Request | None: ...

    def abort_request(self, request_id: str, now: float = 0.0) -> Request | None: ...

    def get_request(self, request_id: str) -> Request | None: ...

    def has_unfinished_requests(self) -> bool: ...

    def get_num_unfinished_requests(self) -> int: ...

    def unfinished_request_ids(self) -> list[str]: ...

    def running_request_ids(self) -> list[str]: ...

    def make_stats(self) -> SchedulerStats: ...

    def explain_prefix(self, request: Request) -> PrefixCacheExplanation: ...

    def take_prefix_cache_explanation(self, request_id: str) -> PrefixCacheExplanation | None: ...

    def reset_prefix_cache(self, tenant: str | None = None) -> int: ...

    def requests_to_speculate(self) -> list[tuple[Request, int]]: ...

    def update_draft_token_ids(self, draft_token_ids: dict[str, list[int]]) -> None: ...
