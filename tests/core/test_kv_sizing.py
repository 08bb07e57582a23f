"""The KV pool sizing rule the engine and the simulator share: overrides first, a fixed pool on a CPU, else
what `gpu_memory_utilization` of the device leaves after weights and activations."""

from __future__ import annotations

import pytest

from core.config import EngineConfig
from core.kv_sizing import CPU_KV_CACHE_MEMORY, DraftFootprint, num_kv_blocks, with_swap_pool
from core.math_utils import cdiv

PER_BLOCK = 1000


def test_the_first_rule_that_applies_sizes_the_pool():
    device = dict(device_memory=100_000, weight_bytes=20_000, activation_bytes=5_000)
    # (100000 * 0.9 - 20000 - 5000) // 1000
    assert num_kv_blocks(EngineConfig(), PER_BLOCK, **device) == 65
    assert num_kv_blocks(EngineConfig(gpu_memory_utilization=0.5), PER_BLOCK, **device) == 25
    assert num_kv_blocks(EngineConfig(kv_cache_memory=7_500), PER_BLOCK, **device) == 7
    assert num_kv_blocks(EngineConfig(kv_cache_memory=7_500, num_kv_blocks=3), PER_BLOCK, **device) == 3


def test_a_cpu_gets_the_fixed_pool():
    assert num_kv_blocks(EngineConfig(), PER_BLOCK) == CPU_KV_CACHE_MEMORY // PER_BLOCK
    assert num_kv_blocks(EngineConfig(kv_cache_memory=4_000), PER_BLOCK) == 4


def test_a_draft_model_shares_the_block_ids_so_each_block_costs_both_models():
    device = dict(device_memory=100_000, weight_bytes=20_000, activation_bytes=5_000)
    draft = DraftFootprint(bytes_per_block=250, weight_bytes=10_000)
    # (100000 * 0.9 - 20000 - 10000 - 5000) // (1000 + 250)
    assert num_kv_blocks(EngineConfig(), PER_BLOCK, **device, draft=draft) == 44
    assert num_kv_blocks(EngineConfig(kv_cache_memory=7_500), PER_BLOCK, draft=draft) == 6
    assert num_kv_blocks(EngineConfig(), PER_BLOCK, draft=draft) == CPU_KV_CACHE_MEMORY // 1250
    assert num_kv_blocks(EngineConfig(num_kv_blocks=3), PER_BLOCK, draft=draft) == 3
    with pytest.raises(ValueError, match="m and its draft needs"):
        num_kv_blocks(EngineConfig(), PER_BLOCK, device_memory=100_000, weight_bytes=85_000, model="m", draft=draft)


def test_no_room_for_a_block_is_an_error_that_names_the_model():
    with pytest.raises(ValueError, match="big-model needs"):
        num_kv_blocks(EngineConfig(), PER_BLOCK, device_memory=100_000, weight_bytes=95_000, model="big-model")
    with pytest.raises(ValueError, match="not one KV block"):
        num_kv_blocks(EngineConfig(), PER_BLOCK, device_memory=100_000, weight_bytes=80_000, activation_bytes=9_500)
    with pytest.raises(ValueError, match="not one KV block"):
        num_kv_blocks(EngineConfig(kv_cache_memory=999), PER_BLOCK)


@pytest.mark.parametrize("utilization", [0, 1.5, True, "0.9"])
def test_gpu_memory_utilization_is_checked(utilization):
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        EngineConfig(gpu_memory_utilization=utilization)


def test_cdiv_rounds_up():
    assert [cdiv(n, 16) for n in (0, 1, 16, 17, 32)] == [0, 1, 1, 2, 2]


def test_the_swap_pool_is_swap_space_in_bytes_not_the_device_pools_size():
    swap = EngineConfig(preemption_mode="swap")
    assert with_swap_pool(swap, PER_BLOCK).num_swap_blocks == 4 * 2**30 // PER_BLOCK  # 4 GiB, vLLM's default
    assert with_swap_pool(swap.replace(swap_space=0.5), PER_BLOCK).num_swap_blocks == 2**29 // PER_BLOCK
    assert with_swap_pool(swap.replace(num_swap_blocks=3), PER_BLOCK).num_swap_blocks == 3
    assert with_swap_pool(EngineConfig(), PER_BLOCK).num_swap_blocks is None  # recompute: no host pool


def test_a_swap_pool_too_big_for_the_host_is_an_error_that_names_the_knob():
    swap = EngineConfig(preemption_mode="swap", swap_space=16)
    assert with_swap_pool(swap, PER_BLOCK, host_memory=64 * 2**30).num_swap_blocks == 16 * 2**30 // PER_BLOCK
    with pytest.raises(ValueError, match="lower swap_space"):
        with_swap_pool(swap, PER_BLOCK, host_memory=16 * 2**30)
    with pytest.raises(ValueError, match="swap_space must be"):
        EngineConfig(swap_space=-1)
