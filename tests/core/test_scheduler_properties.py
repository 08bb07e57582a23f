"""Property tests of the block pool, KV cache manager and schedulers, driven by a fake executor.

No torch here: the core must stand on its own. Hypothesis draws request mixes (prompts built from a few
shared prefixes, so the prefix cache hits and evicts), pool sizes, budgets and abort times; after every
step we check the invariants the module docstrings promise. A fake KV store (slot -> what was written
there) checks the one property prefix caching must never break: every slot a request reads holds the K/V
of its own token at that position, computed under its own isolation key.
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from core import EngineConfig, Request, RequestStatus, StepResult, make_scheduler
from core.kv_cache_manager import NO_PREFIX
from core.math_utils import cdiv

TERMINAL = {RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH, RequestStatus.FINISHED_ABORTED}


def write_and_check_kv(sched, out, store: dict, host: dict) -> None:
    """Fake execution: carry out the step's block copies in the runner's order, write each scheduled
    token's (key, position, token) into its slot, then check that every position the request has computed
    reads back its own token."""
    bs = sched.config.block_size
    for plan, src, dst in ((out.swap_out, store, host), (out.copy_blocks, store, store), (out.swap_in, host, store)):
        moved = {(j, slot): src.get((i, slot)) for i, j in plan for slot in range(bs)}
        dst.update(moved)
    for s in out.scheduled:
        req = sched.requests[s.request_id]
        key = (req.tenant, req.cache_salt)
        for j, token in enumerate(s.token_ids):
            p = s.num_computed_tokens + j
            assert sched.kv_cache_manager.block_pool.ref_cnt[s.block_ids[p // bs]] == 1, \
                f"request {s.request_id} writes position {p} into a block other requests share"
            store[s.block_ids[p // bs], p % bs] = (key, p, token)
        expected = req.token_ids(0, s.num_computed_tokens + s.num_scheduled_tokens)
        for p, token in enumerate(expected):
            assert store.get((s.block_ids[p // bs], p % bs)) == (key, p, token), \
                f"request {s.request_id} reads wrong K/V at position {p}"


def check_step_invariants(sched, out) -> None:
    kv = sched.kv_cache_manager
    kv.check_invariants()
    pool = kv.block_pool
    assert pool.num_free_blocks + pool.num_used_blocks == pool.num_blocks
    assert out.num_scheduled_tokens <= sched.config.max_num_batched_tokens
    assert len(sched.running) <= sched.config.max_num_seqs
    assert len({s.request_id for s in out.scheduled}) == len(out.scheduled)
    for s in out.scheduled:
        req = sched.requests[s.request_id]
        assert req.status is RequestStatus.RUNNING
        assert s.num_scheduled_tokens >= 1
        # the block table covers every slot this step writes
        assert len(s.block_ids) * sched.config.block_size >= s.num_computed_tokens + s.num_scheduled_tokens
        assert s.block_ids == kv.get_block_ids(s.request_id)
    # the tokens scheduled sit exactly where the request's progress says
    for r in sched.waiting:
        assert r.status in (RequestStatus.WAITING, RequestStatus.SWAPPED)
        assert (r.request_id in kv.host_block_tables) == (r.status is RequestStatus.SWAPPED)
        assert r.request_id not in kv.block_tables
    if max(pool.ref_cnt, default=0) <= 1:  # shared prefix blocks hold tokens of several requests at once
        assert out.num_live_tokens <= out.num_reserved_slots
    stats = sched.make_stats()  # the scheduler's own counts agree with a recount
    assert (stats.num_running_reqs, stats.num_waiting_reqs) == (len(sched.running), len(sched.waiting))
    assert (stats.num_kv_blocks, stats.num_free_blocks) == (pool.num_blocks, pool.num_free_blocks)
    assert stats.num_preemptions == sched.num_preemptions
    assert stats.num_waiting_preempted_reqs == sum(1 for r in sched.waiting if r.num_preemptions)


@st.composite
def scenarios(draw):
    block_size = draw(st.sampled_from([1, 2, 4, 16]))
    max_model_len = draw(st.integers(8, 96))
    chunked = draw(st.booleans())
    budget = draw(st.integers(1, 64)) if chunked else draw(st.integers(max_model_len, max_model_len + 64))
    config = EngineConfig(
        block_size=block_size, max_num_seqs=draw(st.integers(1, 8)), max_num_batched_tokens=budget,
        max_model_len=max_model_len, enable_chunked_prefill=chunked,
        preemption_mode=draw(st.sampled_from(["recompute", "swap"])),
        num_swap_blocks=draw(st.sampled_from([None, 0, 3])),
        scheduling=draw(st.sampled_from(["continuous", "static"])),
        kv_allocation=draw(st.sampled_from(["paged", "paged", "contiguous", "contiguous_exact"])),
        enable_prefix_caching=draw(st.booleans()),
    )
    num_blocks = draw(st.integers(cdiv(max_model_len, block_size), cdiv(4 * max_model_len, block_size)))
    requests = draw(st.lists(
        st.tuples(st.integers(1, max_model_len + 4), st.integers(1, 40), st.integers(0, 30),
                  st.integers(0, 2), st.sampled_from([None, "a", "b"])),  # prefix family, tenant
        min_size=1, max_size=12))
    abort_at = draw(st.lists(st.tuples(st.integers(0, 60), st.integers(0, 11)), max_size=3))
    return config, num_blocks, requests, dict(abort_at), draw(st.integers(0, 2**16))


def reset_and_check(sched, tenant: str | None) -> None:
    """`reset_prefix_cache` mid-run (all, or one tenant's blocks): nothing of what it selected stays
    findable, everything else does, and blocks in use are only dropped (freed later by their requests)."""
    pool = sched.kv_cache_manager.block_pool
    before = dict(pool.cached)
    selected = {h for h, b in before.items() if tenant is None or pool.block_owner[b] == tenant}
    in_use = {before[h] for h in selected if pool.ref_cnt[before[h]]}
    assert sched.reset_prefix_cache(tenant) == len(selected)
    assert pool.cached == {h: b for h, b in before.items() if h not in selected}
    assert in_use <= pool.dropped


@settings(max_examples=300, deadline=None)
@given(scenarios(), st.lists(st.tuples(st.integers(0, 60), st.sampled_from([None, "a", "b", "default"])),
                             max_size=3))
def test_invariants_hold_under_any_sequence(scenario, resets):
    """Random workloads, aborts and prefix-cache resets (all, or one tenant's, while requests run)."""
    config, num_blocks, specs, abort_at, seed = scenario
    reset_at = dict(resets)
    rng = random.Random(seed)
    sched = make_scheduler(config, num_blocks)
    eos = frozenset({0})
    pending = []  # (arrival step, request)
    accepted: list[Request] = []
    refused = 0
    families = [[rng.randrange(1, 50) for _ in range(config.max_model_len + 4)] for _ in range(2)]
    store: dict = {}
    host: dict = {}
    for i, (prompt_len, max_tokens, arrive, family, tenant) in enumerate(specs):
        if family < 2:  # a shared prefix of random length, then a distinct tail
            shared = rng.choice([prompt_len, rng.randint(0, prompt_len)])  # often the whole prompt
            prompt = families[family][:shared] + [rng.randrange(1, 50) for _ in range(prompt_len - shared)]
        else:
            prompt = [rng.randrange(1, 50) for _ in range(prompt_len)]
        req = Request(str(i), prompt, max_tokens, eos_token_ids=eos, tenant=tenant)
        pending.append((arrive, req))

    for step in range(2000):
        for _, req in [p for p in pending if p[0] == step]:
            try:
                sched.add_request(req)
                accepted.append(req)
            except ValueError:
                refused += 1
                assert req.num_prompt_tokens >= config.max_model_len or \
                    sched.kv_cache_manager.max_blocks_needed(req) > num_blocks
        if step in abort_at and accepted:
            sched.abort_request(accepted[abort_at[step] % len(accepted)].request_id, now=step)
        if step in reset_at:
            reset_and_check(sched, reset_at[step])
        out = sched.schedule(now=float(step))
        check_step_invariants(sched, out)
        write_and_check_kv(sched, out, store, host)
        if sched.has_unfinished_requests() and out.is_empty:
            # only legal if everything left is waiting behind a static batch or an unfinished arrival
            assert sched.running == [] or config.scheduling == "static"
        result = StepResult({s.request_id: [rng.randrange(0, 50)] for s in out.scheduled if s.needs_logits})
        sched.update_from_output(out, result, now=float(step) + 0.5)
        if not sched.has_unfinished_requests() and all(p[0] <= step for p in pending):
            break
    else:
        raise AssertionError("the scheduler did not drain its requests in 2000 steps (livelock)")

    assert refused + len(accepted) == len(specs)
    for req in accepted:
        assert req.status in TERMINAL, (req.request_id, req.status)
        assert req.finish_time is not None
        if req.status is RequestStatus.FINISHED_LENGTH:
            assert req.num_output_tokens == req.max_tokens
        if req.status is not RequestStatus.FINISHED_ABORTED:
            assert 1 <= req.num_output_tokens <= req.max_tokens
    # quiescence: the pools are whole again
    kv = sched.kv_cache_manager
    assert kv.block_pool.num_free_blocks == num_blocks and not kv.block_pool.dropped
    if not config.enable_prefix_caching:
        assert kv.block_pool.num_cached_blocks == 0
    assert kv.host_pool.num_free_blocks == kv.host_pool.num_blocks
    assert not kv.block_tables and not kv.host_block_tables


@settings(max_examples=200, deadline=None)
@given(scenarios(), st.integers(1, 5), st.sampled_from([None, 1, 3]), st.sampled_from([None, 1, 4, 7]))
def test_speculative_steps_roll_back_to_the_accepted_tokens(scenario, k, disable_above, decode_cap):
    """Random drafts and random acceptances, with chunked prefill, preemption, aborts and prefix caching. The
    fake KV store records which token each slot's K/V was computed from; every position below
    num_computed_tokens must hold the request's real token there (rejected drafts are rolled back, never
    counted, and never registered in the prefix cache). With `decode_batch_max_tokens`, a step's decode rows
    hold at most that many tokens, drafts included."""
    config, num_blocks, specs, abort_at, seed = scenario
    config = config.replace(scheduling="continuous", kv_allocation="paged", speculative_method="ngram",
                            num_speculative_tokens=k, speculative_disable_by_batch_size=disable_above,
                            decode_batch_max_tokens=decode_cap)
    rng = random.Random(seed)
    sched = make_scheduler(config, num_blocks)
    accepted: list[Request] = []
    for i, (prompt_len, max_tokens, *_) in enumerate(specs):
        req = Request(str(i), [rng.randrange(1, 50) for _ in range(prompt_len)], max_tokens, ignore_eos=True)
        try:
            sched.add_request(req)
            accepted.append(req)
        except ValueError:
            pass
    store: dict = {}
    host: dict = {}
    num_verified = 0
    for step in range(3000):
        if step in abort_at and accepted:
            sched.abort_request(accepted[abort_at[step] % len(accepted)].request_id, now=step)
        candidates = sched.requests_to_speculate()
        if disable_above is not None and len(sched.running) > disable_above:
            assert candidates == []
        for req, most in candidates:
            assert 1 <= most <= k and req.num_tokens + most <= req.max_total_tokens
            req.spec_token_ids = [rng.randrange(1, 50) for _ in range(rng.randint(0, most))]
        out = sched.schedule(now=float(step))
        check_step_invariants(sched, out)
        write_and_check_kv(sched, out, store, host)  # prefix caching may be on: shared blocks stay intact
        sampled = {}
        assert sum(s.num_scheduled_tokens for s in out.scheduled
                   if s.num_computed_tokens == sched.requests[s.request_id].num_tokens - 1) <= (decode_cap or 10**9)
        for s in out.scheduled:
            req = sched.requests[s.request_id]
            assert s.num_draft_tokens == 0 or s.num_computed_tokens == req.num_tokens - 1
            assert s.token_ids[:s.num_scheduled_tokens - s.num_draft_tokens] == req.token_ids(
                s.num_computed_tokens, s.num_computed_tokens + s.num_scheduled_tokens - s.num_draft_tokens)
            if s.needs_logits:
                drafts = s.token_ids[len(s.token_ids) - s.num_draft_tokens:]
                n_ok = rng.randint(0, len(drafts))
                sampled[s.request_id] = drafts[:n_ok] + [rng.randrange(50, 60)]  # a correction never equals a draft
                num_verified += bool(drafts)
        sched.update_from_output(out, StepResult(sampled), now=float(step) + 0.5)
        bs = config.block_size
        for req in sched.running:  # after the rollback, every computed position holds its real token's K/V
            assert req.num_computed_tokens <= req.num_tokens - (1 if req.num_output_tokens else 0)
            table = sched.kv_cache_manager.get_block_ids(req.request_id)
            for pos in range(req.num_computed_tokens):
                assert store[table[pos // bs], pos % bs] == ((None, None), pos, req.token_ids(pos, pos + 1)[0]), \
                    (req.request_id, pos)
        if not sched.has_unfinished_requests():
            break
    else:
        raise AssertionError("the scheduler did not drain its requests in 3000 steps (livelock)")
    for req in accepted:
        assert req.status in TERMINAL
        if req.status is RequestStatus.FINISHED_LENGTH:
            assert req.num_output_tokens == req.max_tokens
    kv = sched.kv_cache_manager
    assert kv.block_pool.num_free_blocks == num_blocks and not kv.block_tables
    assert kv.host_pool.num_free_blocks == kv.host_pool.num_blocks



@settings(max_examples=200, deadline=None)
@given(scenarios(), st.data())
def test_prefill_budgets_bound_every_step_and_every_request_finishes(scenario, data):
    """The prefill budgets on random workloads, under each scheduling policy (random priorities, tenants,
    weights and a tenant cap): no prefill row exceeds `long_prefill_token_threshold`, no step holds more
    than `prefill_budget_tokens` prefill tokens or `decode_batch_max_tokens` decode tokens, no more than
    `max_num_partial_prefills` prompts are mid-prefill (scheduled this step or not), and yet everything
    finishes: a budget or a policy delays requests, it never deadlocks them."""
    config, num_blocks, specs, abort_at, seed = scenario
    budget = config.max_num_batched_tokens
    prefill_budget = data.draw(st.one_of(st.none(), st.integers(1, budget)))
    config = config.replace(
        scheduling="continuous", enable_chunked_prefill=True, kv_allocation="paged",
        long_prefill_token_threshold=data.draw(st.one_of(st.none(), st.integers(0, prefill_budget or budget))),
        prefill_budget_tokens=prefill_budget,
        max_num_partial_prefills=data.draw(st.one_of(st.none(), st.integers(1, 3))),
        decode_batch_max_tokens=data.draw(st.one_of(st.none(), st.integers(1, 3))),
        scheduling_policy=data.draw(st.sampled_from(["fcfs", "priority", "fair"])))
    if config.scheduling_policy == "fair":
        config = config.replace(tenant_weights=data.draw(st.one_of(st.none(), st.just({"a": 0.5, "b": 3}))),
                                tenant_max_num_seqs=data.draw(st.one_of(st.none(), st.just({"a": 1}))))
    rng = random.Random(seed)
    sched = make_scheduler(config, num_blocks)
    pending = [(arrive, Request(str(i), [rng.randrange(1, 50) for _ in range(prompt_len)], max_tokens,
                                ignore_eos=True, tenant=tenant, priority=family))
               for i, (prompt_len, max_tokens, arrive, family, tenant) in enumerate(specs)]
    accepted = []
    for step in range(3000):
        for arrive, req in pending:
            if arrive == step:
                try:
                    sched.add_request(req)
                    accepted.append(req)
                except ValueError:
                    pass
        if step in abort_at and accepted:
            sched.abort_request(accepted[abort_at[step] % len(accepted)].request_id, now=step)
        out = sched.schedule(now=float(step))
        check_step_invariants(sched, out)
        prefill_rows = {}
        decode_tokens = 0
        for s in out.scheduled:
            if s.num_computed_tokens == sched.requests[s.request_id].num_tokens - 1:
                decode_tokens += s.num_scheduled_tokens
            else:
                prefill_rows[s.request_id] = s.num_scheduled_tokens
        assert all(n <= (config.long_prefill_token_threshold or budget) for n in prefill_rows.values())
        assert sum(prefill_rows.values()) <= (config.prefill_budget_tokens or budget)
        assert decode_tokens <= (config.decode_batch_max_tokens or budget)
        mid_prefill = set(prefill_rows) | {r.request_id for r in sched.running
                                           if r.num_computed_tokens < r.num_tokens - 1}
        assert len(mid_prefill) <= (config.max_num_partial_prefills or config.max_num_seqs)
        result = StepResult({s.request_id: [rng.randrange(0, 50)] for s in out.scheduled if s.needs_logits})
        sched.update_from_output(out, result, now=float(step) + 0.5)
        if not sched.has_unfinished_requests() and all(arrive <= step for arrive, _ in pending):
            break
    else:
        raise AssertionError("the scheduler did not drain its requests in 3000 steps (deadlock or livelock)")
    assert all(req.status in (RequestStatus.FINISHED_LENGTH, RequestStatus.FINISHED_ABORTED) for req in accepted)
    assert sched.kv_cache_manager.block_pool.num_free_blocks == num_blocks
    if config.scheduling_policy == "fair":  # the per-tenant counts the policy keeps came back to zero
        assert not sched.num_running_by_group and not sched.num_unfinished_by_group


def blocks_missing(kv, request: Request, num_new_tokens: int, prefix) -> int:
    """The general formula of `KVCacheManager.allocate_slots`: blocks the request's table lacks once it holds
    its computed tokens, the prefix hits and `num_new_tokens` more (reserving modes hold more)."""
    shared = prefix.blocks[:-1] if prefix.needs_copy(kv.block_size) else prefix.blocks
    held = len(kv.block_tables.get(request.request_id, [])) + len(shared)
    num_tokens = request.num_computed_tokens + prefix.num_tokens + num_new_tokens
    return max(cdiv(kv.tokens_to_hold(request, num_tokens), kv.block_size) - held, 0)


@settings(max_examples=200, deadline=None)
@given(scenarios(), st.integers(0, 3))
def test_allocate_slots_takes_what_the_general_formula_says(scenario, num_drafts):
    """`allocate_slots` answers most calls (a decode step whose last block has room) with an O(1) check that
    the table already covers the tokens; under every allocation mode, preemption mode, prefix caching and
    draft count, each call takes exactly the blocks the general formula says are missing (or refuses,
    taking none, when the pool lacks them), and never changes a table it hands out."""
    config, num_blocks, specs, _, seed = scenario
    if config.scheduling == "continuous" and num_drafts:
        config = config.replace(speculative_method="ngram", num_speculative_tokens=num_drafts,
                                speculative_disable_by_batch_size=None)
    rng = random.Random(seed)
    sched = make_scheduler(config, num_blocks)
    kv = sched.kv_cache_manager
    allocate_slots = kv.allocate_slots
    handed_out: list[tuple[list[int], list[int]]] = []  # (a table as handed out, a copy of it then)

    def checked_allocate_slots(request, num_new_tokens, prefix=NO_PREFIX):
        missing = blocks_missing(kv, request, num_new_tokens, prefix)
        free = kv.block_pool.num_free_blocks
        new_blocks = allocate_slots(request, num_new_tokens, prefix)
        if new_blocks is None:
            reclaimed = sum(1 for b in prefix.blocks if kv.block_pool.ref_cnt[b] == 0)
            assert missing + reclaimed > free and kv.block_pool.num_free_blocks == free
        else:
            assert len(new_blocks) == missing, (request.request_id, num_new_tokens, missing, new_blocks)
        return new_blocks

    kv.allocate_slots = checked_allocate_slots
    for i, (prompt_len, max_tokens, *_) in enumerate(specs):
        try:
            sched.add_request(Request(str(i), [rng.randrange(1, 50) for _ in range(prompt_len)], max_tokens,
                                      ignore_eos=True))
        except ValueError:
            pass
    for step in range(3000):
        for req, most in sched.requests_to_speculate():
            req.spec_token_ids = [rng.randrange(1, 50) for _ in range(rng.randint(0, most))]
        out = sched.schedule(now=float(step))
        for s in out.scheduled:
            handed_out.append((s.block_ids, list(s.block_ids)))
        sampled = {}
        for s in out.scheduled:  # accept a random run of the drafts, then a token of the target's own
            if s.needs_logits:
                drafts = s.token_ids[len(s.token_ids) - s.num_draft_tokens:]
                sampled[s.request_id] = drafts[:rng.randint(0, len(drafts))] + [rng.randrange(50, 60)]
        sched.update_from_output(out, StepResult(sampled), now=float(step) + 0.5)
        if not sched.has_unfinished_requests():
            break
    else:
        raise AssertionError("the scheduler did not drain its requests in 3000 steps (livelock)")
    assert all(table == copy for table, copy in handed_out), "a block table changed after a step handed it out"
