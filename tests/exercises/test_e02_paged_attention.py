"""Checks for lesson 2's exercises; `impl` is the reference or your stub (see conftest.py).

E02.1 is checked against the engine's arithmetic: `ArchConfig.kv_bytes_per_token`, and how many requests
the real `KVCacheManager` can hold before `allocate_slots` says no. E02.2 runs the same random operations
on your allocator and on the engine's `BlockPool` and compares them after every operation.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ref_engine.core.block_pool import BlockPool
from ref_engine.core.kv_cache_manager import KVCacheManager
from ref_engine.core.request import Request
from ref_engine.model.arch_config import KNOWN_MODELS, ArchConfig

FEW = settings(max_examples=60, deadline=None, derandomize=True)  # the same examples on every run
KiB, GiB = 1024, 1024**3


# ---- E02.1 -------------------------------------------------------------------------------------------

def test_e02_1_llama_3_1_8b_by_hand(impl):
    llama = ArchConfig.named("llama-3.1-8b")
    assert impl.kv_bytes_per_token(llama) == 2 * 32 * 8 * 128 * 2 == 128 * KiB
    assert impl.kv_bytes_per_sequence(llama, 2048) == 2048 * 128 * KiB == 256 * 1024 * KiB
    # 16 GiB / 128 KiB per token = 131072 tokens = 64 sequences of 2048 tokens
    assert impl.max_num_sequences(llama, 16 * GiB, 2048) == 64


@pytest.mark.parametrize("name", sorted(KNOWN_MODELS))
@pytest.mark.parametrize("dtype_bytes", [1, 2, 4])
def test_e02_1_bytes_per_token_match_arch_config(impl, name, dtype_bytes):
    arch = KNOWN_MODELS[name]
    assert impl.kv_bytes_per_token(arch, dtype_bytes) == arch.kv_bytes_per_token(dtype_bytes)


def test_e02_1_partial_blocks_count_whole(impl):
    smol = ArchConfig.named("smollm2-135m")
    per_token = smol.kv_bytes_per_token()
    assert impl.kv_bytes_per_sequence(smol, 20, block_size=16) == 32 * per_token
    assert impl.kv_bytes_per_sequence(smol, 16, block_size=16) == 16 * per_token
    assert impl.kv_bytes_per_sequence(smol, 1, block_size=256) == 256 * per_token


def engine_max_sequences(arch: ArchConfig, memory: int, num_tokens: int, block_size: int, dtype_bytes: int) -> int:
    """Admit `num_tokens`-token requests into the engine's KV cache manager until it runs out of blocks."""
    num_blocks = memory // (block_size * arch.kv_bytes_per_token(dtype_bytes))
    kv = KVCacheManager(block_size, num_blocks)
    admitted = 0
    while kv.allocate_slots(Request(str(admitted), [1] * num_tokens, max_tokens=1), 0 + num_tokens) is not None:
        admitted += 1
    return admitted


@FEW
@given(st.sampled_from(sorted(KNOWN_MODELS)), st.integers(1, 3000), st.sampled_from([1, 8, 16, 32, 128]),
       st.sampled_from([1, 2]), st.integers(1, 400))
def test_e02_1_matches_the_engine_kv_cache_manager(impl, name, num_tokens, block_size, dtype_bytes, blocks):
    arch = KNOWN_MODELS[name]
    # a memory budget of about `blocks` blocks, not a round number of them
    memory = blocks * block_size * arch.kv_bytes_per_token(dtype_bytes) + blocks * 7
    got = impl.max_num_sequences(arch, memory, num_tokens, block_size, dtype_bytes)  # yours first: fails fast
    assert got == engine_max_sequences(arch, memory, num_tokens, block_size, dtype_bytes)


# ---- E02.2 -------------------------------------------------------------------------------------------

def test_e02_2_worked_example(impl):
    alloc = impl.BlockAllocator(4)
    assert alloc.num_free_blocks == 4
    assert alloc.allocate(3) == [0, 1, 2]
    alloc.free([1])
    alloc.free([0])
    assert alloc.allocate(2) == [3, 1]
    assert alloc.num_free_blocks == 1
    assert [alloc.ref_count(b) for b in range(4)] == [0, 1, 1, 1]


def test_e02_2_shared_block_returns_with_its_last_owner(impl):
    alloc = impl.BlockAllocator(2)
    blocks = alloc.allocate(1)
    alloc.share(blocks)
    assert alloc.ref_count(blocks[0]) == 2
    alloc.free(blocks)
    assert alloc.num_free_blocks == 1 and alloc.ref_count(blocks[0]) == 1
    alloc.free(blocks)
    assert alloc.num_free_blocks == 2 and alloc.ref_count(blocks[0]) == 0


def _raises_runtime_error(call) -> None:
    with pytest.raises(RuntimeError) as error:
        call()
    assert not isinstance(error.value, NotImplementedError), "still a stub"


def test_e02_2_errors(impl):
    alloc = impl.BlockAllocator(2)
    assert alloc.allocate(0) == []
    _raises_runtime_error(lambda: alloc.allocate(3))
    assert alloc.num_free_blocks == 2, "a refused allocation takes nothing"
    _raises_runtime_error(lambda: alloc.free([0]))
    _raises_runtime_error(lambda: alloc.share([1]))


OPERATIONS = st.lists(st.tuples(st.sampled_from(["allocate", "share", "free"]), st.integers(0, 6)), max_size=40)


@FEW
@given(st.integers(0, 12), OPERATIONS)
def test_e02_2_matches_the_engine_block_pool(impl, num_blocks, operations):
    mine = impl.BlockAllocator(num_blocks)  # yours first: a stub fails fast
    pool = BlockPool(num_blocks)
    owners: list[list[int]] = []  # block lists held by someone (a request's table, a fork, ...)
    for op, k in operations:
        if op == "allocate":
            if k > pool.num_free_blocks:
                _raises_runtime_error(lambda: mine.allocate(k))  # noqa: B023
                continue
            got, expected = mine.allocate(k), pool.get_new_blocks(k)
            assert got == expected, "blocks must come from the free queue, oldest-freed first"
            owners.append(got)
        elif owners:
            blocks = owners[k % len(owners)]
            if op == "share":
                mine.share(blocks)
                for b in blocks:  # the engine's pool has no `share` yet: add a reference by hand
                    pool.ref_cnt[b] += 1
                owners.append(list(blocks))
            else:
                mine.free(blocks)
                pool.free_blocks(blocks)
                owners.remove(blocks)
        pool.check_invariants()
        assert mine.num_free_blocks == pool.num_free_blocks
        assert [mine.ref_count(b) for b in range(num_blocks)] == pool.ref_cnt
