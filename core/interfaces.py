"""The seam between policy and execution: what the scheduler decided, and what the step produced.

`SchedulerOutput` is everything an executor needs to run one step, and `StepResult` everything the
scheduler needs back. Both are plain data: the real runner turns a `SchedulerOutput` into tensors, the
simulator turns it into a `BatchShape` for the cost model, and neither can tell who made it.

Lesson: lessons/06-architecture-map.md (the boxes and the arrows between them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property


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
