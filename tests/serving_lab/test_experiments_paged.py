"""Lesson 2's experiment functions (course/paged_attention.py), simulator side only: the KV
arithmetic, the allocation modes' memory numbers, the block-size U-shape on a GPU profile, preemption by
recompute and swap, and the swap copy model. No engine, no timing asserts: every number here is decided by
the shared core or by the deterministic cost model."""

from __future__ import annotations

import pytest

from core import EngineConfig, Workload
from course.paged_attention import (
    PCIE4_BATCHED,
    PCIE4_PER_BLOCK,
    SwapLink,
    allocation_modes,
    block_size_sweep,
    kv_cache_sizes,
    memory_stats,
    pcie_link,
    pool_squeeze,
    preemption_cost,
    preemption_modes,
)
from serving_lab.pairing import Sides
from sim.simulator import Simulator

CPU = Sides(hardware="local-cpu", measure=False)
GPU = Sides(arch="llama-3.1-8b", hardware="h100-sxm", measure=False)
GiB = 2**30


def test_kv_cache_sizes_by_hand():
    rows = {r["model"]: r for r in kv_cache_sizes(["smollm2-135m", "llama-2-7b", "llama-3.1-8b"],
                                                  kv_cache_memory=16 * GiB)}
    assert rows["Llama-3.1-8B"]["kv_bytes_per_token"] == 2 * 32 * 8 * 128 * 2
    assert rows["Llama-3.1-8B"]["seqs_that_fit"] == 64
    assert rows["Llama-2-7B"]["seqs_that_fit"] == 16  # no GQA: 4x the bytes, a quarter of the sequences
    fp32 = kv_cache_sizes(["smollm2-135m"], dtype="float32", kv_cache_memory=GiB)[0]
    assert fp32["kv_bytes_per_token"] == 2 * 30 * 3 * 64 * 4 == 46_080


def test_kv_cache_sizes_shard_a_model_too_big_for_one_gpu():
    (row,) = kv_cache_sizes(["llama-3.1-70b"], hardware="h100-sxm")
    assert row["tp"] >= 2 and row["seqs_that_fit"] > 0


def test_allocation_modes_memory_numbers():
    rows = {r["allocation"]: r for r in allocation_modes(CPU, num_requests=8, prompt_len=(56, 88),
                                                         output_len=(4, 24), num_kv_blocks=40, max_model_len=256)}
    assert set(rows) == {"contiguous", "contiguous_exact", "paged"}
    assert all(r["side"] == "simulated" for r in rows.values())  # measure=False: no engine rows
    assert rows["contiguous"]["live_fraction"] < 0.5 < 0.9 < rows["paged"]["live_fraction"]
    assert rows["contiguous"]["live_fraction"] < rows["contiguous_exact"]["live_fraction"] < rows["paged"]["live_fraction"]
    assert rows["paged"]["mean_batch"] >= rows["contiguous_exact"]["mean_batch"] > rows["contiguous"]["mean_batch"]
    assert rows["paged"]["output_throughput"] > rows["contiguous"]["output_throughput"]
    for r in rows.values():  # reserved slots never exceed the pool, live tokens never exceed reserved slots
        steps = r["metrics"].steps
        assert all(s.num_live_tokens <= s.num_reserved_slots <= 40 * 16 for s in steps)


def test_block_size_sweep_is_a_u_on_a_gpu_profile():
    workloads = {"short": Workload.synthetic(120, prompt_len=(8, 64), output_len=(8, 128), seed=0)}
    rows = block_size_sweep([1, 16, 256], GPU, workloads=workloads, kv_cache_tokens=0, kv_cache_memory=GiB // 2,
                            max_model_len=2048)
    rel = {r["block_size"]: r["relative_duration"] for r in rows}
    assert min(rel.values()) == 1.0 == rel[16]
    assert rel[1] > 1.0 and rel[256] > 1.2
    blocks = {r["block_size"]: r["num_kv_blocks"] for r in rows}
    assert blocks[1] == 16 * blocks[16] == 256 * blocks[256]  # the memory is fixed, not the block count


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preemption_modes_count_what_each_mode_redoes(mode):
    (row,) = preemption_modes(CPU, modes=[mode], num_requests=8, prompt_len=(16, 32), output_len=(16, 32),
                              num_kv_blocks=16)
    assert row["num_preemptions"] > 0
    if mode == "recompute":
        assert row["recomputed_tokens"] > 0 and row["swapped_blocks"] == 0
    else:
        assert row["recomputed_tokens"] == 0 and row["swapped_blocks"] > 0 and row["swap_s"] > 0


def test_swap_copies_are_priced():
    slow = SwapLink("slow", bandwidth=1e6, per_transfer_s=1e-3)
    free = SwapLink("free", bandwidth=1e30, per_transfer_s=0.0)
    kwargs = dict(modes=["swap"], num_requests=8, prompt_len=(16, 32), output_len=(16, 32), num_kv_blocks=16)
    (priced,) = preemption_modes(CPU, link=slow, **kwargs)
    (unpriced,) = preemption_modes(CPU, link=free, **kwargs)
    assert priced["num_steps"] == unpriced["num_steps"] and priced["swapped_blocks"] == unpriced["swapped_blocks"]
    assert priced["duration"] == pytest.approx(unpriced["duration"] + priced["swap_s"])


def test_swap_link_arithmetic():
    # one copy per block per layer for K and for V, plus the bytes at the link's bandwidth
    assert PCIE4_PER_BLOCK.seconds(4, 1000, 2) == pytest.approx(4 * 2 * 2 * 5e-6 + 4000 / 25e9)
    assert PCIE4_BATCHED.seconds(4, 1000, 2) == pytest.approx(2 * 5e-6 + 4000 / 25e9)
    assert PCIE4_PER_BLOCK.seconds(0, 1000, 2) == 0.0


def test_pcie_link_is_the_profiles_host_link():
    # one convention for the swap what-if and the simulator: an H100's host link is PCIe 5.0, an A100's 4.0
    assert pcie_link("h100-sxm").bandwidth == 50e9 and pcie_link("a100-80gb-sxm").bandwidth == 25e9
    batched = pcie_link("h100-sxm", batched=True)
    assert batched.batched and batched.seconds(4, 1000, 2) == pytest.approx(2 * 5e-6 + 4000 / 50e9)
    with pytest.raises(ValueError, match="no host link"):
        pcie_link("local-cpu")


def test_preemption_cost_recompute_flat_swap_falls_with_block_size():
    rows = preemption_cost([1, 16, 256], GPU, num_tokens=1024, link=PCIE4_PER_BLOCK)
    recompute = [r["recompute_ms"] for r in rows]
    swap = [r["swap_ms"] for r in rows]
    assert max(recompute) / min(recompute) < 1.1
    assert swap[0] > swap[1] > swap[2]


def test_pool_squeeze_preemptions_grow_as_the_pool_shrinks():
    rows = pool_squeeze([40, 16, 8], CPU, modes=["recompute"], num_requests=8, prompt_len=(16, 32),
                        output_len=(16, 32))
    counts = [r["num_preemptions"] for r in rows]
    assert counts[0] == 0 and counts[0] < counts[1] <= counts[2]


def test_memory_stats_without_preemption_recompute_nothing():
    workload = Workload.synthetic(4, prompt_len=20, output_len=5, seed=1)
    metrics = Simulator(hardware="local-cpu", config=EngineConfig(num_kv_blocks=64)).run(workload)
    stats = memory_stats(metrics)
    assert stats["recomputed_tokens"] == 0
    assert 0 < stats["live_fraction"] <= 1


@pytest.mark.cpu_only(reason="the engine's side is paired with the local-cpu profile's simulated side")
def test_preemption_cost_measures_the_engine(make_tiny_hf_model):
    """The measured side of `preemption_cost` (a prefill and a swap on real KV tensors) runs end to end."""
    from ref_engine.model.loader import load_model

    tiny = load_model(make_tiny_hf_model("llama", name="preemption-cost"), dtype="float32", device="cpu")
    rows = preemption_cost([4, 16], Sides(model=tiny, hardware="local-cpu"), num_tokens=64)
    measured = [r for r in rows if r["side"] == "measured"]
    assert len(measured) == 2 and all(r["swap_ms"] > 0 and r["recompute_ms"] > 0 for r in measured)
