"""Checks for lesson 1's exercises; `impl` is the reference or your stub (see conftest.py).

E01.1 is compared with the engine's own `Scheduler` on hand-worked cases and on random ones (hypothesis).
E01.2 is compared with step counts from the engine's `Scheduler` and `StaticScheduler`, driven by a fake
executor that "samples" one token per request that needs one: no model, no clock, no torch. E01.3 (design)
serves your plan in the simulator (datasheet GPU profiles, 200 requests, deterministic): it must meet the
targets and use at most one replica more than the reference plan.
"""

from __future__ import annotations

import functools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core import EngineConfig, Request, StepResult, make_scheduler
from lessons.exercises.e01_continuous_batching import DeploymentPlan, DeploymentTarget, ToyRequest
from lessons.exercises.solutions import e01_continuous_batching as engine  # wraps ref_engine's Scheduler

FEW = settings(max_examples=60, deadline=None, derandomize=True)  # the same examples on every run


def decoding(rid: str, prompt: int = 5, generated: int = 1) -> ToyRequest:
    return ToyRequest(rid, prompt, generated, prompt + generated - 1)


def new(rid: str, prompt: int) -> ToyRequest:
    return ToyRequest(rid, prompt)


# ---- E01.1 -------------------------------------------------------------------------------------------

CASES = [
    # (running, waiting, budget, max_num_seqs, chunked, expected)
    pytest.param([decoding("a"), decoding("b")], [new("c", 10)], 8, 4, True, {"a": 1, "b": 1, "c": 6},
                 id="decode-first-then-a-chunk"),
    pytest.param([decoding("a"), decoding("b")], [new("c", 10)], 12, 4, False, {"a": 1, "b": 1, "c": 10},
                 id="whole-prompt-fits"),
    pytest.param([decoding("a"), decoding("b")], [new("c", 11), new("d", 2)], 12, 4, False, {"a": 1, "b": 1},
                 id="no-chunking-head-of-line-blocking"),
    pytest.param([decoding("a"), decoding("b")], [new("c", 11), new("d", 2)], 12, 4, True,
                 {"a": 1, "b": 1, "c": 10}, id="chunking-fills-the-budget"),
    pytest.param([decoding("a"), decoding("b"), decoding("c")], [new("d", 2), new("e", 2)], 64, 4, True,
                 {"a": 1, "b": 1, "c": 1, "d": 2}, id="max-num-seqs"),
    pytest.param([ToyRequest("a", 100, 0, 64), decoding("b")], [new("c", 3)], 32, 4, True, {"a": 32},
                 id="a-long-prefill-chunk-takes-the-whole-budget"),
    pytest.param([ToyRequest("a", 10, 0, 4), decoding("b")], [new("c", 3)], 32, 4, True,
                 {"a": 6, "b": 1, "c": 3}, id="rest-of-a-chunked-prompt"),
    pytest.param([], [new("p", 5, ), ToyRequest("q", 4, 3, 0)], 64, 4, True, {"p": 5, "q": 7},
                 id="recompute-prompt-and-output"),
    pytest.param([decoding("a")], [], 1, 1, True, {"a": 1}, id="nothing-waiting"),
]


@pytest.mark.parametrize("running, waiting, budget, max_num_seqs, chunked, expected", CASES)
def test_e01_1_hand_worked_cases(impl, running, waiting, budget, max_num_seqs, chunked, expected):
    got = impl.schedule_step(running, waiting, budget, max_num_seqs, chunked)
    assert got == expected
    assert list(got) == list(expected), "requests must appear in the order they were scheduled"


@st.composite
def step_states(draw):
    """Random but reachable states: decoding or mid-prefill running requests, a queue of fresh or
    preempted (recompute) requests, a budget and a batch limit."""
    chunked = draw(st.booleans())
    max_num_seqs = draw(st.integers(1, 8))
    running, waiting = [], []
    for i in range(draw(st.integers(0, max_num_seqs))):
        prompt = draw(st.integers(1, 40))
        if chunked and prompt > 1 and draw(st.booleans()):
            running.append(ToyRequest(f"r{i}", prompt, 0, draw(st.integers(1, prompt - 1))))  # mid-prefill
        else:
            running.append(decoding(f"r{i}", prompt, draw(st.integers(1, 8))))
    for i in range(draw(st.integers(0, 6))):
        waiting.append(ToyRequest(f"w{i}", draw(st.integers(1, 40)), draw(st.sampled_from([0, 0, 0, 3]))))
    longest = max((r.num_tokens for r in running + waiting), default=1)
    # without chunking the engine requires a budget that holds any prompt
    budget = draw(st.integers(1, 64)) if chunked else draw(st.integers(longest + 1, longest + 40))
    return running, waiting, budget, max_num_seqs, chunked


@FEW
@given(step_states())
def test_e01_1_matches_the_engine_scheduler(impl, state):
    running, waiting, budget, max_num_seqs, chunked = state
    got = impl.schedule_step(running, waiting, budget, max_num_seqs, chunked)  # yours first: a stub fails fast
    expected = engine.schedule_step(running, waiting, budget, max_num_seqs, chunked)
    assert got == expected and list(got) == list(expected)
    assert sum(got.values()) <= budget
    assert all(n >= 1 for n in got.values())


# ---- E01.2 -------------------------------------------------------------------------------------------

def engine_steps(output_lens: list[int], batch_size: int, scheduling: str) -> int:
    """Steps the engine's scheduler takes for 1-token prompts with these outputs (fake executor)."""
    config = EngineConfig(max_num_seqs=batch_size, max_num_batched_tokens=max(batch_size, 16),
                          max_model_len=max(output_lens) + 2, scheduling=scheduling)
    blocks = sum(n + 2 for n in output_lens)  # plenty: memory must not be what limits the batch
    scheduler = make_scheduler(config, num_kv_blocks=blocks)
    for i, n in enumerate(output_lens):
        scheduler.add_request(Request(str(i), prompt_token_ids=[7], max_tokens=n, ignore_eos=True))
    steps = 0
    while scheduler.has_unfinished_requests():
        out = scheduler.schedule(now=float(steps))
        assert not out.is_empty, "the scheduler stalled"
        sampled = {s.request_id: [7] for s in out.scheduled if s.needs_logits}
        scheduler.update_from_output(out, StepResult(sampled), now=float(steps + 1))
        steps += 1
    return steps


def test_e01_2_worked_example(impl):
    assert impl.static_steps([4, 1, 1, 2], 2) == 6
    assert impl.continuous_steps([4, 1, 1, 2], 2) == 4
    assert impl.throughput_ratio([4, 1, 1, 2], 2) == pytest.approx(1.5)


def test_e01_2_equal_outputs_close_the_gap(impl):
    """Homogeneous requests leave continuous batching nothing to fill (the shape of Orca, OSDI'22, Fig 11)."""
    assert impl.throughput_ratio([128] * 16, 8) == pytest.approx(1.0)


def test_e01_2_one_long_request_per_batch(impl):
    lens = ([1536] + [16] * 7) * 4  # batch 8: each static batch waits for its one long request
    assert impl.static_steps(lens, 8) == 4 * 1536
    assert impl.throughput_ratio(lens, 8) > 2.5


@FEW
@given(st.lists(st.integers(1, 60), min_size=1, max_size=24), st.integers(1, 8))
def test_e01_2_matches_the_engine_schedulers(impl, output_lens, batch_size):
    mine = (impl.static_steps(output_lens, batch_size), impl.continuous_steps(output_lens, batch_size),
            impl.throughput_ratio(output_lens, batch_size))  # yours first: a stub fails fast
    static = engine_steps(output_lens, batch_size, "static")
    continuous = engine_steps(output_lens, batch_size, "continuous")
    assert mine[0] == static, "static steps"
    assert mine[1] == continuous, "continuous steps"
    assert mine[2] == pytest.approx(static / continuous), "throughput ratio"


# ---- E01.3 -------------------------------------------------------------------------------------------

TARGETS = [
    # the statement's example: an H100 serving 80 requests/s of long prompts under a tight TPOT
    DeploymentTarget("llama-3.1-8b", "h100-sxm", arrival_rate=80, prompt_len=1024, mean_output_len=128,
                     ttft_p90_ms=200, tpot_p90_ms=12),
    # a slower GPU and 2048-token prompts: prefill dominates, and several replicas are needed
    DeploymentTarget("llama-3.1-8b", "a100-80gb-sxm", arrival_rate=40, prompt_len=2048, mean_output_len=128,
                     ttft_p90_ms=800, tpot_p90_ms=40),
]


@functools.cache
def reference_plan(target: DeploymentTarget) -> DeploymentPlan:
    return engine.plan_deployment(target)


@pytest.mark.parametrize("target", TARGETS, ids=["h100-80rps", "a100-40rps-long-prompts"])
def test_e01_3_meets_the_targets_without_waste(impl, target):
    plan = impl.plan_deployment(target) if impl is not engine else reference_plan(target)  # yours first
    assert isinstance(plan.num_replicas, int) and plan.num_replicas >= 1, plan
    metrics = target.serve(plan)
    assert target.met_by(metrics), (
        f"{plan} misses the targets: p90 TTFT {metrics.p90_ttft_ms:.0f} ms (target {target.ttft_p90_ms}), "
        f"p90 TPOT {metrics.p90_tpot_ms:.1f} ms (target {target.tpot_p90_ms}), {metrics.completed} of "
        f"{target.num_requests} served")
    best = reference_plan(target)
    assert plan.num_replicas <= best.num_replicas + 1, (
        f"{plan.num_replicas} replicas where the reference needs {best.num_replicas} ({best}): "
        "more than one replica to spare")
