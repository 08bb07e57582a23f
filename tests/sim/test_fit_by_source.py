"""The by-source GPU fit (benchmarks/fit_by_source.py): the split is by source, held-out rows never reach the fit,
the candidate it wrote keeps every term inside its stated range and prices steps the way it was fitted (combine
"kernels"), and on a hand-built case the fit recovers the terms that made the rows. The full fit and its table are
benchmarks/RESULTS.md's ("gpu-fit-by-source"); nothing here refits the real rows."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from benchmarks import vllm_published
from benchmarks.fit_by_source import (
    COMBINE,
    ENGINE,
    FIT_SOURCE,
    OUT_PATH,
    RESULTS_PATH,
    TERM,
    TERMS,
    document,
    fit,
    group_of,
    holder,
    in_fit,
    profile,
)
from benchmarks.published import Prepared, Row, Run, Simulated, StepFeatures, load_rows, slow
from core.arch_config import ArchConfig
from core.config import EngineConfig
from core.workload import Workload
from sim.cost_model import CostModel
from sim.engine_profile import ENGINE_PROFILES
from sim.hardware import HardwareProfile, with_fit
from sim.simulator import Simulator

CANDIDATE = json.loads(OUT_PATH.read_text())
PUBLISHED = load_rows()
VLLM = vllm_published.load()


def test_the_split_is_by_source_not_by_row():
    assert {document(r) for r in PUBLISHED if in_fit(r)} == {FIT_SOURCE}
    # every row of the fit's source is in it, whatever its by-row "fit" flag, bar the ones too slow to simulate
    assert [r.id for r in PUBLISHED if document(r) == FIT_SOURCE and not in_fit(r)] == [
        r.id for r in PUBLISHED if document(r) == FIT_SOURCE and slow(r)]
    assert any(not r.fit for r in PUBLISHED if in_fit(r))
    # a post's sections are one source: the vLLM blog's FP8 KV-cache post is one document, not three
    fp8_post = {r.source for r in VLLM if "fp8-kvcache" in r.source}
    assert len(fp8_post) > 1 and len({document(r) for r in VLLM if "fp8-kvcache" in r.source}) == 1


def test_held_out_rows_never_reach_the_fit():
    held_out = [r for r in PUBLISHED + VLLM if document(r) != FIT_SOURCE]
    assert held_out and not any(in_fit(r) for r in held_out)
    in_candidate = {i for name, entry in CANDIDATE.items() if isinstance(entry, dict) and "provenance" in entry
                    for i in entry["provenance"]["rows_in_fit"]}
    assert in_candidate == {r.id for r in PUBLISHED if in_fit(r)}
    assert in_candidate.isdisjoint(r.id for r in held_out)


def test_the_candidate_keeps_every_term_inside_its_range():
    terms = CANDIDATE["terms"]
    assert {t["term"] for t in terms} == set(TERM)
    for t in terms:
        term = TERM[t["term"]]
        assert (t["lower"], t["upper"]) == (term.lower, term.upper), t
        assert term.lower * (1 - 1e-3) <= t["value"] <= term.upper * (1 + 1e-3), t
        edge = min(t["value"] - term.lower, term.upper - t["value"]) <= 0.006 * (term.upper - term.lower)
        assert edge or not t["on_bound"], t
    for name in ("A100-80GB-SXM", "H100-SXM", "H200", "L40S", "B200"):
        entry = CANDIDATE[name]
        assert all(0.3 <= v <= 0.9 for v in entry["matmul_efficiency"].values()), name
        assert 0.6 <= entry["bandwidth_efficiency"] <= 0.9 and entry["step_overhead_s"] >= TERM["step_overhead_s"].lower


def test_the_h100_and_h200_differ_only_in_their_bandwidth_fraction():
    h100, h200 = CANDIDATE["H100-SXM"], CANDIDATE["H200"]
    shared = [k for k in h100 if k not in ("provenance", "bandwidth_efficiency")]
    assert shared and all(h100[k] == h200[k] for k in shared)
    # and the step overhead is the engine's: one value for every GPU
    assert len({CANDIDATE[g]["step_overhead_s"] for g in ("A100-80GB-SXM", "H100-SXM", "H200", "L40S", "B200")}) == 1


def test_the_candidate_prices_steps_the_way_it_was_fitted():
    """Every GPU entry records its combine form, and a built-in profile loaded with the candidate's terms the way
    sim/data/gpu_fit.json's are loaded (`with_fit`) takes it, so it prices a step as the fit did."""
    for name in ("A100-80GB-SXM", "H100-SXM", "H200", "L40S", "B200"):
        assert CANDIDATE[name]["combine"] == COMBINE == "kernels", name
        loaded = with_fit(HardwareProfile.named(name), CANDIDATE)
        assert loaded.combine == COMBINE and loaded.bandwidth_efficiency == CANDIDATE[name]["bandwidth_efficiency"]
        assert CostModel(ArchConfig.named("llama-3.1-8b"), loaded).combine == COMBINE
    # the built-in profiles stay on one max over the whole step
    assert HardwareProfile.named("h100-sxm").combine == "max"


def test_vllm_v0_s_engine_step_is_its_five_batch_1_rows_by_hand():
    """V0's constant, by its rule done by hand: each `engine_fit` row of profile vllm-v0 (one Llama-3-8B sequence on
    an H100, so every step is one sequence's) simulated on the candidate's H100 without TensorRT-LLM's per-step
    time; published minus simulated latency over the output length is one step's CPU time; the constant is their
    mean. It is what sim/engine_profile.py holds and what the candidate file records."""
    h100 = with_fit(HardwareProfile.named("h100-sxm"), CANDIDATE)
    bare = replace(h100, step_overhead_s=0.0)
    gaps = []
    for row in (r for r in VLLM if r.id in vllm_published.engine_fit_ids(profile="vllm-v0")):
        s = row.setup
        sim = Simulator(s["model"], bare, EngineConfig(**s["engine"]), dtype=s["dtype"],
                        tensor_parallel_size=s["tensor_parallel_size"], kv_cache_dtype=s["kv_cache_dtype"])
        seconds = sim.run(Workload.synthetic(1, s["input_len"], s["output_len"])).duration
        gaps.append((row.value / 1e3 - seconds) / s["output_len"])
    assert len(gaps) == 5 and max(gaps) - min(gaps) < 0.1e-3  # one constant: 2.57 to 2.63 ms at 128 to 2048 tokens
    v0 = sum(gaps) / len(gaps)
    assert ENGINE_PROFILES["vllm-v0"].step_overhead_s == pytest.approx(v0, rel=5e-4)
    assert CANDIDATE["vllm_v0_engine_step_overhead_s"]["value"] == pytest.approx(v0, rel=5e-4)


def test_vllm_v0_s_fit_rows_never_reach_a_fit_or_a_count():
    fit_rows = [r for r in VLLM if r.id in vllm_published.engine_fit_ids(profile="vllm-v0")]
    assert len(fit_rows) == 5 and not any(in_fit(r) for r in fit_rows)
    assert {document(r) for r in fit_rows}.isdisjoint(document(r) for r in PUBLISHED + VLLM if r not in fit_rows)
    every_fit = vllm_published.engine_fit_ids(profile=None)
    # the tables count a row as held out only if its group is not an engine fit's
    assert all(group_of(r, every_fit).endswith("(engine fit)") for r in fit_rows)
    assert not any(group_of(r, every_fit).endswith("(engine fit)") for r in VLLM if r.id not in every_fit)


def test_the_results_section_is_there():
    text = RESULTS_PATH.read_text()
    assert '<a id="gpu-fit-by-source"></a>' in text and "<!-- gpu-fit-by-source:start -->" in text


# ---- a hand-built case: three memory-bound one-step rows made from known terms ----

H100 = HardwareProfile.named("h100-sxm")
TRUE = {"bandwidth_efficiency": 0.8, "step_overhead_s": 1e-3, "per_seq_overhead_s": 10e-6}


def fake_row(i: int, nbytes: float, seqs: int, efficiency: float) -> Prepared:
    """One offline row of the fit's source: one step that only reads `nbytes`, with `seqs` requests, one output
    token; its published throughput is what the terms give by hand: 1 / (bytes / (peak x eff) + step + seqs x q)."""
    seconds = nbytes / (H100.memory_bandwidth * efficiency) + TRUE["step_overhead_s"] + seqs * TRUE["per_seq_overhead_s"]
    setup = {"gpu": "h100-sxm", "model": "llama-3.1-8b", "dtype": "float16", "kv_cache_dtype": "float16",
             "tensor_parallel_size": 1, "mode": "offline", "input_len": 128, "output_len": 128}
    row = Row(f"hand/{i}", f"{FIT_SOURCE}, a hand-built row", "test", "output_throughput_tok_s", 1 / seconds, True, setup)
    zeros = np.zeros(1)
    feats = StepFeatures(zeros, zeros, np.array([nbytes]), np.array([float(seqs)]), np.array([float(seqs)]), zeros,
                         zeros)
    model = CostModel(ArchConfig.named("llama-3.1-8b"), H100, "float16")
    return Prepared(Simulated(row, [Run([], 1)], row.value), model, [feats])


@pytest.mark.parametrize("combine", ["kernels", "max"])
def test_the_fit_recovers_the_terms_a_hand_built_case_was_made_from(combine):
    # steps that only read weights: the two forms price them alike
    rows = [fake_row(0, 16e9, 1, 0.8), fake_row(1, 4e9, 1, 0.8), fake_row(2, 16e9, 201, 0.8)]
    result = fit(rows, combine)
    assert result.combine == combine
    for name, value in TRUE.items():
        assert result.values[(name, holder(TERM[name], "H100-SXM"))] == pytest.approx(value, rel=1e-4), name
    assert ("step_overhead_s", ENGINE) in result.values and result.rms < 1e-6
    # the H200 takes every Hopper term from it, and its own bandwidth fraction (none fitted here: the datasheet's)
    h200 = profile(HardwareProfile.named("h200"), result.values)
    assert h200.step_overhead_s == pytest.approx(TRUE["step_overhead_s"], rel=1e-4)


def test_a_truth_outside_the_range_lands_on_its_bound_and_is_reported():
    rows = [fake_row(0, 16e9, 1, 0.97), fake_row(1, 4e9, 1, 0.97), fake_row(2, 16e9, 201, 0.97)]
    result = fit(rows)
    slot = ("bandwidth_efficiency", "H100-SXM")
    assert result.values[slot] == pytest.approx(TERM["bandwidth_efficiency"].upper, abs=1e-6)
    assert slot in result.at_bound()
    assert all(TERM[n].lower <= v <= TERM[n].upper for (n, _), v in result.values.items())


def test_every_term_states_why_its_range():
    assert all(t.why and t.lower < t.initial < t.upper and t.scope in ("engine", "architecture", "gpu") for t in TERMS)
