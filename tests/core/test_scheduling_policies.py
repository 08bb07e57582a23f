"""The scheduling policies on small exact cases, torch-free: priority (vLLM's order and victim), fair
(virtual token counters: round-robin, weights, no banked credit, a bounded wait for a late tenant, caps),
bad knob values, the metrics they are judged by, and workloads of several senders."""

from __future__ import annotations

import math

import pytest

from core import EngineConfig, Request, RunMetrics, StepResult, Workload, make_scheduler


def drive(config: EngineConfig, num_kv_blocks: int, arrivals: dict[int, list[Request]],
          max_steps: int = 2000) -> tuple[object, list[tuple[int, str]]]:
    """Run a scheduler with a fake executor (every row that needs logits gets token 7) until everything
    has arrived and finished; times are step numbers. Returns the scheduler and its admissions as
    (step, request id), in order."""
    sched = make_scheduler(config.for_model(512), num_kv_blocks)
    admitted = []
    for step in range(max_steps):
        for request in arrivals.get(step, []):
            sched.add_request(request)
        before = {r.request_id for r in sched.running}
        out = sched.schedule(now=float(step))
        admitted += [(step, r.request_id) for r in sched.running if r.request_id not in before]
        sched.update_from_output(out, StepResult({s.request_id: [7] for s in out.scheduled if s.needs_logits}),
                                 now=float(step))
        if not sched.has_unfinished_requests() and step >= max(arrivals):
            return sched, admitted
    raise AssertionError("the requests did not finish")


def req(request_id: str, prompt_len: int, max_tokens: int, arrival: float = 0.0, **kw) -> Request:
    return Request(request_id, list(range(100, 100 + prompt_len)), max_tokens, arrival_time=arrival,
                   ignore_eos=True, **kw)


# ---- priority ----

@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_a_high_priority_arrival_into_a_full_pool_preempts_the_lowest_priority_and_finishes_first(policy):
    """Two long low-priority requests hold both seats and, soon after, every block; a short high-priority
    request arrives and waits. When a running request next needs a block, the victim is vLLM's: the lowest
    priority, latest arrival (B). Under "priority" the newcomer is then the head of the queue, takes B's
    seat at once and finishes first; under "fcfs" the preempted B goes back to the head and the newcomer
    waits for a request to finish."""
    a, b = req("A", 8, 40, priority=1), req("B", 8, 40, arrival=0.5, priority=1)
    h = req("H", 4, 4, arrival=25.0, priority=0)
    config = EngineConfig(block_size=4, max_num_seqs=2, max_num_batched_tokens=32, scheduling_policy=policy)
    _, admitted = drive(config, 20, {0: [a, b], 25: [h]})
    assert (a.num_preemptions, b.num_preemptions, h.num_preemptions) == (0, 1, 0)
    preempted_at = 33  # A and B hold 40 tokens each, all 20 blocks of 4, and A needs one more
    if policy == "priority":
        assert admitted[2] == (preempted_at + 1, "H")
        assert h.finish_time < a.finish_time < b.finish_time
    else:
        assert admitted[2] == (preempted_at + 1, "B")
        assert a.finish_time < b.finish_time < h.finish_time


def test_priorities_order_admission_and_equal_priorities_keep_arrival_order():
    config = EngineConfig(max_num_seqs=1, max_num_batched_tokens=64, scheduling_policy="priority")
    requests = [req(str(i), 8, 2, arrival=i * 0.1, priority=p) for i, p in enumerate([1, 0, 1, 0, 0, 2])]
    _, admitted = drive(config, 64, {0: requests})
    assert [rid for _, rid in admitted] == ["1", "3", "4", "0", "2", "5"]
    _, admitted = drive(config.replace(scheduling_policy="fcfs"),
                        64, {0: [req(str(i), 8, 2, priority=i % 2) for i in range(5)]})
    assert [rid for _, rid in admitted] == ["0", "1", "2", "3", "4"]


# ---- fair ----

def tenant_requests(tenant: str, n: int, prompt_len: int = 8, max_tokens: int = 6, arrival: float = 0.0,
                    start: int = 0) -> list[Request]:
    return [req(f"{tenant}{start + i}", prompt_len, max_tokens, arrival=arrival, tenant=tenant) for i in range(n)]


def test_equal_weights_are_round_robin_between_tenants():
    config = EngineConfig(max_num_seqs=1, max_num_batched_tokens=64, scheduling_policy="fair")
    _, admitted = drive(config, 64, {0: tenant_requests("a", 5) + tenant_requests("b", 5)})
    assert [rid[0] for _, rid in admitted] == list("ababababab")


def test_weights_share_the_seats_while_both_tenants_are_backlogged():
    """Weights 1:3 and the same work: b is admitted three times as often as a until it runs dry."""
    config = EngineConfig(max_num_seqs=4, max_num_batched_tokens=64, scheduling_policy="fair",
                          tenant_weights={"a": 1, "b": 3})
    _, admitted = drive(config, 128, {0: tenant_requests("a", 12) + tenant_requests("b", 12)})
    first = [rid[0] for _, rid in admitted[:16]]
    assert first.count("b") == 3 * first.count("a")


def test_an_idle_tenant_banks_no_credit():
    """a runs alone for a while; when b becomes active it is lifted to a's counter, so the two alternate
    instead of b taking every seat until it has caught up."""
    config = EngineConfig(max_num_seqs=1, max_num_batched_tokens=64, scheduling_policy="fair")
    sched = make_scheduler(config.for_model(512), 64)
    late = tenant_requests("b", 6, arrival=40.0)
    admitted = []
    for step in range(400):
        if step == 0:
            for r in tenant_requests("a", 12):
                sched.add_request(r)
        if step == 40:
            for r in late:
                sched.add_request(r)
            assert sched.virtual_counters["b"] == sched.virtual_counters["a"] > 0
        before = {r.request_id for r in sched.running}
        out = sched.schedule(now=float(step))
        admitted += [r.request_id for r in sched.running if r.request_id not in before and step >= 40]
        sched.update_from_output(out, StepResult({s.request_id: [7] for s in out.scheduled if s.needs_logits}),
                                 now=float(step))
    assert [rid[0] for rid in admitted[:8]] == list("babababa")


def test_a_late_tenant_is_admitted_when_the_first_seat_frees():
    """The bound: a newcomer is lifted to the lowest active counter and the running tenant is charged for
    every token it gets meanwhile, so the newcomer is the lowest at the next admission. A seat frees within
    the remaining prefill and output steps of a running request (no preemption here), so the wait is at
    most ceil(prompt_len / budget) + output_len steps."""
    prompt_len, output_len, budget = 24, 10, 16
    config = EngineConfig(max_num_seqs=3, max_num_batched_tokens=budget, scheduling_policy="fair")
    late = req("late", prompt_len, output_len, arrival=17.0, tenant="b")
    sched, admitted = drive(config, 256, {0: tenant_requests("a", 20, prompt_len, output_len), 17: [late]})
    assert 0 < late.first_scheduled_time - 17 <= math.ceil(prompt_len / budget) + output_len
    assert sched.waiting.__len__() == 0


@pytest.mark.parametrize("policy", ["fcfs", "priority", "fair"])
def test_a_tenant_cap_bounds_its_running_requests_under_every_policy(policy):
    """a's four requests come first, yet only one runs at a time; b's, queued behind them, are not held up
    by a's cap (they take the other three seats from the first step); a's keep their order."""
    config = EngineConfig(max_num_seqs=4, max_num_batched_tokens=64, scheduling_policy=policy,
                          tenant_max_num_seqs={"a": 1})
    sched = make_scheduler(config.for_model(512), 128)
    for r in tenant_requests("a", 4) + tenant_requests("b", 4):
        sched.add_request(r)
    most = {"a": 0, "b": 0}
    admitted = []
    for step in range(100):
        out = sched.schedule(now=float(step))
        admitted += [s.request_id for s in out.scheduled if s.num_computed_tokens == 0]
        for tenant in most:
            most[tenant] = max(most[tenant], sum(r.tenant == tenant for r in sched.running))
        sched.update_from_output(out, StepResult({s.request_id: [7] for s in out.scheduled if s.needs_logits}),
                                 now=float(step))
    assert most == {"a": 1, "b": 3} and not sched.has_unfinished_requests()
    assert [r for r in admitted if r.startswith("a")] == ["a0", "a1", "a2", "a3"]
    assert set(admitted[:4]) == {"a0", "b0", "b1", "b2"}
    assert not sched.num_running_by_tenant  # no entries left behind by tenants that came and went


def test_fair_groups_by_user_only_without_a_tenant_and_forgets_idle_groups():
    """Without a tenant, the client's `user` label is the fair policy's group: two users alternate as two
    tenants would. With a tenant, `user` is ignored. Groups that finished leave no state behind."""
    config = EngineConfig(max_num_seqs=1, max_num_batched_tokens=64, scheduling_policy="fair")
    u = [req(f"u{i}", 8, 2, user="u") for i in range(3)]
    v = [req(f"v{i}", 8, 2, arrival=0.5, user="v") for i in range(3)]
    sched, admitted = drive(config, 64, {0: u + v})
    assert [r for _, r in admitted] == ["u0", "v0", "u1", "v1", "u2", "v2"]
    assert not sched.num_running_by_group and not sched.num_unfinished_by_group and not sched.waiting._queues
    keyed = [req(f"k{i}", 8, 2, tenant="acme", user=f"user{i}") for i in range(2)]
    assert {r.group_key for r in keyed} == {"acme"}


def test_fair_forgets_idle_counters_the_lift_would_overtake():
    """Many one-off labels (each a group) come and go while a long request of "main" runs; their counters
    are dropped once they fall below the floor a returning group would be lifted to, so state stays small."""
    config = EngineConfig(max_num_seqs=2, max_num_batched_tokens=64, scheduling_policy="fair")
    arrivals = {0: [req("main", 4, 300, tenant="main")]}
    for i in range(100):
        arrivals.setdefault(1 + 3 * i, []).append(req(f"x{i}", 4, 1, arrival=1 + 3 * i, user=f"label-{i}"))
    sched, _ = drive(config, 256, arrivals)
    assert len(sched.virtual_counters) <= 3


def test_preemption_under_fair_takes_the_most_served_tenant():
    config = EngineConfig(block_size=4, max_num_seqs=4, max_num_batched_tokens=64, scheduling_policy="fair")
    b = tenant_requests("b", 1, prompt_len=4, max_tokens=40)
    a = tenant_requests("a", 1, prompt_len=8, max_tokens=40, arrival=0.5)
    drive(config, 14, {0: b + a})
    assert a[0].num_preemptions >= 1 and b[0].num_preemptions == 0  # a's longer prompt was charged


def test_a_remote_prefilled_request_is_counted_only_once_admitted():
    config = EngineConfig(max_num_seqs=1, max_num_batched_tokens=64, scheduling_policy="fair")
    sched = make_scheduler(config.for_model(512), 64)
    sched.add_request(req("a0", 8, 2, tenant="a"))
    sched.update_from_output(out := sched.schedule(0.0), StepResult({s.request_id: [7] for s in out.scheduled}), 0.0)
    assert sched.add_remote_prefilled_request(req("b0", 8, 2, tenant="b"), 7, now=1.0) is None  # no seat
    assert sched.num_unfinished_by_group["b"] == 0
    with pytest.raises(ValueError):
        sched.add_remote_prefilled_request(req("b1", 8, 2, tenant="b"), 8, now=1.0)  # all 8 tokens: too many
    assert sched.num_unfinished_by_group["b"] == 0
    sched.update_from_output(out := sched.schedule(1.0), StepResult({s.request_id: [7] for s in out.scheduled}), 1.0)
    assert sched.add_remote_prefilled_request(req("b2", 8, 2, tenant="b"), 7, now=2.0) is not None
    assert (sched.num_unfinished_by_group["b"], sched.num_running_by_group["b"]) == (1, 1)
    assert sched.virtual_counters["b"] == sched.virtual_counters["a"] + 1  # lifted, then charged one token


@pytest.mark.parametrize(("cap", "rows"), [(4, [4]), (6, [4, 2]), (None, [4, 4])])
def test_decode_batch_max_tokens_counts_draft_tokens(cap, rows):
    """Two decoding requests carry 3 drafts each (a verify row of 1 + 3 tokens). The cap counts tokens: at
    4 only the first row runs; at 6 the second runs with its drafts cut to 1; off, both run whole."""
    config = EngineConfig(max_num_batched_tokens=64, decode_batch_max_tokens=cap, speculative_method="ngram",
                          num_speculative_tokens=3, speculative_disable_by_batch_size=None)
    sched = make_scheduler(config.for_model(512), 64)
    for r in [req("A", 8, 20), req("B", 8, 20)]:
        sched.add_request(r)
    sched.update_from_output(out := sched.schedule(0.0), StepResult({s.request_id: [7] for s in out.scheduled}), 0.0)
    sched.update_draft_token_ids({"A": [1, 2, 3], "B": [1, 2, 3]})
    assert [s.num_scheduled_tokens for s in sched.schedule(1.0).scheduled] == rows


# ---- knobs ----

@pytest.mark.parametrize(("knobs", "named"), [
    (dict(scheduling_policy="lottery"), "scheduling_policy"),
    (dict(scheduling_policy="priority", scheduling="static"), "scheduling_policy"),
    (dict(scheduling_policy="fair", tenant_weights={"a": -1.0}), "tenant_weights"),
    (dict(scheduling_policy="fair", tenant_weights={"a": 0}), "tenant_weights"),
    (dict(scheduling_policy="fair", tenant_max_num_seqs={"a": 0}), "tenant_max_num_seqs"),
    (dict(tenant_weights={"a": 2.0}), "tenant_weights"),
    (dict(scheduling_policy="priority", tenant_weights={"a": 2.0}), "tenant_weights"),
    (dict(scheduling="static", tenant_max_num_seqs={"a": 2}), "tenant_max_num_seqs"),
    (dict(tenant_max_num_seqs={"a": 0}), "tenant_max_num_seqs"),
    (dict(long_prefill_token_threshold=600), "long_prefill_token_threshold"),
    (dict(prefill_budget_tokens=128, long_prefill_token_threshold=256), "long_prefill_token_threshold"),
    (dict(prefill_budget_tokens=1024), "prefill_budget_tokens"),
    (dict(max_num_partial_prefills=0), "max_num_partial_prefills"),
    (dict(decode_batch_max_tokens=-1), "decode_batch_max_tokens"),
    (dict(max_num_partial_prefills=2, enable_chunked_prefill=False, max_num_batched_tokens=4096),
     "max_num_partial_prefills"),
    (dict(decode_batch_max_tokens=8, scheduling="static"), "decode_batch_max_tokens"),
])
def test_bad_knob_values_name_the_knob(knobs, named):
    with pytest.raises(ValueError, match=named):
        EngineConfig(**knobs)


def test_tenant_tables_are_stored_as_sorted_pairs_and_the_config_stays_hashable():
    config = EngineConfig(scheduling_policy="fair", tenant_weights={"b": 3, "a": 1}, tenant_max_num_seqs={"a": 2})
    assert config.tenant_weights == (("a", 1), ("b", 3))
    assert config == config.replace(tenant_weights=[("a", 1), ("b", 3)]) and hash(config) == hash(config.replace())
    assert EngineConfig(long_prefill_token_threshold=0).long_prefill_token_threshold == 0  # vLLM's "off"


# ---- metrics ----

def finished(request_id: str, tenant: str | None, arrival: float, token_times: list[float], prompt_len: int = 4):
    r = req(request_id, prompt_len, len(token_times), arrival=arrival, tenant=tenant)
    r.first_scheduled_time = arrival
    for t in token_times:
        r.append_output_token(7, t)
    r.finish_time = token_times[-1]
    return r


def test_per_tenant_rows_jain_and_goodput():
    requests = [finished("0", "a", 0.0, [0.1, 0.2, 0.3]), finished("1", "b", 0.0, [0.5, 1.5, 2.5]),
                finished("2", None, 1.0, [1.05, 1.1])]
    m = RunMetrics.from_requests(requests, [])
    assert [row.request_id for row in m.requests] == ["0", "1", "2"] and m.requests[1].tenant == "b"
    assert set(m.per_tenant) == {"a", "b", "default"}
    assert m.per_tenant["b"].output_tokens == 3 and m.per_tenant["b"].last_finish_time == 2.5
    assert m.per_tenant["a"].mean_ttft_ms == pytest.approx(100.0)
    # Served by 0.3 (a's last finish): a 4 + 3, b 4 + 1 (prefill done at 0.5? no: nothing yet), default 0
    x = [7, 0, 0]
    assert m.jain_fairness() == pytest.approx(sum(x) ** 2 / (3 * sum(v * v for v in x)))
    assert m.jain_fairness({"a": 7.0}) == pytest.approx(1 / 3)
    # TTFT: 100, 500, 50 ms; TPOT: 100, 1000, 50 ms; duration 2.5 s
    assert m.slo_attainment(ttft_slo_ms=200) == pytest.approx(2 / 3)
    assert m.slo_attainment(ttft_slo_ms=200, tpot_slo_ms=60) == pytest.approx(1 / 3)
    assert m.goodput(ttft_slo_ms=600, tpot_slo_ms=200) == pytest.approx(2 / 2.5)
    assert "requests" not in m.to_dict() and "per_tenant" not in m.to_dict()
    assert all(isinstance(v, (int, float, tuple)) for v in m.to_dict().values())


# ---- workloads ----

def test_workloads_of_several_senders_add_up_in_arrival_order():
    a = Workload.synthetic(3, prompt_len=8, output_len=4, arrival=10.0, seed=1).with_tenant("a")
    b = Workload.synthetic(3, prompt_len=8, output_len=4, arrival=10.0, seed=2).with_tenant("b").with_priority(-1)
    both = a + b
    times = [r.arrival_time for r in both.requests]
    assert times == sorted(times) and len(both) == 6
    assert sorted((r.tenant, r.priority) for r in both.requests) == [("a", 0)] * 3 + [("b", -1)] * 3
    requests = both.make_requests(vocab_size=1000)
    assert [r.request_id for r in requests] == [str(i) for i in range(6)]
    assert [(r.tenant, r.priority) for r in requests] == [(w.tenant, w.priority) for w in both.requests]
    same_time = Workload.synthetic(2, 8, 4).with_tenant("x") + Workload.synthetic(2, 8, 4).with_tenant("y")
    assert [r.tenant for r in same_time.requests] == ["x", "x", "y", "y"]
