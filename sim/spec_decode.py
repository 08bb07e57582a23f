"""Speculative decoding in the simulator: acceptance as a number, the draft's cost from its dims.

The simulator has no tokens to guess, so a proposer is modelled by what it achieves. An `AcceptanceModel`
says how many drafts a request carries into a step and how many of them the verifier accepts:
- `AcceptanceRate`: every proposed draft token is accepted with probability a_i at draft position i
  (one rate for all positions, or one per position, set by hand or measured from the engine's
  `RunMetrics.acceptance_by_position`); acceptance stops at the first rejection, as in the engine. With
  one rate a, a verify of k drafts emits (1 - a^(k+1)) / (1 - a) tokens on average (Leviathan et al.,
  ICML'23, Eq. 1), which tests/sim/test_simulated_speculation.py checks;
- `AcceptanceReplay`: the engine's own per-step counts (`StepRecord.verified`), so the shared scheduler
  makes exactly the engine's decisions and only step times can differ.
`break_even_acceptance` inverts the formula: the acceptance rate a verify step of a given cost needs to pay.

`SimulatedProposer` applies the model around the shared core's rule (`Scheduler.requests_to_speculate`):
after each step's update, as the engine's proposers do, it hands the scheduler dummy drafts for the next
step (`Scheduler.update_draft_token_ids`), and after a step it returns accepted + 1 dummy tokens per verify.
`DraftCostTimer` adds the draft model's k forward passes to the target's step time, priced by a second
`CostModel` on the draft's own dimensions (n-gram lookup costs nothing here).

Lesson: lessons/05-speculative-decoding.md (simulating speculation).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import Protocol

from core.interfaces import SchedulerOutput, StepResult
from core.metrics import StepRecord
from core.scheduler import Scheduler
from sim.cost_model import BatchShape, CostModel
from sim.executor import DUMMY_TOKEN_ID, StepTimer


class AcceptanceModel(Protocol):
    def num_drafts(self, step_id: int, request_id: str, most: int) -> int:
        """Draft tokens the request carries into step `step_id` (at most `most`)."""

    def num_accepted(self, step_id: int, request_id: str, num_drafts: int) -> int:
        """How many of its `num_drafts` draft tokens the verifier accepts in step `step_id`."""

    def for_replica(self) -> AcceptanceModel:
        """This model as one replica's run starts it: any random state back at its seed, its own, so that a
        second run on the same `Simulator` repeats the first and two replicas do not share one stream."""


@dataclass
class AcceptanceRate:
    """Always draft the most allowed; accept draft position i with probability `rates[i]` (the last rate
    for positions past the list), stopping at the first rejection. Seeded: the same run twice gives the
    same counts (each replica's run draws from a fresh generator: `for_replica`)."""

    rates: tuple[float, ...]
    seed: int = 0
    _rng: random.Random = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.rates, (int, float)):
            self.rates = (float(self.rates),)
        if not self.rates or not all(0.0 <= a <= 1.0 for a in self.rates):
            raise ValueError(f"acceptance rates must be in [0, 1], got {self.rates!r}")
        self._rng = random.Random(self.seed)

    def num_drafts(self, step_id: int, request_id: str, most: int) -> int:
        return most

    def for_replica(self) -> AcceptanceRate:
        return replace(self)  # a new generator from `seed` (__post_init__)

    def num_accepted(self, step_id: int, request_id: str, num_drafts: int) -> int:
        accepted = 0
        while accepted < num_drafts and self._rng.random() < self.rates[min(accepted, len(self.rates) - 1)]:
            accepted += 1
        return accepted


class AcceptanceReplay:
    """The engine's drafts and acceptances, step by step, from its `RunMetrics.steps`."""

    def __init__(self, steps: list[StepRecord]) -> None:
        self.proposed = {(s.step_id, request_id): n for s in steps for request_id, n in s.proposed}
        self.accepted = {(s.step_id, request_id): accepted for s in steps for request_id, _, accepted in s.verified}

    def num_drafts(self, step_id: int, request_id: str, most: int) -> int:
        return self.proposed.get((step_id, request_id), 0)

    def num_accepted(self, step_id: int, request_id: str, num_drafts: int) -> int:
        return self.accepted[(step_id, request_id)]

    def for_replica(self) -> AcceptanceReplay:
        return self  # no state: reads its tables only


def expected_tokens_per_step(acceptance_rate: float, k: int) -> float:
    """Leviathan et al.'s Eq. 1: a verify of k drafts, each accepted with probability a, emits
    1 + a + a^2 + ... + a^k = (1 - a^(k+1)) / (1 - a) tokens on average (k + 1 when a = 1)."""
    if acceptance_rate >= 1.0:
        return k + 1.0
    return (1 - acceptance_rate ** (k + 1)) / (1 - acceptance_rate)


def break_even_acceptance(k: int, step_cost: float) -> float:
    """The acceptance rate at which speculation with k drafts neither gains nor loses: the a where a verify
    step's expected tokens, (1 - a^(k+1)) / (1 - a), equal its cost in plain decode steps, `step_cost`
    (1 + k c for a draft pass costing c target steps and a verify priced as one step; or the cost model's
    price of a verify step over a plain one, drafts included). The speed-up is
    (1 - a^(k+1)) / ((1 - a) step_cost), above 1 exactly when a is above this rate. 0 when the step costs no
    more than a plain one; ValueError when it costs more than the k + 1 tokens it can emit at best."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if step_cost <= 1.0:
        return 0.0
    if step_cost > k + 1:
        raise ValueError(f"a step costing {step_cost} plain steps never pays: it emits at most {k + 1} tokens")
    low, high = 0.0, 1.0  # expected_tokens_per_step rises with a: bisect to well below any rounding shown
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (middle, high) if expected_tokens_per_step(middle, k) < step_cost else (low, middle)
    return (low + high) / 2


class SimulatedProposer:
    """Dummy drafts for the next step and dummy verified tokens after a step, as `acceptance` decides."""

    def __init__(self, acceptance: AcceptanceModel) -> None:
        self.acceptance = acceptance.for_replica()

    def propose(self, scheduler: Scheduler) -> None:
        """Drafts for the step the scheduler runs next; call after `update_from_output`."""
        step_id = scheduler.num_steps
        scheduler.update_draft_token_ids({
            request.request_id: [DUMMY_TOKEN_ID] * self.acceptance.num_drafts(step_id, request.request_id, most)
            for request, most in scheduler.requests_to_speculate()})

    def verify(self, output: SchedulerOutput) -> StepResult:
        return StepResult({
            s.request_id: [DUMMY_TOKEN_ID] * (1 + (self.acceptance.num_accepted(
                output.step_id, s.request_id, s.num_draft_tokens) if s.num_draft_tokens else 0))
            for s in output.scheduled if s.needs_logits})


class DraftCostTimer:
    """The target's step time (from `target`, any step timer) plus the draft model's passes: pass j runs
    one token for every request with more than j drafts, after its context and the j drafts before."""

    def __init__(self, target: StepTimer, draft: CostModel) -> None:
        self.target = target
        self.draft = draft

    def step_time(self, output: SchedulerOutput) -> float:
        spec = [(s.num_draft_tokens, s.num_computed_tokens) for s in output.scheduled if s.num_draft_tokens]
        draft_s = sum(self.draft.step_time(BatchShape.from_pairs([(1, c + j) for d, c in spec if d > j]))
                      for j in range(max((d for d, _ in spec), default=0)))
        return self.target.step_time(output) + draft_s
