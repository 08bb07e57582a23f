"""Exercises of lesson 6, "The architecture map": E06.1 to E06.4.

Write the bodies below, then check them from the repository root:

    pytest tests/exercises/test_e06_architecture_map.py --impl=learner          # all four exercises
    pytest tests/exercises/test_e06_architecture_map.py --impl=learner -k e06_2 # one

The tests check E06.1 against the lesson's own breakdown (`ttft_breakdown` in
course/architecture_map.py) on hand-made traces, E06.2 against the shared scheduler run by
the simulator with fixed step times, E06.3 against the engine's own `LlamaMLP` (ref_engine/model/llama.py)
loaded with the same weights, and E06.4 on traces the simulator records with fixed step times, each slow for
a known reason. Reference solutions: lessons/exercises/solutions/e06_architecture_map.py.

Lesson: lessons/06-architecture-map.md#exercises
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # E06.3 works on torch tensors; the other exercises need no torch
    import torch


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


def shard_range(size: int, rank: int, tp_size: int) -> tuple[int, int]:
    """E06.3 (implement), part a: the features `[start, end)` that `rank` of `tp_size` ranks holds, out of `size`.

    As even as possible, in rank order, and when `tp_size` does not divide `size` the first `size % tp_size`
    ranks hold one feature more (the rule of `torch.tensor_split`): SmolLM2's 1,536 MLP features over 9
    ranks are 6 slices of 171 and 3 of 170.

    Interview questions: Q-PAR-04 (lessons/interview-bank.md#q-par-04).
    """
    raise NotImplementedError("E06.3: the features one rank holds")


def shard_mlp(gate_proj: torch.Tensor, up_proj: torch.Tensor, down_proj: torch.Tensor, rank: int,
              tp_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """E06.3 (implement), part b: one rank's share of a Llama MLP's three weights.

    The weights come as Hugging Face stores them, `[out_features, in_features]`: `gate_proj` and `up_proj`
    are `[intermediate, hidden]`, `down_proj` is `[hidden, intermediate]`. Return (gate, up, down) of `rank`:
    gate and up column-parallel (the rank's intermediate features, rows `shard_range` of each), down
    row-parallel (the same features, now its input columns). Slices, not copies, are fine.
    """
    raise NotImplementedError("E06.3: one rank's shard of the MLP")


def rank_mlp(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """E06.3 (implement), part c: what one rank computes from its shard: `x` `[tokens, hidden]` through its
    gate and up columns, SwiGLU (`silu(gate) * up`) on its own features, then its rows of down.

    The result is `[tokens, hidden]`, and it is only a partial sum: the rank saw a slice of the features.
    """
    raise NotImplementedError("E06.3: one rank's partial output")


def tensor_parallel_mlp(x: torch.Tensor, gate_proj: torch.Tensor, up_proj: torch.Tensor, down_proj: torch.Tensor,
                        tp_size: int) -> torch.Tensor:
    """E06.3 (implement), part d: the MLP over `tp_size` simulated ranks, no processes: shard the weights,
    run every rank's partial output and add them up, which is what the all-reduce after down_proj does.

    The test compares the result with the engine's unsplit `LlamaMLP` given the same weights, within a
    stated float tolerance (the ranks add in another order than one matrix product does).
    """
    raise NotImplementedError("E06.3: the MLP split over tp_size ranks")


def diagnose(trace: dict[str, Any]) -> dict[str, Any]:
    """E06.4 (implement): say why time to first token is slow in a recorded trace, and show the evidence.

    `trace` is one engine core's record of a run (times in seconds, on one clock):
      "config":     {"max_num_seqs": int, "max_num_batched_tokens": int, "enable_chunked_prefill": bool};
      "ttft_slo_s": the TTFT target;
      "requests":   one dict per request, in arrival order: "request_id", "num_prompt_tokens", "queued" (it
                    reached the scheduler's queue), "scheduled" (its first step started), "first_token";
      "steps":      one dict per engine step, in order: "step" (its id), "start", "end", and "tokens", the
                    tokens each request ran in it ({request_id: n}; 1 for a decode, more for a prompt chunk).
    A request is slow when first_token - queued > ttft_slo_s. Return {"cause": ..., "requests": the slow
    requests' ids in trace order, "steps": the evidence, step ids in ascending order}, the cause being
      "long_prefill": a step that ran a prompt chunk (more than one token of a request) took longer than the
                      SLO on its own, and slow requests waited through it: any request whose TTFT overlaps
                      that step (it started before the request's first token and ended after it was queued)
                      cannot make the SLO. Evidence: every such step that a slow request's TTFT overlaps;
      "max_num_seqs": no such step, but the slow requests queued for a seat: evidence, every step that started
                      while a slow request was queued (queued <= start < scheduled), and every one of them
                      ran `max_num_seqs` requests, so no seat was free;
      None:           neither explains it, or nothing is slow; then "steps" is [].

    Interview questions: Q-METRIC-04 (lessons/interview-bank.md#q-metric-04).
    """
    raise NotImplementedError("E06.4: diagnose a slow-TTFT trace")
