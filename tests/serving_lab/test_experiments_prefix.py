"""Lesson 4's experiment functions (course/prefix_caching.py) and the workloads they use.

Simulator side: hit rates are decided by the shared core, so they are checked exactly (against the
whole-block formula, the LRU cliff, tenant isolation). Engine side: a tiny random model serves the same
workloads and must hit exactly the same number of tokens as the simulator. No timing asserts.
"""

from __future__ import annotations

import pytest

from core import EngineConfig, Workload
from course.prefix_caching import (
    chat_replay,
    eviction_sweep,
    hit_rate_sweep,
    shared_prefix_ttft,
    tenant_isolation,
)
from serving_lab.pairing import Sides, pairs
from sim.simulator import Simulator

CPU = Sides(hardware="local-cpu", measure=False)


def test_shared_prefix_workload_shares_exactly_the_prefix():
    requests = Workload.shared_prefix(3, 4, 40, (5, 9), 2, seed=1).make_requests(1000)
    assert len(requests) == 12
    for r in requests:
        group = requests[int(r.request_id) % 3]
        assert r.prompt_token_ids[:40] == group.prompt_token_ids[:40]
        assert 45 <= r.num_prompt_tokens <= 49
    assert requests[0].prompt_token_ids[:40] != requests[1].prompt_token_ids[:40]
    assert requests[0].prompt_token_ids[40:] != requests[3].prompt_token_ids[40:]
    warm = Workload.shared_prefix(3, 1, 40, 5, 1, seed=2, prefix_seed=1).make_requests(1000)
    assert warm[0].prompt_token_ids[:40] == requests[0].prompt_token_ids[:40]
    assert warm[0].prompt_token_ids[40:] != requests[0].prompt_token_ids[40:45]


def test_chat_rounds_extend_the_history_and_tenants_are_set():
    rounds = Workload.chat_rounds(2, 3, 10, 6, 4, seed=0)
    turns = [w.make_requests(500) for w in rounds]
    for earlier, later in zip(turns, turns[1:]):
        for a, b in zip(earlier, later):
            assert b.prompt_token_ids[:a.num_prompt_tokens] == a.prompt_token_ids
            assert b.num_prompt_tokens == a.num_prompt_tokens + 6
    salted = rounds[0].with_tenant("bob", "s").make_requests(500)
    assert {(r.tenant, r.cache_salt) for r in salted} == {("bob", "s")}


def test_hit_rate_is_whole_blocks_of_the_prefix():
    rows = hit_rate_sweep([8, 16, 31, 40, 100], [16, 32])
    for row in rows:
        assert row["hit_rate"] == pytest.approx(row["predicted_hit_rate"])
    short = [r for r in rows if r["prefix_len"] < r["block_size"]]
    assert short and all(r["hit_rate"] == 0 for r in short)
    # a whole prompt shared: everything but the last token hits, whether or not it fills its last block
    whole = hit_rate_sweep([32, 40], [16], suffix_len=0)
    assert [r["hit_rate"] for r in whole] == [pytest.approx(31 / 32), pytest.approx(32 / 40)]
    assert all(r["hit_rate"] == pytest.approx(r["predicted_hit_rate"]) for r in whole)


def test_caching_cuts_ttft_and_changes_nothing_without_a_shared_prefix():
    rows = {(r["prefix_len"], r["caching"]): r for r in shared_prefix_ttft([0, 256], CPU)}
    assert rows[0, True]["mean_ttft_ms"] == rows[0, False]["mean_ttft_ms"]
    assert rows[0, True]["prefix_cache_hits"] == 0
    assert rows[256, True]["prefix_cache_hits"] == 8 * 256
    assert rows[256, True]["mean_ttft_ms"] < rows[256, False]["mean_ttft_ms"] / 2


def test_eviction_falls_off_the_lru_cliff():
    # 32 blocks; each request leaves 4 prefix blocks + 1 partial block behind
    rows = {r["num_groups"]: r for r in eviction_sweep([2, 6, 7, 8], CPU)}
    assert rows[2]["prefix_cache_hit_rate"] == rows[6]["prefix_cache_hit_rate"] == pytest.approx(64 / 72)
    assert 0 < rows[7]["prefix_cache_hit_rate"] < rows[6]["prefix_cache_hit_rate"]
    assert rows[8]["prefix_cache_hit_rate"] == 0


def test_only_the_same_tenant_and_salt_hit():
    rows = {r["sender"]: r for r in tenant_isolation(CPU)}
    assert rows["A"]["prefix_cache_hits"] == 512
    assert rows["B"]["prefix_cache_hits"] == rows["A, salted"]["prefix_cache_hits"] == 0
    assert rows["B"]["mean_ttft_ms"] > 3 * rows["A"]["mean_ttft_ms"]


def test_chat_turns_hit_their_history():
    rows = chat_replay(CPU, num_conversations=2, num_turns=3, first_prompt_len=64, turn_len=40)
    hits = {(r["turn"], r["caching"]): r["prefix_cache_hits"] for r in rows}
    assert hits[1, True] == hits[1, False] == hits[2, False] == hits[3, False] == 0
    # turn 2 (104 tokens) finds turn 1's 4 full blocks; turn 3 (144 tokens) finds turn 2's 6
    assert hits[2, True] == 2 * 64 and hits[3, True] == 2 * 96


def test_rounds_in_the_simulator_are_deterministic():
    rounds = Workload.chat_rounds(3, 3, 50, 30, 5, seed=4)
    config = EngineConfig(num_kv_blocks=128, block_size=16)
    first = Simulator(hardware="local-cpu", config=config).run_rounds(rounds)
    second = Simulator(hardware="local-cpu", config=config).run_rounds(rounds)
    assert [m.to_dict() for m in first] == [m.to_dict() for m in second]


@pytest.fixture(scope="module")
def tiny_sides(make_tiny_hf_model):
    from ref_engine.model.loader import load_model

    loaded = load_model(make_tiny_hf_model("llama", name="prefix-experiments", max_position_embeddings=1024),
                        dtype="float32", device="cpu")
    return Sides(model=loaded, hardware="local-cpu")


@pytest.mark.cpu_only(reason="the engine's side is paired with the local-cpu profile's simulated side")
def test_engine_and_simulator_hit_the_same_tokens(tiny_sides):
    rows = (shared_prefix_ttft([0, 20, 100], tiny_sides, requests_per_group=4, num_groups=2, output_len=4)
            + eviction_sweep([2, 8], tiny_sides, measure_groups=(2, 8))
            + tenant_isolation(tiny_sides, prefix_len=64)
            + chat_replay(tiny_sides, num_conversations=2, num_turns=3, first_prompt_len=40, turn_len=24,
                          output_len=4))
    compared = pairs(rows)
    assert len(compared) == 6 + 2 + 3 + 6
    assert all(simulated["same_hits"] for _, simulated in compared)
    assert any(measured["prefix_cache_hits"] > 0 for measured, _ in compared)


def test_shared_prefix_names_bad_arguments():
    with pytest.raises(ValueError, match="num_groups and requests_per_group must be >= 1"):
        Workload.shared_prefix(0, 1, 10, 5, 1)
    with pytest.raises(ValueError, match="at least one token"):
        Workload.shared_prefix(1, 1, 0, 0, 1)
