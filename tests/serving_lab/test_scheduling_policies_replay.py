"""The scheduling policies and prefill budgets run in both halves: on a tiny random Llama, the simulator fed
the engine's step times makes every one of the engine's decisions (as tests/serving_lab/test_replay_engine.py
shows for the default policy), fairness holds on both sides, and no policy or budget changes a greedy output.
"""

from __future__ import annotations

import bisect
from dataclasses import replace

import pytest
from engine_replay import batches, replay

from core import EngineConfig, RunMetrics, Workload
from ref_engine.bench import run
from ref_engine.engine import LLM
from ref_engine.model.loader import load_model
from ref_engine.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def tiny(make_tiny_hf_model, device):
    return load_model(make_tiny_hf_model("llama", name="policy-llama", max_position_embeddings=512), device=device)


def output_tokens_by(metrics: RunMetrics, tenant: str, until: float) -> int:
    return sum(sum(1 for t in row.token_times if t <= until) for row in metrics.requests if row.tenant == tenant)


def test_weights_one_to_three_share_output_tokens_one_to_three_on_both_sides(tiny):
    """Two tenants with the same backlogged work, weights 1:3: while both are backlogged (until the heavier
    one's last admission) the heavier gets 3x the output tokens (within 10%), finishes its work at about
    2/3 of the run, and the replayed simulation makes the same decisions."""
    work = Workload.synthetic(24, prompt_len=8, output_len=16, seed=3)
    workload = work.with_tenant("light") + work.with_tenant("heavy")
    weights = {"light": 1, "heavy": 3}
    config = EngineConfig(max_num_seqs=8, max_num_batched_tokens=64, block_size=8, num_kv_blocks=64,
                          scheduling_policy="fair", tenant_weights=weights)
    measured = run(workload, config, model=tiny)
    simulated = replay(measured, workload, config, tiny.arch)
    assert batches(simulated) == batches(measured)
    for metrics in (measured, simulated):
        both_backlogged = max(row.first_scheduled_time for row in metrics.requests if row.tenant == "heavy")
        ratio = output_tokens_by(metrics, "heavy", both_backlogged) / output_tokens_by(metrics, "light",
                                                                                       both_backlogged)
        assert ratio == pytest.approx(3, rel=0.1)
        # in steps, not seconds: a step slowed by the machine's load must not move the fraction
        starts = [step.start for step in metrics.steps]
        heavy_done = bisect.bisect_left(starts, metrics.per_tenant["heavy"].last_finish_time)
        light_done = bisect.bisect_left(starts, metrics.per_tenant["light"].last_finish_time)
        assert heavy_done / light_done == pytest.approx(2 / 3, abs=0.1)
        assert metrics.jain_fairness(config.tenant_weights) > 0.95


def test_a_high_priority_request_preempts_and_the_replay_agrees(tiny):
    """Low-priority requests fill a small pool; high-priority ones arrive later, are admitted as soon as the
    lowest priority is preempted, and finish before any of the low-priority requests that were running."""
    low = Workload.synthetic(4, prompt_len=16, output_len=60, seed=1).with_priority(1)
    # they arrive at fixed times, early in the lows' run of 70-odd steps (~2 ms a step on a laptop core, and
    # even 0.2 ms would leave them well before the first preemption): a Poisson draw could put them after it
    high = Workload.synthetic(2, prompt_len=8, output_len=4, seed=2).with_priority(0)
    high = replace(high, requests=tuple(replace(r, arrival_time=t) for r, t in zip(high.requests, (0.010, 0.015))))
    workload = low + high
    config = EngineConfig(max_num_seqs=4, max_num_batched_tokens=64, block_size=8, num_kv_blocks=30,
                          scheduling_policy="priority")
    measured = run(workload, config, model=tiny)
    simulated = replay(measured, workload, config, tiny.arch)
    assert measured.num_preemptions > 0
    assert batches(simulated) == batches(measured)
    for metrics in (measured, simulated):
        rows = {row.priority: [] for row in metrics.requests}
        for row in metrics.requests:
            rows[row.priority].append(row)
        assert all(row.num_preemptions == 0 for row in rows[0])
        # under "fcfs" they would wait for a low-priority request to finish (test it: it fails)
        assert max(row.finish_time for row in rows[0]) < min(row.finish_time for row in rows[1])


BUDGETS = dict(max_num_batched_tokens=16, long_prefill_token_threshold=8, max_num_partial_prefills=1,
               prefill_budget_tokens=12, decode_batch_max_tokens=2, num_kv_blocks=24, block_size=4)


@pytest.mark.parametrize("knobs", [
    dict(),
    BUDGETS,
    dict(BUDGETS, scheduling_policy="priority"),
    dict(BUDGETS, scheduling_policy="fair", tenant_weights={"a": 1, "b": 3}, tenant_max_num_seqs={"a": 1}),
    dict(BUDGETS, scheduling_policy="fair", preemption_mode="swap"),
], ids=["fcfs", "fcfs-budgets", "priority-budgets", "fair-budgets", "fair-swap"])
def test_greedy_outputs_are_the_same_under_every_policy_and_budget(tiny, knobs):
    prompts = [{"prompt_token_ids": list(range(100 + i, 100 + i + n)), "tenant": "ab"[i % 2], "priority": i % 3}
               for i, n in enumerate([5, 23, 9, 31, 14, 3])]
    greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    reference = LLM(tiny, block_size=4).generate(prompts, greedy, use_tqdm=False)
    outputs = LLM(tiny, **knobs).generate(prompts, greedy, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == [r.outputs[0].token_ids for r in reference]
