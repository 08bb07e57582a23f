"""Exercises of lesson 6, "The architecture map": E06.1 and E06.2.

Write the bodies below, then check them from the repository root:

    pytest tests/exercises/test_e06_architecture_map.py --impl=learner          # both exercises
    pytest tests/exercises/test_e06_architecture_map.py --impl=learner -k e06_2 # one

The tests check E06.1 against the lesson's own breakdown (`ttft_breakdown` in
course/architecture_map.py) on hand-made traces, and E06.2 against the shared scheduler run by
the simulator with fixed step times. Reference solutions: lessons/exercises/solutions/e06_architecture_map.py.

Lesson: lessons/06-architecture-map.md#exercises
"""

from __future__ import annotations

from typing import Any


def ttft_parts(events: list[dict[str, Any]], sent: float, first_chunk: float) -> dict[str, float]:
    """E06.1 (implement): split one streamed request's time to first token into four parts, in seconds.

    `events` is the request's timeline from GET /debug/trace/<id> (dicts with "event", "time", "attrs"; one
    prompt, so one engine request), `sent` when the client started sending, `first_chunk` when its first
    token chunk arrived (all on one clock). Return
      "front_end": from `sent` to the engine core's "queued" (network, API server, ZeroMQ);
      "queueing":  from "queued" to the first "scheduled";
      "prefill":   from the first "scheduled" to the "sampled" of the step that samples the first token: the
                   first step that reaches the prompt's end (its "scheduled" attrs num_computed_tokens +
                   num_tokens >= the prompt's length, which is "queued"'s attrs["num_prompt_tokens"]);
      "return":    from that "sampled" to `first_chunk` (detokenize, ZeroMQ back, SSE, network).
    The four add up to first_chunk - sent.

    Interview questions: Q-SYS-03 (lessons/interview-bank.md#q-sys-03).
    """
    raise NotImplementedError("E06.1: where did the time to first token go")


def first_step(k: int, max_num_seqs: int, output_len: int) -> int:
    """E06.2 (estimate), part a: the step (0-based) in which request k (0-based) of a burst first runs.

    All requests arrive together and are admitted first come, first served; each prompt fits in one step,
    each request produces exactly `output_len` tokens, and the KV cache never runs out (no preemption).

    Interview questions: Q-SCHED-04 (lessons/interview-bank.md#q-sched-04).
    """
    raise NotImplementedError("E06.2: the first step of the k-th request")


def queue_time(k: int, max_num_seqs: int, output_len: int, prefill_s: float, decode_s: float) -> float:
    """E06.2 (estimate), part b: how long request k of the same burst waits before its first step, when a step
    with a prefill in it takes `prefill_s` and a decode-only step `decode_s` seconds."""
    raise NotImplementedError("E06.2: the queue time of the k-th request")
