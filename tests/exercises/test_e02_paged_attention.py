"""Checks for lesson 2's exercises; `impl` is the reference or your stub (see conftest.py).

E02.1 is checked against the engine's arithmetic: `ArchConfig.kv_bytes_per_token`, and how many requests
the real `KVCacheManager` can hold before `allocate_slots` says no. E02.2 runs the same random operations
on your allocator and on the engine's `BlockPool` and compares them after every operation. E02.3 (debug)
replays traces of adds, forks, appends and frees through your `SequenceBlockTables` and a model of the KV
slots they address: every live sequence must read back its own tokens, and every block's reference count
must equal the number of block tables that hold it. The committed stub fails them; the fix passes.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.arch_config import KNOWN_MODELS, ArchConfig
from core.block_pool import BlockPool
from core.kv_cache_manager import KVCacheManager
from core.request import Request

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


# ---- E02.3 -------------------------------------------------------------------------------------------
# A model of the KV cache that the block tables address: every slot remembers whose token wrote it, and
# block copies (copy-on-write) copy those labels. After every operation, each live sequence must read back
# exactly its own tokens: the prompt it started with (shared with its parent, if it was forked) and the
# tokens it appended since. A failure prints the trace of operations that led to it.

class KVModel:
    def __init__(self, impl, num_blocks: int, block_size: int) -> None:
        self.tables = impl.SequenceBlockTables(num_blocks, block_size)
        self.bs = block_size
        self.kv: dict[int, tuple[str, int]] = {}  # slot -> (the sequence that wrote it, its position)
        self.tokens: dict[str, list[tuple[str, int]]] = {}  # what each live sequence must read back
        self.trace: list[str] = []
        self.copies_done = 0

    def slot(self, seq: str, pos: int) -> int:
        table = self.tables.table(seq)
        return table[pos // self.bs] * self.bs + pos % self.bs

    def add(self, seq: str, n: int) -> None:
        self.tables.add(seq, n)
        self.tokens[seq] = [(seq, p) for p in range(n)]
        for p in range(n):  # the prefill writes the prompt's K/V
            self.kv[self.slot(seq, p)] = (seq, p)
        self.trace.append(f"add({seq!r}, {n}) -> table {self.tables.table(seq)}")

    def fork(self, parent: str, child: str) -> None:
        self.tables.fork(parent, child)
        self.tokens[child] = list(self.tokens[parent])
        self.trace.append(f"fork({parent!r}, {child!r}) -> table {self.tables.table(child)}")

    def append(self, seq: str) -> int:
        slot = self.tables.append_slot(seq)
        for src, dst in self.tables.copies[self.copies_done:]:  # the runner copies before the step writes
            for offset in range(self.bs):
                if src * self.bs + offset in self.kv:
                    self.kv[dst * self.bs + offset] = self.kv[src * self.bs + offset]
        self.copies_done = len(self.tables.copies)
        pos = len(self.tokens[seq])
        assert slot == self.slot(seq, pos), f"append_slot returned {slot}, the table says {self.slot(seq, pos)}"
        self.kv[slot] = (seq, pos)
        self.tokens[seq].append((seq, pos))
        self.trace.append(f"append_slot({seq!r}) -> slot {slot} (table {self.tables.table(seq)})")
        return slot

    def free(self, seq: str) -> None:
        self.tables.free(seq)
        del self.tokens[seq]
        self.trace.append(f"free({seq!r})")

    def check(self) -> None:
        steps = "\n  ".join(self.trace)
        for seq, expected in self.tokens.items():
            for pos, want in enumerate(expected):
                got = self.kv.get(self.slot(seq, pos))
                assert got == want, (f"after\n  {steps}\nsequence {seq!r} reads, at position {pos} (slot "
                                     f"{self.slot(seq, pos)}), the K/V written by {got}, not its own {want}")
        holders = [0] * self.tables.pool.num_blocks
        for seq in self.tokens:
            for b in self.tables.table(seq):
                holders[b] += 1
        for b, n in enumerate(holders):
            count = self.tables.pool.ref_cnt[b]
            assert count == n, (f"after\n  {steps}\nblock {b} is in {n} block table(s) but its reference count "
                                f"is {count}")
        self.tables.pool.check_invariants()


def test_e02_3_the_failing_trace(impl):
    """Parallel sampling: a 6-token prompt, forked into two samples, each appends its first token."""
    m = KVModel(impl, num_blocks=8, block_size=4)
    m.add("parent", 6)  # blocks [0, 1]; block 1 holds positions 4 and 5 and has room for two more
    m.fork("parent", "child")  # the child shares [0, 1]
    child_slot = m.append("child")  # position 6 lands in the shared block 1: copy-on-write must kick in
    parent_slot = m.append("parent")
    assert child_slot != parent_slot, (
        "parent and child wrote their token at position 6 into the same KV slot "
        f"{parent_slot}:\n  " + "\n  ".join(m.trace))
    m.check()


def test_e02_3_a_finished_parent_keeps_the_childs_blocks(impl):
    m = KVModel(impl, num_blocks=4, block_size=4)
    m.add("parent", 8)  # blocks [0, 1], both full
    m.fork("parent", "child")
    m.free("parent")  # the child still holds both blocks: they must not become free
    assert m.tables.pool.num_free_blocks == 2, "the parent's blocks went back to the pool while the child holds them"
    m.check()


OPS = st.lists(st.tuples(st.sampled_from(["add", "fork", "append", "append", "free"]), st.integers(0, 4),
                         st.integers(1, 10)), min_size=1, max_size=30)


@FEW
@given(OPS)
def test_e02_3_random_traces_keep_every_sequence_s_kv(impl, ops):
    """Random adds, forks, appends and frees; an operation that would need more blocks than are free is
    skipped (the scheduler would wait or preempt), so every trace is one a correct engine can run."""
    m = KVModel(impl, num_blocks=10, block_size=4)
    names = iter(f"s{i}" for i in range(1000))
    for op, pick, n in ops:
        live = sorted(m.tokens)
        seq = live[pick % len(live)] if live else None
        free = m.tables.pool.num_free_blocks
        if op == "add" and free >= -(-n // 4):
            m.add(next(names), n)
        elif op == "fork" and seq is not None:
            m.fork(seq, next(names))
        elif op == "append" and seq is not None and free >= 1:
            m.append(seq)
        elif op == "free" and seq is not None:
            m.free(seq)
        m.check()
