"""A scheduling policy written from outside the core, with the plug-in API only, runs in both halves.

Shortest prompt first is a waiting queue ordered by prompt length (ties by arrival), registered under a new
`EngineConfig.scheduling` name from this file: no edit to the core. On a tiny random Llama it admits the
shorter prompts first, and the simulator, replaying the engine's step times, makes every one of the
engine's decisions (as tests/serving_lab/test_replay_engine.py shows for the built-in policy).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator

import pytest
from engine_replay import batches, replay

from core import (
    EngineConfig,
    Request,
    RequestQueue,
    Scheduler,
    Workload,
    WorkloadRequest,
    register_scheduler,
)
from ref_engine.bench import run
from ref_engine.model.loader import load_model


class ShortestPromptFirstQueue(RequestQueue):
    """Waiting requests by prompt length, shortest first; ties by arrival. A preempted request is filed by
    the same key, so it keeps its place among the others."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, float, int, Request]] = []
        self._order = itertools.count()  # the last tie-break: never compare two Requests

    def add_request(self, request: Request) -> None:
        heapq.heappush(self._heap, (request.num_prompt_tokens, request.arrival_time, next(self._order), request))

    prepend_request = add_request

    def peek_request(self) -> Request:
        return self._heap[0][-1]

    def pop_request(self) -> Request:
        return heapq.heappop(self._heap)[-1]

    def remove_request(self, request: Request) -> None:
        self._heap = [entry for entry in self._heap if entry[-1] is not request]
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[Request]:
        return (entry[-1] for entry in sorted(self._heap))


@register_scheduler("shortest-prompt-first")
class ShortestPromptFirstScheduler(Scheduler):
    request_queue_class = ShortestPromptFirstQueue


@pytest.fixture(scope="module")
def tiny(make_tiny_hf_model, device):
    return load_model(make_tiny_hf_model("llama", name="plugin-llama", max_position_embeddings=512), device=device)


@pytest.mark.parametrize("scheduling", ["continuous", "shortest-prompt-first"])
def test_shorter_prompts_are_admitted_first(tiny, scheduling):
    """One request at a time, all queued at once: each prefill is one step of the whole prompt, so the
    prefill lengths in step order are the admission order."""
    lengths = (40, 9, 31, 17, 24, 12)
    workload = Workload(tuple(WorkloadRequest(0.0, n, 3) for n in lengths), name="all at once")
    config = EngineConfig(max_num_seqs=1, max_num_batched_tokens=64, block_size=8, num_kv_blocks=32,
                          scheduling=scheduling)
    measured = run(workload, config, model=tiny)
    simulated = replay(measured, workload, config, tiny.arch)

    expected = sorted(lengths) if scheduling == "shortest-prompt-first" else list(lengths)
    for metrics in (measured, simulated):
        assert [q for (q,) in (s.query_lens for s in metrics.steps) if q > 1] == expected
    assert batches(simulated) == batches(measured)


def test_replayed_simulation_makes_the_plugin_policys_decisions(tiny):
    """Poisson arrivals, batches of several, chunked prefill and a pool small enough to preempt."""
    workload = Workload.synthetic(24, prompt_len=(8, 120), output_len=(4, 40), arrival=150.0, seed=5)
    config = EngineConfig(max_num_seqs=6, max_num_batched_tokens=64, num_kv_blocks=24, block_size=8,
                          scheduling="shortest-prompt-first")
    measured = run(workload, config, model=tiny)
    simulated = replay(measured, workload, config, tiny.arch)

    assert measured.num_preemptions > 0, "the pool was meant to be small enough to preempt"
    assert batches(simulated) == batches(measured)
    assert simulated.num_preemptions == measured.num_preemptions
