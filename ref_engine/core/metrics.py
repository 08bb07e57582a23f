"""`RunMetrics`: one definition of serving performance, filled by the engine and the simulator alike.

Field names follow `vllm bench serve`'s result JSON (`output_throughput`, `mean_ttft_ms`, `p99_itl_ms`, ...)
so numbers from a real vLLM run can sit in the same table. Definitions, per request:
- TTFT (time to first token) = first token time - arrival time (queueing + prefill);
- TPOT (time per output token) = (e2e latency - TTFT) / (output tokens - 1), for requests with 2+ tokens;
- ITL (inter-token latency): every gap between consecutive tokens of a request, pooled over requests;
- E2EL = finish time - arrival time; queue time = first scheduled time - arrival time.
Throughputs divide by the run's duration: first arrival to last finish.
Prefix caching is counted in prompt tokens, as vLLM's `prefix_cache_queries`/`prefix_cache_hits`: a
request's prompt tokens are queries, its `num_cached_tokens` (the hit at its first scheduling) are hits.

`StepRecord` is one executed step (its batch shape and duration): what calibration fits and what timeline
plots draw. Its `proposed` entries record the drafts each request brought to the step, and its `verified`
entries, (request id, draft tokens, accepted drafts) for each request that verified drafts, give the
speculative-decoding counts (lesson 5): tokens drafted and accepted, the mean acceptance length (tokens a
verify step emits: accepted + 1) and the acceptance rate by draft position.

Lesson: lessons/01-continuous-batching.md (measuring a server).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from statistics import fmean, median

from ref_engine.core.interfaces import SchedulerOutput, StepResult
from ref_engine.core.request import Request, RequestStatus


@dataclass(frozen=True)
class StepRecord:
    step_id: int
    start: float
    duration: float
    query_lens: tuple[int, ...]
    context_lens: tuple[int, ...]
    kv_usage: float
    num_live_tokens: int
    num_reserved_slots: int
    num_preempted: int
    verified: tuple[tuple[str, int, int], ...] = ()  # (request id, draft tokens, accepted drafts) per verify
    proposed: tuple[tuple[str, int], ...] = ()  # (request id, drafts brought to the step), for replays

    @classmethod
    def from_output(cls, output: SchedulerOutput, start: float, duration: float,
                    result: StepResult | None = None) -> StepRecord:
        query_lens, context_lens = output.batch_shape
        verified = () if result is None else tuple(
            (s.request_id, s.num_draft_tokens, len(result.sampled_token_ids[s.request_id]) - 1)
            for s in output.scheduled if s.num_draft_tokens and s.request_id in result.sampled_token_ids)
        return cls(step_id=output.step_id, start=start, duration=duration, query_lens=query_lens,
                   context_lens=context_lens, kv_usage=output.kv_usage, num_live_tokens=output.num_live_tokens,
                   num_reserved_slots=output.num_reserved_slots, num_preempted=len(output.preempted_request_ids),
                   verified=verified, proposed=tuple(output.num_proposed_tokens.items()))

    @property
    def num_tokens(self) -> int:
        return sum(self.query_lens)

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)


def _percentile(values: list[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default), without numpy, so the core stays dependency-free."""
    if not values:
        return math.nan
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _summary(prefix: str, values_s: list[float]) -> dict[str, float]:
    ms = [v * 1000 for v in values_s]
    return {
        f"mean_{prefix}_ms": fmean(ms) if ms else math.nan,
        f"median_{prefix}_ms": median(ms) if ms else math.nan,
        f"p90_{prefix}_ms": _percentile(ms, 90),
        f"p99_{prefix}_ms": _percentile(ms, 99),
    }


@dataclass
class RunMetrics:
    completed: int
    failed: int  # refused at admission or aborted
    duration: float
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    mean_ttft_ms: float
    median_ttft_ms: float
    p90_ttft_ms: float
    p99_ttft_ms: float
    mean_tpot_ms: float
    median_tpot_ms: float
    p90_tpot_ms: float
    p99_tpot_ms: float
    mean_itl_ms: float
    median_itl_ms: float
    p90_itl_ms: float
    p99_itl_ms: float
    mean_e2el_ms: float
    median_e2el_ms: float
    p90_e2el_ms: float
    p99_e2el_ms: float
    mean_queue_ms: float
    num_preemptions: int
    num_steps: int
    mean_kv_usage: float
    max_kv_usage: float
    prefix_cache_queries: int
    prefix_cache_hits: int
    prefix_cache_hit_rate: float  # hits / queries
    steps: list[StepRecord] = field(default_factory=list, repr=False)
    # speculative decoding (vLLM's spec-decode metrics); a "draft" is one request's drafts in one step
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    draft_acceptance_rate: float = math.nan  # accepted / drafted tokens
    mean_acceptance_length: float = math.nan  # tokens a verify emits: 1 + accepted per draft
    acceptance_by_position: tuple[float, ...] = ()  # [i]: of drafts with an (i+1)-th token, share accepting it

    @classmethod
    def from_requests(cls, requests: list[Request], steps: list[StepRecord], *, num_failed: int = 0,
                      duration: float | None = None) -> RunMetrics:
        """Aggregate finished requests (aborted ones count as failed) and the step log."""
        done = [r for r in requests if r.status in (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH)]
        failed = num_failed + sum(r.status is RequestStatus.FINISHED_ABORTED for r in requests)
        if duration is None:
            duration = (max(r.finish_time for r in done) - min(r.arrival_time for r in requests)) if done else 0.0
        ttft = [r.first_token_time - r.arrival_time for r in done]
        e2el = [r.finish_time - r.arrival_time for r in done]
        tpot = [(r.finish_time - r.first_token_time) / (r.num_output_tokens - 1)
                for r in done if r.num_output_tokens > 1]
        itl = [b - a for r in done for a, b in zip(r.token_times, r.token_times[1:])]
        queue = [r.first_scheduled_time - r.arrival_time for r in done]
        n_in = sum(r.num_prompt_tokens for r in done)
        n_out = sum(r.num_output_tokens for r in done)
        per_s = (lambda x: x / duration) if duration > 0 else (lambda x: math.nan)
        usage = [s.kv_usage for s in steps]
        hits = sum(r.num_cached_tokens or 0 for r in done)
        return cls(
            completed=len(done), failed=failed, duration=duration,
            total_input_tokens=n_in, total_output_tokens=n_out,
            request_throughput=per_s(len(done)), output_throughput=per_s(n_out),
            total_token_throughput=per_s(n_in + n_out),
            **_summary("ttft", ttft), **_summary("tpot", tpot), **_summary("itl", itl),
            **_summary("e2el", e2el),
            mean_queue_ms=fmean(queue) * 1000 if queue else math.nan,
            num_preemptions=sum(r.num_preemptions for r in requests),
            num_steps=len(steps),
            mean_kv_usage=fmean(usage) if usage else 0.0,
            max_kv_usage=max(usage, default=0.0),
            prefix_cache_queries=n_in, prefix_cache_hits=hits,
            prefix_cache_hit_rate=hits / n_in if n_in else 0.0,
            steps=steps,
            **_spec_decode_counts(steps),
        )

    def to_dict(self) -> dict[str, float | int]:
        """The scalar fields (the step log left out), for tables and JSON."""
        d = asdict(self)
        del d["steps"]
        return d


def _spec_decode_counts(steps: list[StepRecord]) -> dict[str, object]:
    verified = [(drafted, accepted) for s in steps for _, drafted, accepted in s.verified]
    if not verified:
        return {}
    drafted = sum(d for d, _ in verified)
    accepted = sum(a for _, a in verified)
    by_position = tuple(sum(a > i for d, a in verified if d > i) / sum(d > i for d, _ in verified)
                        for i in range(max(d for d, _ in verified)))
    return dict(num_drafts=len(verified), num_draft_tokens=drafted, num_accepted_tokens=accepted,
                draft_acceptance_rate=accepted / drafted, mean_acceptance_length=1 + accepted / len(verified),
                acceptance_by_position=by_position)


def relative_error(simulated: float, measured: float) -> float:
    """(simulated - measured) / measured, in percent: the error column every lesson prints."""
    if measured == 0 or math.isnan(measured) or math.isnan(simulated):
        return math.nan
    return 100.0 * (simulated - measured) / measured
