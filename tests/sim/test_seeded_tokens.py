"""`SeededTokens` behaves as the list of ids it stands for, wherever the core reads a prompt; a workload with
lazy prompts makes the same requests (lengths, order, ids) and the same decisions as an eager one."""

from __future__ import annotations

import random

import pytest
import simpy

from core import EngineConfig, Exponential, Request, Workload
from core.block_hash import extend_block_hashes
from core.seeded_tokens import SeededTokens
from sim import Simulator
from sim.executor import feed_arrivals


def tokens(length: int = 100, seed: object = "s") -> SeededTokens:
    return SeededTokens.seeded(seed, length, 100, 1000)


def test_it_reads_as_the_list_it_stands_for() -> None:
    lazy = tokens()
    unread = lazy[10:90][5:]
    assert isinstance(unread, SeededTokens) and not lazy.is_drawn  # a view while nothing is read
    ids = list(lazy)
    assert unread == ids[15:90]
    assert len(lazy) == len(ids) == 100 and all(100 <= t < 1000 for t in ids)
    assert lazy == ids and ids == lazy and lazy == tuple(ids) and lazy != ids[:-1]
    assert [lazy[i] for i in range(100)] == ids and lazy[-1] == ids[-1] and lazy[-100] == ids[0]
    with pytest.raises(IndexError):
        lazy[100]
    rng = random.Random(0)
    for _ in range(200):  # slices of slices, in any order, with any bounds
        a, b = sorted(rng.randint(-120, 120) for _ in range(2))
        view = lazy[a:b]
        assert view == ids[a:b] and len(view) == len(ids[a:b])
        c, d = sorted(rng.randint(-30, 30) for _ in range(2))
        assert view[c:d] == ids[a:b][c:d]
    assert lazy[::3] == ids[::3] and lazy[5:1] == []
    assert lazy + [7] == ids + [7] and [7] + lazy == [7] + ids and lazy[:3] + lazy[3:] == ids
    assert not SeededTokens.seeded("s", 0, 100, 1000) and bool(lazy)


def test_the_same_seed_gives_the_same_ids_and_another_seed_others() -> None:
    assert list(tokens(seed="a")) == list(tokens(seed="a")) != list(tokens(seed="b"))
    assert list(tokens(40, "a")) == list(tokens(100, "a"))[:40]  # a prefix of a longer prompt of the same seed


def test_a_request_reads_it_as_it_reads_a_list() -> None:
    lazy = tokens(50)
    lazy_request = Request("0", lazy, max_tokens=8)
    list_request = Request("0", list(lazy), max_tokens=8)
    for request in (lazy_request, list_request):
        for token in (1, 2, 3):
            request.append_output_token(token, 0.0)
    assert lazy_request.num_prompt_tokens == 50 and lazy_request.num_tokens == 53
    for start, stop in [(0, 16), (16, 50), (40, 53), (50, 53), (0, 53)]:
        assert list(lazy_request.token_ids(start, stop)) == list_request.token_ids(start, stop)
    hashes: dict[str, list[bytes]] = {"lazy": [], "list": []}
    extend_block_hashes(hashes["lazy"], lazy, 16, b"k")
    extend_block_hashes(hashes["list"], list(lazy), 16, b"k")
    assert hashes["lazy"] == hashes["list"] and len(hashes["lazy"]) == 3
    with pytest.raises(ValueError, match="empty"):
        Request("1", tokens(0), max_tokens=1)


def test_lazy_prompts_change_the_ids_but_not_the_requests_or_the_decisions() -> None:
    workload = (Workload.synthetic(80, (32, 600), Exponential(64, 256), arrival=20.0, seed=3)
                + Workload.shared_prefix(2, 10, 64, 16, 8, arrival=20.0, seed=3))
    eager, lazy = workload.make_requests(50_000), workload.with_lazy_prompts().make_requests(50_000)
    assert [(r.request_id, r.num_prompt_tokens, r.max_tokens, r.arrival_time) for r in eager] == \
        [(r.request_id, r.num_prompt_tokens, r.max_tokens, r.arrival_time) for r in lazy]
    assert sum(isinstance(r.prompt_token_ids, SeededTokens) for r in lazy) == 80  # the shared-prefix ones stay lists
    assert list(workload.iter_requests(50_000))[5].prompt_token_ids == eager[5].prompt_token_ids
    config = EngineConfig(max_num_seqs=32, max_num_batched_tokens=1024, num_kv_blocks=100)  # prefix caching on
    simulator = Simulator("llama-3.1-8b", "h100-sxm", config)
    eager_run, lazy_run = simulator.run(workload), simulator.run(workload.with_lazy_prompts())
    assert eager_run.prefix_cache_hits > 0 and eager_run.num_preemptions > 0
    assert eager_run.to_dict() == lazy_run.to_dict()
    assert simulator.run(workload.with_lazy_prompts()).to_dict() == lazy_run.to_dict()  # same seed, same numbers


def test_iter_requests_makes_them_in_arrival_order_even_for_a_workload_out_of_order() -> None:
    workload = Workload.synthetic(20, 8, 4, arrival=5.0, seed=1)
    shuffled = Workload(tuple(reversed(workload.requests)), seed=1)
    times = [r.arrival_time for r in shuffled.iter_requests(1000)]
    assert times == sorted(times)
    assert [r.prompt_token_ids for r in workload.iter_requests(1000)] == \
        [r.prompt_token_ids for r in workload.make_requests(1000)]


def test_a_prompt_is_drawn_only_when_read() -> None:
    """Without prefix caching nothing reads a simulated prompt; with it, hashing draws each one once."""
    workload = Workload.synthetic(20, (32, 300), 8, arrival=50.0, seed=2).with_lazy_prompts()
    for caching in (False, True):
        config = EngineConfig(max_num_seqs=8, enable_prefix_caching=caching)
        env = simpy.Environment()
        replica = Simulator("llama-3.1-8b", "h100-sxm", config).make_executor(env)
        requests = workload.make_requests(50_000)
        env.process(feed_arrivals(env, requests, replica.add_request))
        env.run()
        assert replica.metrics().completed == 20
        assert all(r.prompt_token_ids.is_drawn == caching for r in requests)  # type: ignore[union-attr]
    lazy = tokens()
    view = lazy[10:20]
    assert not lazy.is_drawn and view[0] == list(lazy)[10] and lazy.is_drawn and view.is_drawn  # one draw, shared
    assert lazy[10:20] == list(view) and isinstance(lazy[10:20], list)  # drawn: slices are lists
