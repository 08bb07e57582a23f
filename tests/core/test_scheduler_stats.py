"""`Scheduler.make_stats`: the queues, the pool and the preemption totals a server's /metrics shows, kept by
the scheduler itself as requests are preempted, resume, finish or are aborted."""

from __future__ import annotations

from core import EngineConfig, Request, StepResult, make_scheduler


def step(sched, now: float) -> None:
    out = sched.schedule(now)
    sched.update_from_output(out, StepResult({s.request_id: [7] for s in out.scheduled if s.needs_logits}), now)


def test_preemption_totals_count_events_and_requests_and_the_waiting_gauge_follows_them():
    # two 4-token prompts (one block each) that grow to 12 tokens (3 blocks) in a pool of 4 blocks
    sched = make_scheduler(EngineConfig(block_size=4, max_model_len=64), num_kv_blocks=4)
    for request_id in ("a", "b"):
        sched.add_request(Request(request_id, [1, 2, 3, 4], max_tokens=8))
    stats = sched.make_stats()
    assert (stats.num_running_reqs, stats.num_waiting_reqs, stats.num_unfinished_requests) == (0, 2, 2)
    assert (stats.num_kv_blocks, stats.num_free_blocks, stats.kv_cache_usage) == (4, 4, 0.0)

    seen = []
    for t in range(40):
        step(sched, float(t))
        seen.append(sched.make_stats())
        if not sched.has_unfinished_requests():
            break
    first = next(i for i, s in enumerate(seen) if s.num_preemptions)
    assert (seen[first].num_preemptions, seen[first].num_preempted_reqs, seen[first].num_waiting_preempted_reqs) \
        == (1, 1, 1)
    assert seen[first].num_running_reqs == 1 and seen[first].num_waiting_reqs == 1
    last = seen[-1]
    assert last.num_preemptions >= last.num_preempted_reqs >= 1
    assert last.num_waiting_preempted_reqs == 0 and last.num_unfinished_requests == 0
    assert last.num_free_blocks == 4 and last.kv_cache_usage == 0.0
    assert [s.num_preemptions for s in seen] == sorted(s.num_preemptions for s in seen)  # running totals


def test_an_aborted_preempted_request_leaves_the_waiting_gauge():
    sched = make_scheduler(EngineConfig(block_size=4, max_model_len=64), num_kv_blocks=4)
    for request_id in ("a", "b"):
        sched.add_request(Request(request_id, [1, 2, 3, 4], max_tokens=8))
    t = 0.0
    while not sched.make_stats().num_waiting_preempted_reqs:
        step(sched, t)
        t += 1
    (preempted,) = [r for r in ("a", "b") if sched.get_request(r).num_preemptions]
    sched.abort_request(preempted, t)
    stats = sched.make_stats()
    assert (stats.num_waiting_preempted_reqs, stats.num_preempted_reqs, stats.num_waiting_reqs) == (0, 1, 0)
