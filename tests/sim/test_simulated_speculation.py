"""Speculation in the simulator: Leviathan's formula for a given acceptance rate, and the engine's counts
replayed step for step."""

from __future__ import annotations

import math
from statistics import fmean, pstdev

import pytest

from core import EngineConfig, Workload
from sim import Simulator
from sim.spec_decode import AcceptanceRate, AcceptanceReplay, break_even_acceptance, expected_tokens_per_step


@pytest.mark.parametrize("a", [0.3, 0.6, 0.8, 0.95])
@pytest.mark.parametrize("k", [1, 3, 5])
def test_tokens_per_verify_step_follow_leviathans_formula(a, k):
    workload = Workload.synthetic(4, prompt_len=16, output_len=600, seed=2)
    config = EngineConfig(speculative_method="ngram", num_speculative_tokens=k)
    metrics = Simulator("smollm2-135m", "local-cpu", config, acceptance=AcceptanceRate((a,), seed=7)).run(workload)
    # verifies of a full draft of k (near max_tokens the scheduler drafts fewer)
    emitted = [accepted + 1 for s in metrics.steps for _, drafted, accepted in s.verified if drafted == k]
    assert len(emitted) > 300
    standard_error = pstdev(emitted) / math.sqrt(len(emitted))
    assert fmean(emitted) == pytest.approx(expected_tokens_per_step(a, k), abs=4 * standard_error)
    assert metrics.acceptance_by_position[0] == pytest.approx(a, abs=0.06)
    assert metrics.total_output_tokens == workload.total_output_tokens


def test_a_second_run_repeats_the_first_and_replicas_draw_apart():
    """`AcceptanceRate` is seeded per replica's run (`for_replica`): run twice on one Simulator, the same
    counts; the model a user passed in keeps no state of its own runs."""
    workload = Workload.synthetic(4, prompt_len=16, output_len=200, seed=2)
    acceptance = AcceptanceRate((0.6,), seed=7)
    simulator = Simulator("smollm2-135m", "local-cpu", EngineConfig(speculative_method="ngram",
                                                                     num_speculative_tokens=3), acceptance=acceptance)
    first, second = simulator.run(workload), simulator.run(workload)
    assert [s.verified for s in first.steps] == [s.verified for s in second.steps]
    assert first == second
    assert acceptance.for_replica() is not acceptance and acceptance.for_replica() == acceptance


def test_formula_edges():
    assert expected_tokens_per_step(0.0, 5) == 1.0
    assert expected_tokens_per_step(1.0, 5) == 6.0
    assert expected_tokens_per_step(0.5, 2) == pytest.approx(1.75)


def test_break_even_acceptance_by_hand():
    # k = 1, a verify costing 1.5 plain steps: 1 + a = 1.5, so a = 0.5
    assert break_even_acceptance(1, 1.5) == pytest.approx(0.5)
    # k = 2, drafts costing c = 0.25 each (1 + 2c = 1.5): 1 + a + a^2 = 1.5, a = (sqrt(3) - 1) / 2 = 0.366
    assert break_even_acceptance(2, 1 + 2 * 0.25) == pytest.approx((math.sqrt(3) - 1) / 2)
    # the interview bank's Q-SPEC-04: k = 5, a verify costing 2 plain steps, free drafts: a + ... + a^5 = 1
    a = break_even_acceptance(5, 2.0)
    assert a == pytest.approx(0.5086, abs=1e-4)
    assert expected_tokens_per_step(a, 5) == pytest.approx(2.0)
    assert break_even_acceptance(5, 1.0) == 0.0  # a verify as cheap as a plain step pays at any acceptance
    assert break_even_acceptance(4, 5.0) == pytest.approx(1.0)  # only if every draft passes
    with pytest.raises(ValueError, match="never pays"):
        break_even_acceptance(4, 5.5)


def test_speculation_needs_an_acceptance_model_and_the_reverse():
    with pytest.raises(ValueError, match="acceptance"):
        Simulator("smollm2-135m", "local-cpu", EngineConfig(speculative_method="ngram"))
    with pytest.raises(ValueError, match="acceptance"):
        Simulator("smollm2-135m", "local-cpu", EngineConfig(), acceptance=AcceptanceRate((0.5,)))


def test_a_draft_model_costs_time_an_ngram_does_not():
    workload = Workload.synthetic(1, prompt_len=64, output_len=100, seed=1)
    common = dict(num_speculative_tokens=4)
    ngram = Simulator("smollm2-135m", "local-cpu", EngineConfig(speculative_method="ngram", **common),
                      acceptance=AcceptanceRate((0.7,))).run(workload)
    draft = Simulator("smollm2-135m", "local-cpu", EngineConfig(
        speculative_method="draft_model", speculative_model="self:10", **common),
        acceptance=AcceptanceRate((0.7,))).run(workload)
    assert [s.verified for s in draft.steps] == [s.verified for s in ngram.steps]  # same seed, same counts
    assert draft.duration > ngram.duration


def test_replayed_acceptance_makes_the_engines_decisions(make_tiny_hf_model):
    from ref_engine.bench import run
    from ref_engine.model.loader import load_model

    tiny = load_model(make_tiny_hf_model("llama", name="spec-replay-llama", max_position_embeddings=512))
    workload = Workload.synthetic(10, prompt_len=(8, 80), output_len=(4, 40), seed=4)
    config = EngineConfig(max_num_seqs=6, max_num_batched_tokens=48, num_kv_blocks=20, block_size=8,
                          speculative_method="draft_model", speculative_model="self:1", num_speculative_tokens=3,
                          speculative_disable_by_batch_size=4)
    measured = run(workload, config, model=tiny)
    simulated = Simulator(tiny.arch, "local-cpu", config, dtype="float32",
                          acceptance=AcceptanceReplay(measured.steps)).run(workload)
    assert measured.num_accepted_tokens > 0 and measured.num_preemptions > 0
    assert [(s.query_lens, s.context_lens, s.verified) for s in simulated.steps] == \
        [(s.query_lens, s.context_lens, s.verified) for s in measured.steps]
    for field in ("num_steps", "num_preemptions", "num_drafts", "num_draft_tokens", "num_accepted_tokens",
                  "acceptance_by_position"):
        assert getattr(simulated, field) == getattr(measured, field), field


def test_batch_sweep_explains_the_speed_up_by_tokens_per_step_over_verify_cost():
    """On a GPU profile a batch-1 verify of 1 + k tokens costs about one decode step (both read the weights
    once), so the speed-up is about tokens per step; a bigger batch makes the verify dearer. (At batch 1 decode
    steps dominate the run; at large batch the prompts' prefill steps weigh in too, so only batch 1 is held to
    speed-up ~ tokens_per_step / verify_cost.)"""
    from course.speculative_decoding import speculation_batch_sweep
    from serving_lab.pairing import Sides

    one, big = speculation_batch_sweep([1, 64], 0.5, Sides(arch="llama-3.1-8b", hardware="h100-sxm", measure=False))
    assert one["verify_cost"] == pytest.approx(1.0, abs=0.1)
    assert big["verify_cost"] > one["verify_cost"]
    assert one["speedup"] == pytest.approx(one["tokens_per_step"] / one["verify_cost"], rel=0.05)
