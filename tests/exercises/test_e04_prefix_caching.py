"""Checks for lesson 4's exercises; `impl` is the reference or your stub (see conftest.py).

E04.1 is checked against the engine's own code: the hash chain of `extend_block_hashes`, and the tokens
`KVCacheManager.get_computed_blocks` serves to a new request after earlier prompts (random, sharing random
prefixes) were computed and cached. E04.2 is checked against the prefix-cache hits the simulator counts
when it serves a shared-prefix workload after a warm-up round. E04.3 (debug) replays traces through your
`SmallPrefixCache`: a prompt that comes back after one unrelated request must hit the blocks the pool still
holds, and no cached block may sit behind a missing predecessor in its chain, where no lookup can reach it.
The committed stub fails them; the fix passes.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core import EngineConfig, Workload
from core.block_hash import extend_block_hashes, hash_block_tokens, isolation_key
from core.kv_cache_manager import KVCacheManager
from core.request import Request
from core.workload import WorkloadRequest
from course.prefix_caching import hit_rate_sweep
from sim.simulator import Simulator

FEW = settings(max_examples=60, deadline=None, derandomize=True)  # the same examples on every run
KEY = isolation_key("smollm2-135m", "tenant-a", None)


# ---- E04.1 -------------------------------------------------------------------------------------------

def test_e04_1_worked_examples(impl):
    first = list(range(1, 9))
    hashes = impl.block_hashes(first, 4)
    assert len(hashes) == 2 and len(impl.block_hashes(first + [9, 10], 4)) == 2
    assert impl.block_hashes([1, 2, 3], 4) == []
    cache = {h: tuple(first[4 * i:4 * i + 4]) for i, h in enumerate(hashes)}
    assert impl.num_cached_tokens(first + [9, 10], cache, 4) == 8
    assert impl.num_cached_tokens([1, 2, 3, 4, 0, 0, 0, 0, 9], cache, 4) == 4
    assert impl.num_cached_tokens(first, cache, 4) == 7, "the last token is always computed (its logits)"
    assert impl.num_cached_tokens([1, 2, 3], cache, 4) == 0
    assert impl.num_cached_tokens([], cache, 4) == 0


def test_e04_1_the_chain_depends_on_everything_before(impl):
    """The same block tokens after a different first block must hash differently: K/V depend on the past."""
    a = impl.block_hashes([1, 2, 3, 4, 5, 6, 7, 8], 4)
    b = impl.block_hashes([9, 2, 3, 4, 5, 6, 7, 8], 4)
    assert a[0] != b[0] and a[1] != b[1]
    assert a[0] == hash_block_tokens(None, [1, 2, 3, 4], b"")
    assert a[1] == hash_block_tokens(a[0], [5, 6, 7, 8], b""), "block 1's parent is block 0's hash"
    assert impl.block_hashes([1, 2, 3, 4], 4, KEY) != impl.block_hashes([1, 2, 3, 4], 4), "extra keys count"


def test_e04_1_a_collision_is_a_miss(impl):
    tokens = list(range(1, 10))
    hashes = impl.block_hashes(tokens, 4)
    cache = {hashes[0]: (1, 2, 3, 4), hashes[1]: (50, 60, 70, 80)}  # block 1's hash, someone else's tokens
    assert impl.num_cached_tokens(tokens, cache, 4) == 4


@FEW
@given(st.lists(st.integers(0, 400), max_size=70), st.sampled_from([1, 2, 4, 16]), st.sampled_from([b"", KEY]))
def test_e04_1_matches_extend_block_hashes(impl, tokens, block_size, extra_keys):
    expected: list[bytes] = []
    extend_block_hashes(expected, tokens, block_size, extra_keys)
    assert impl.block_hashes(tokens, block_size, extra_keys) == expected


def _prompts(seed: int, count: int, max_len: int) -> list[list[int]]:
    """Prompts that share prefixes of random lengths with earlier ones, as system prompts and chat
    histories do; some are exact repeats, some are prefixes of earlier prompts."""
    rng = random.Random(seed)
    prompts: list[list[int]] = []
    for _ in range(count):
        length = rng.randint(1, max_len)
        if prompts and rng.random() < 0.8:
            base = rng.choice(prompts)
            keep = rng.randint(0, len(base))
            prompt = base[:keep] + [rng.randint(0, 50) for _ in range(max(0, length - keep))]
        else:
            prompt = [rng.randint(0, 50) for _ in range(length)]
        prompts.append(prompt)
    return prompts


@FEW
@given(st.integers(0, 10**6), st.sampled_from([1, 2, 4, 8]), st.integers(2, 12))
def test_e04_1_matches_the_engine_lookup(impl, seed, block_size, count):
    """Compute and cache each prompt in the engine's KV cache manager, then look up the next one both ways.
    The pool is big enough that nothing is evicted, so its cache is exactly hash -> the block's tokens."""
    kv = KVCacheManager(block_size, 4096, enable_caching=True, cache_namespace="m")
    for i, prompt in enumerate(_prompts(seed, count, 40)):
        request = Request(str(i), prompt, max_tokens=1, tenant="t")
        pool = kv.block_pool
        cache = {h: pool.block_tokens[b] for h, b in pool.cached.items()}
        got = impl.num_cached_tokens(prompt, cache, block_size, isolation_key("m", "t", None))  # yours first
        prefix = kv.get_computed_blocks(request)
        assert got == prefix.num_tokens, f"prompt {i} ({len(prompt)} tokens)"
        assert kv.allocate_slots(request, len(prompt) - prefix.num_tokens, prefix) is not None
        request.num_computed_tokens = len(prompt)
        kv.cache_full_blocks(request)
        kv.free(request.request_id)


# ---- E04.2 -------------------------------------------------------------------------------------------

def test_e04_2_by_hand(impl):
    # a 100-token system prompt, 20-token questions, 16-token blocks: 6 whole blocks = 96 tokens hit
    assert impl.cached_tokens_per_request(100, 20, 16) == 96
    assert impl.prefix_cache_hit_rate(100, 20, 16) == pytest.approx(96 / 120)
    assert impl.prefill_tokens_saved(8, 100, 20, 16) == 8 * 96
    assert impl.cached_tokens_per_request(15, 20, 16) == 0, "a prefix shorter than a block never hits"
    assert impl.cached_tokens_per_request(32, 0, 16) == 31, "the last token is always computed"


def simulated_hits(prefix_len: int, suffix_len: int, block_size: int, num_requests: int) -> tuple[int, float]:
    """Warm the simulator's cache with one request, then serve `num_requests` sharing its prefix. (With no
    suffix every prompt is the prefix itself, which `Workload.shared_prefix` does not make: build it.)"""
    if suffix_len:
        warmup = Workload.shared_prefix(1, 1, prefix_len, suffix_len, 1, seed=1, prefix_seed=0)
        workload = Workload.shared_prefix(1, num_requests, prefix_len, suffix_len, 2, seed=0)
    else:
        prompt = tuple(range(100, 100 + prefix_len))
        warmup = Workload((WorkloadRequest(0.0, prefix_len, 1, prompt_token_ids=prompt),))
        workload = Workload(tuple(WorkloadRequest(0.0, prefix_len, 2, prompt_token_ids=prompt)
                                  for _ in range(num_requests)))
    config = EngineConfig(block_size=block_size, enable_prefix_caching=True, num_kv_blocks=4096 // block_size + 64)
    metrics = Simulator(hardware="local-cpu", config=config).run_rounds([warmup, workload])[-1]
    return metrics.prefix_cache_hits, metrics.prefix_cache_hit_rate


@pytest.mark.parametrize("prefix_len, suffix_len, block_size, num_requests", [
    (100, 20, 16, 8), (15, 20, 16, 4), (16, 1, 16, 3), (32, 0, 16, 2), (48, 0, 16, 5), (250, 7, 64, 4),
    (1000, 50, 256, 2), (9, 3, 1, 6), (40, 40, 32, 5),
])
def test_e04_2_matches_the_simulator(impl, prefix_len, suffix_len, block_size, num_requests):
    saved = impl.prefill_tokens_saved(num_requests, prefix_len, suffix_len, block_size)  # yours first
    hits, rate = simulated_hits(prefix_len, suffix_len, block_size, num_requests)
    assert saved == hits
    assert impl.prefix_cache_hit_rate(prefix_len, suffix_len, block_size) == pytest.approx(rate)


def test_e04_2_matches_hit_rate_sweep(impl):
    for row in hit_rate_sweep([8, 16, 31, 40, 100, 300], [8, 16, 32], suffix_len=50):
        assert impl.prefix_cache_hit_rate(row["prefix_len"], 50, row["block_size"]) == pytest.approx(row["hit_rate"])


# ---- E04.3 -------------------------------------------------------------------------------------------

class Trace:
    """Drives a SmallPrefixCache and remembers what it did, so that a failure can print the whole story."""

    def __init__(self, impl, num_blocks: int, block_size: int) -> None:
        self.cache = impl.SmallPrefixCache(num_blocks, block_size)
        self.prompts: dict[str, list[int]] = {}  # every prompt ever served, by request id
        self.lines: list[str] = []

    def serve(self, rid: str, tokens: list[int]) -> int:
        hits = self.cache.serve(rid, tokens)
        self.prompts[rid] = tokens
        self.lines.append(f"serve({rid!r}, {len(tokens)} tokens) -> {hits} cached, table {self.cache.tables[rid]}")
        return hits

    def finish(self, rid: str) -> None:
        self.cache.finish(rid)
        self.lines.append(f"finish({rid!r}) -> free queue, oldest first: {list(self.cache.pool._free)}")

    def story(self) -> str:
        return "\n  " + "\n  ".join(self.lines)

    def cached_blocks(self, tokens: list[int]) -> list[bool]:
        """For each full block of `tokens`: is its content still cached somewhere in the pool?"""
        bs = self.cache.block_size
        return [self.cache.pool.get_cached_block(h, tuple(tokens[i * bs:(i + 1) * bs])) is not None
                for i, h in enumerate(self.cache.chain(tokens))]

    def check_nothing_stranded(self) -> None:
        """A cached block whose predecessor in the chain is gone can never be hit again: it only takes room."""
        for rid, tokens in self.prompts.items():
            cached = self.cached_blocks(tokens)
            for i in range(1, len(cached)):
                assert not cached[i] or cached[i - 1], (
                    f"after{self.story()}\nblock {i} of {rid!r}'s prompt is still cached but block {i - 1} is "
                    f"not (cached: {cached}): no lookup can reach it any more")
        self.cache.pool.check_invariants()


def test_e04_3_the_failing_trace(impl):
    """A 16-token prompt (4 blocks of 4), one unrelated 12-token request, then the first prompt again."""
    t = Trace(impl, num_blocks=6, block_size=4)
    a, x = list(range(1, 17)), list(range(101, 113))
    assert t.serve("a", a) == 0
    t.finish("a")
    t.serve("x", x)  # needs 3 blocks: two never used, then one that held part of a's prompt
    t.finish("x")
    before = t.cached_blocks(a)  # which of a's four blocks the pool still holds
    hits = t.serve("a-again", a)
    assert hits == 12, (f"a's prompt came back and got {hits} tokens from the cache, although 3 of its 4 blocks "
                        f"were still cached just before (block by block: {before}):{t.story()}")


SHARED = [list(range(1000 * g, 1000 * g + 16)) for g in range(3)]  # three 16-token system prompts


@FEW
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 2), st.integers(0, 9)), min_size=1, max_size=25))
def test_e04_3_random_traces_strand_no_block(impl, ops):
    """Requests made of one of three shared prefixes plus a few tokens of their own arrive and finish in a
    random order, in a pool too small for all of them; a request the pool cannot hold now is skipped."""
    t = Trace(impl, num_blocks=12, block_size=4)
    running: list[str] = []
    for n, (arrive, group, extra) in enumerate(ops):
        if arrive or not running:
            tokens = SHARED[group] + [5000 + 10 * n + j for j in range(extra)]
            try:
                t.serve(f"r{n}", tokens)
            except RuntimeError:
                continue
            running.append(f"r{n}")
        else:
            t.finish(running.pop(extra % len(running)))
        t.check_nothing_stranded()
