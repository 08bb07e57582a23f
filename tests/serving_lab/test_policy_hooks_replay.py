"""A scheduling policy written as hooks only runs in both halves with the same decisions.

Shortest remaining output first admits the waiting request with the fewest output tokens left to produce
(a preempted request has produced some already). The policy keeps each request's tokens left through the
scheduler's lifecycle hooks (`on_added`, `on_computed`, `on_released`) and builds its waiting queue with
`make_request_queue`; it overrides no other method and is registered from this file as a
`scheduling_policy`, with the core's `KeyedRequestQueue`. On a tiny random Llama the engine admits by tokens left, and the simulator, replaying
the engine's step times, schedules the same requests with the same tokens in every step.
"""

from __future__ import annotations

import pytest
from engine_replay import replay

from core import (
    EngineConfig,
    KeyedRequestQueue,
    Request,
    RunMetrics,
    Scheduler,
    Workload,
    WorkloadRequest,
    register_scheduler,
)
from ref_engine.bench import run
from ref_engine.model.loader import load_model


@register_scheduler("shortest-remaining-output-first", policy=True)
class ShortestRemainingOutputFirst(Scheduler):
    """Hooks only: each unfinished request's output tokens left, and a waiting queue ordered by them (a
    request is filed by its count at that moment: a preempted one by what it has left)."""

    tokens_left: dict[str, int]

    def make_request_queue(self) -> KeyedRequestQueue:
        self.tokens_left = {}  # built with the queue that reads it
        return KeyedRequestQueue(lambda request: self.tokens_left[request.request_id])

    def on_added(self, request: Request) -> None:
        self.tokens_left[request.request_id] = request.max_tokens - request.num_output_tokens

    def on_computed(self, request: Request, num_new_tokens: int) -> None:
        self.tokens_left[request.request_id] -= num_new_tokens

    def on_released(self, request: Request) -> None:
        del self.tokens_left[request.request_id]


@pytest.fixture(scope="module")
def tiny(make_tiny_hf_model, device):
    return load_model(make_tiny_hf_model("llama", name="hooks-llama", max_position_embeddings=512), device=device)


def decisions(metrics: RunMetrics) -> list[tuple[tuple[str, ...], tuple[int, ...], tuple[int, ...]]]:
    """Every step's rows: who ran, with how many new tokens, after how many computed ones."""
    return [(s.request_ids, s.query_lens, s.context_lens) for s in metrics.steps]


def both_sides(tiny, workload: Workload, **knobs) -> tuple[RunMetrics, RunMetrics]:
    """The engine's run and the simulator's replay of it, checked to make the same decisions."""
    config = EngineConfig(block_size=8, max_num_batched_tokens=64, **knobs)
    measured = run(workload, config, model=tiny)
    simulated = replay(measured, workload, config, tiny.arch)
    assert decisions(simulated) == decisions(measured)
    return measured, simulated


@pytest.mark.parametrize("policy", ["fcfs", "shortest-remaining-output-first"])
def test_the_fewest_tokens_left_are_admitted_first_on_both_sides(tiny, policy):
    """One request at a time, all queued at once: the admission order is the order of their outputs."""
    output_lens = (30, 4, 18, 9, 25, 12)
    workload = Workload(tuple(WorkloadRequest(0.0, 10, n) for n in output_lens), name="all at once")
    expected = sorted(output_lens) if policy != "fcfs" else list(output_lens)
    for metrics in both_sides(tiny, workload, max_num_seqs=1, num_kv_blocks=32, scheduling_policy=policy):
        admitted = sorted(metrics.requests, key=lambda row: row.first_scheduled_time)
        assert [row.num_output_tokens for row in admitted] == expected


def test_preempted_requests_are_filed_by_what_they_have_left_on_both_sides(tiny):
    """Poisson arrivals, batches of several, chunked prefill and a pool small enough to preempt."""
    workload = Workload.synthetic(30, prompt_len=(8, 100), output_len=(4, 60), arrival=200.0, seed=7)
    measured, simulated = both_sides(tiny, workload, max_num_seqs=6, num_kv_blocks=24,
                                     scheduling_policy="shortest-remaining-output-first")
    assert measured.num_preemptions > 0, "the pool was meant to be small enough to preempt"
    assert [row.num_preemptions for row in simulated.requests] == [row.num_preemptions for row in measured.requests]
