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

`RequestRecord` keeps each request's row (tenant, priority, timestamps, token counts, preemptions), from
which the scheduling-policy numbers come (lesson 3):
- `per_tenant`: each tenant's requests, output tokens, mean and p99 TTFT and E2EL, and last finish time;
- `jain_fairness(weights)`: Jain's index over weighted service, (sum x)^2 / (n * sum x^2) with
  x_i = service_i / weight_i, where a tenant's service is the tokens it was served (prompt tokens once its
  prefill is done, output tokens as produced) up to the first time a tenant finished all its work, the
  stretch in which every tenant still had work; 1 is perfectly fair, 1/n is one tenant served alone;
- `goodput(ttft_slo_ms, tpot_slo_ms)`, as DistServe (Zhong et al., OSDI'24) defines it: completed requests
  per second that met both latency SLOs; `slo_attainment` is the share of all requests that met them.
`to_dict` leaves the rows, the per-tenant table and the step log out: it stays a flat dict of numbers.

Two ways in, one set of formulas (`RunMetrics.from_rows`): `from_requests` reads kept requests and the step
log at the end of a run; a streamed run (core/metrics_stream.py) brings rows without token times, a
`StepTally` (the steps counted, not kept) and the summary of its inter-token gaps, counted rather than listed
(the same numbers as `latency_summary` of the listed gaps, to the last bit).

Lesson: lessons/01-continuous-batching.md (measuring a server); per-tenant numbers and goodput in
lessons/03-chunked-prefill-and-disaggregation.md#goodput.
"""

from __future__ import annotations

import math
import operator
from array import array
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from statistics import fmean, median

from core.interfaces import SchedulerOutput, StepResult
from core.request import DEFAULT_TENANT, Request, RequestStatus

# The latency histograms' buckets in seconds, from 1 ms to a few minutes (CPU steps are slower than vLLM's GPU
# ones): the server's /metrics (ref_engine/async_engine/prometheus.py) and a simulated run's dashboard replay
# (sim/dashboard_replay.py) count in the same buckets.
LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                   20.0, 40.0, 80.0, 160.0)


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
    request_ids: tuple[str, ...] = ()  # who ran, in the order of query_lens (request tracing, lesson 6)
    num_logit_rows: int | None = None  # rows the LM head ran on (SchedulerOutput.num_logit_rows); None: one per request

    @classmethod
    def from_output(cls, output: SchedulerOutput, start: float, duration: float,
                    result: StepResult | None = None) -> StepRecord:
        query_lens, context_lens = output.batch_shape
        verified = () if result is None else verifies(output, result)
        return cls(step_id=output.step_id, start=start, duration=duration, query_lens=query_lens,
                   context_lens=context_lens, kv_usage=output.kv_usage, num_live_tokens=output.num_live_tokens,
                   num_reserved_slots=output.num_reserved_slots, num_preempted=len(output.preempted_request_ids),
                   verified=verified, proposed=tuple(output.num_proposed_tokens.items()),
                   request_ids=tuple([s.request_id for s in output.scheduled]),
                   num_logit_rows=output.num_logit_rows)

    @property
    def num_tokens(self) -> int:
        return sum(self.query_lens)

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)


def verifies(output: SchedulerOutput, result: StepResult) -> tuple[tuple[str, int, int], ...]:
    """(request id, draft tokens, accepted drafts) for each request of the step that verified drafts."""
    return tuple([(s.request_id, s.num_draft_tokens, len(result.sampled_token_ids[s.request_id]) - 1)
                  for s in output.scheduled if s.num_draft_tokens and s.request_id in result.sampled_token_ids])


@dataclass(frozen=True, slots=True)  # slots: a streamed million-request run keeps a million rows
class RequestRecord:
    """One request's row: who sent it, when it moved, what it cost. Times on the run's clock, in seconds.
    A streamed run (core/metrics_stream.py) keeps no token times: `token_times` is None."""

    request_id: str
    tenant: str | None
    priority: int
    arrival_time: float
    first_scheduled_time: float | None
    first_token_time: float | None
    finish_time: float | None
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int
    num_preemptions: int
    finished: bool  # completed (False: aborted)
    token_times: tuple[float, ...] | None = field(default=(), repr=False)  # when each output token was produced

    @classmethod
    def from_request(cls, r: Request, keep_token_times: bool = True) -> RequestRecord:
        return cls(r.request_id, r.tenant, r.priority, r.arrival_time, r.first_scheduled_time, r.first_token_time,
                   r.finish_time, r.num_prompt_tokens, r.num_output_tokens, r.num_cached_tokens or 0,
                   r.num_preemptions, r.status in _COMPLETED, tuple(r.token_times) if keep_token_times else None)

    @property
    def tenant_key(self) -> str:
        return DEFAULT_TENANT if self.tenant is None else self.tenant

    @property
    def ttft(self) -> float:
        return self.first_token_time - self.arrival_time

    @property
    def e2el(self) -> float:
        return self.finish_time - self.arrival_time

    @property
    def tpot(self) -> float | None:
        """None for a one-token request, which has no time per output token."""
        if self.num_output_tokens < 2:
            return None
        return (self.finish_time - self.first_token_time) / (self.num_output_tokens - 1)

    def tokens_served_by(self, t: float) -> int:
        """Prompt tokens once the prefill is done (the first token is out), plus output tokens, by time t."""
        if self.token_times is None:
            raise ValueError(f"request {self.request_id!r}: a streamed run keeps no token times "
                             "(run with streaming off to count service over time)")
        if self.first_token_time is None or self.first_token_time > t:
            return 0
        return self.num_prompt_tokens + sum(1 for x in self.token_times if x <= t)


@dataclass(frozen=True)
class TenantStats:
    """One tenant's completed requests, summed up."""

    requests: int
    output_tokens: int
    mean_ttft_ms: float
    p99_ttft_ms: float
    mean_e2el_ms: float
    p99_e2el_ms: float
    last_finish_time: float


_COMPLETED = (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH)


def _percentile(values: list[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default), without numpy, so the core stays dependency-free."""
    return _sorted_percentile(sorted(values), q)


def _sorted_percentile(xs: list[float], q: float) -> float:
    """`_percentile` of values already sorted (a run's inter-token gaps are millions: sort them once)."""
    if not xs:
        return math.nan
    pos = (len(xs) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def latency_summary(prefix: str, values_s: list[float]) -> dict[str, float]:
    """`mean_/median_/p90_/p99_<prefix>_ms` of latencies given in seconds (vLLM bench serve's names)."""
    ms = sorted([v * 1000 for v in values_s])
    return {
        f"mean_{prefix}_ms": fmean(ms) if ms else math.nan,
        f"median_{prefix}_ms": median(ms) if ms else math.nan,  # sorting sorted values again is cheap
        f"p90_{prefix}_ms": _sorted_percentile(ms, 90),
        f"p99_{prefix}_ms": _sorted_percentile(ms, 99),
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
    requests: tuple[RequestRecord, ...] = field(default=(), repr=False)  # every request's row, in input order
    per_tenant: dict[str, TenantStats] = field(default_factory=dict, repr=False)  # completed; None: "default"

    @classmethod
    def from_requests(cls, requests: list[Request], steps: list[StepRecord], *, num_failed: int = 0,
                      duration: float | None = None) -> RunMetrics:
        """Aggregate finished requests (aborted ones count as failed) and the step log."""
        itl: list[float] = []
        for r in requests:  # each gap between consecutive tokens (map: millions of them in a long run)
            if r.status in _COMPLETED:
                itl += map(operator.sub, r.token_times[1:], r.token_times)
        num_aborted = sum(r.status is RequestStatus.FINISHED_ABORTED for r in requests)
        return cls.from_rows([RequestRecord.from_request(r) for r in requests], StepTally.of(steps),
                             latency_summary("itl", itl), num_failed=num_failed + num_aborted, duration=duration,
                             steps_kept=steps)

    @classmethod
    def from_rows(cls, rows: Sequence[RequestRecord], steps: StepTally, itl: Mapping[str, float], *,
                  num_failed: int = 0, duration: float | None = None,
                  steps_kept: list[StepRecord] | None = None) -> RunMetrics:
        """Aggregate request rows, counted steps and the ITL summary (`latency_summary("itl", ...)` or its
        counted form): what a kept run (`from_requests`) and a streamed one (core/metrics_stream.py) share.
        `num_failed` counts every request that did not complete; `steps_kept` is the step log, if kept."""
        done = [row for row in rows if row.finished]
        if duration is None:
            duration = (max(r.finish_time for r in done) - min(r.arrival_time for r in rows)) if done else 0.0
        ttft = [r.first_token_time - r.arrival_time for r in done]
        e2el = [r.finish_time - r.arrival_time for r in done]
        tpot = [(r.finish_time - r.first_token_time) / (r.num_output_tokens - 1)
                for r in done if r.num_output_tokens > 1]
        queue = [r.first_scheduled_time - r.arrival_time for r in done]
        n_in = sum(r.num_prompt_tokens for r in done)
        n_out = sum(r.num_output_tokens for r in done)
        per_s = (lambda x: x / duration) if duration > 0 else (lambda x: math.nan)
        hits = sum(r.num_cached_tokens for r in done)
        return cls(
            completed=len(done), failed=num_failed, duration=duration,
            total_input_tokens=n_in, total_output_tokens=n_out,
            request_throughput=per_s(len(done)), output_throughput=per_s(n_out),
            total_token_throughput=per_s(n_in + n_out),
            **latency_summary("ttft", ttft), **latency_summary("tpot", tpot), **itl,
            **latency_summary("e2el", e2el),
            mean_queue_ms=fmean(queue) * 1000 if queue else math.nan,
            num_preemptions=sum(r.num_preemptions for r in rows),
            num_steps=steps.num_steps,
            mean_kv_usage=fmean(steps.kv_usage) if steps.kv_usage else 0.0,
            max_kv_usage=max(steps.kv_usage, default=0.0),
            prefix_cache_queries=n_in, prefix_cache_hits=hits,
            prefix_cache_hit_rate=hits / n_in if n_in else 0.0,
            steps=[] if steps_kept is None else steps_kept,
            **_spec_decode_counts(steps.verified),
            requests=tuple(rows),
            per_tenant=_per_tenant(done),
        )

    def to_dict(self) -> dict[str, float | int]:
        """The scalar fields (the step log, request rows and per-tenant table left out), for tables and JSON."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _NOT_SCALAR}

    def tenant_service(self) -> dict[str, int]:
        """Tokens served to each tenant while every tenant still had work (until the first one's last
        request finished): the window `jain_fairness` judges."""
        until = min(stats.last_finish_time for stats in self.per_tenant.values())
        service = dict.fromkeys(self.per_tenant, 0)
        for row in self.requests:
            tenant = DEFAULT_TENANT if row.tenant is None else row.tenant
            if tenant in service:
                service[tenant] += row.tokens_served_by(until)
        return service

    def jain_fairness(self, weights: Mapping[str, float] | Iterable[tuple[str, float]] | None = None) -> float:
        """Jain's index over the tenants' weighted service (module docstring); `weights` as
        `EngineConfig.tenant_weights` (missing tenants weigh 1); nan with no completed request."""
        weights = dict(weights or ())
        if not self.per_tenant:
            return math.nan
        x = [s / weights.get(tenant, 1.0) for tenant, s in self.tenant_service().items()]
        return sum(x) ** 2 / (len(x) * sum(v * v for v in x))

    def slo_attainment(self, ttft_slo_ms: float | None = None, tpot_slo_ms: float | None = None) -> float:
        """The share of all requests (failed ones included, as misses) that completed within both SLOs;
        an SLO left None holds for every request, and so does the TPOT SLO for a one-token request."""
        total = self.completed + self.failed
        return self._num_within_slo(ttft_slo_ms, tpot_slo_ms) / total if total else math.nan

    def goodput(self, ttft_slo_ms: float | None = None, tpot_slo_ms: float | None = None) -> float:
        """Requests per second that completed within both SLOs (DistServe's goodput)."""
        if self.duration <= 0:
            return math.nan
        return self._num_within_slo(ttft_slo_ms, tpot_slo_ms) / self.duration

    def _num_within_slo(self, ttft_slo_ms: float | None, tpot_slo_ms: float | None) -> int:
        ttft_s = math.inf if ttft_slo_ms is None else ttft_slo_ms / 1000
        tpot_s = math.inf if tpot_slo_ms is None else tpot_slo_ms / 1000
        return sum(1 for row in self.requests
                   if row.finished and row.ttft <= ttft_s and (row.tpot is None or row.tpot <= tpot_s))


_NOT_SCALAR = frozenset({"steps", "requests", "per_tenant"})


def _per_tenant(done: list[RequestRecord]) -> dict[str, TenantStats]:
    by_tenant: dict[str, list[RequestRecord]] = {}
    for r in done:
        by_tenant.setdefault(r.tenant_key, []).append(r)
    table = {}
    for tenant, rs in by_tenant.items():
        ttft = [(r.first_token_time - r.arrival_time) * 1000 for r in rs]
        e2el = [(r.finish_time - r.arrival_time) * 1000 for r in rs]
        table[tenant] = TenantStats(
            requests=len(rs), output_tokens=sum(r.num_output_tokens for r in rs), mean_ttft_ms=fmean(ttft),
            p99_ttft_ms=_percentile(ttft, 99), mean_e2el_ms=fmean(e2el), p99_e2el_ms=_percentile(e2el, 99),
            last_finish_time=max(r.finish_time for r in rs))
    return table


@dataclass
class StepTally:
    """What `RunMetrics` reads from a run's steps, counted rather than kept: how many, each step's KV usage
    (8 bytes a step, for an exact mean), and how many verifies drafted d tokens and accepted a."""

    num_steps: int = 0
    kv_usage: array = field(default_factory=lambda: array("d"))
    verified: Counter[tuple[int, int]] = field(default_factory=Counter)  # (drafted, accepted) -> verifies

    @classmethod
    def of(cls, steps: Iterable[StepRecord]) -> StepTally:
        tally = cls()
        for step in steps:
            tally.add(step.kv_usage, [(drafted, accepted) for _, drafted, accepted in step.verified])
        return tally

    def add(self, kv_usage: float, verified: Iterable[tuple[int, int]] = ()) -> None:
        self.num_steps += 1
        self.kv_usage.append(kv_usage)
        self.verified.update(verified)

    def merge(self, other: StepTally) -> None:
        """Count `other`'s steps too (a fleet's replicas into one run)."""
        self.num_steps += other.num_steps
        self.kv_usage.extend(other.kv_usage)
        self.verified.update(other.verified)


def spec_decode_counts(steps: list[StepRecord]) -> dict[str, object]:
    """The speculative-decoding counts of these steps' verifies (the `RunMetrics` fields of the same names);
    empty when no step verified drafts."""
    return _spec_decode_counts(StepTally.of(steps).verified)


def _spec_decode_counts(verified: Counter[tuple[int, int]]) -> dict[str, object]:
    if not verified:
        return {}
    num_drafts = sum(verified.values())
    drafted = sum(d * n for (d, _), n in verified.items())
    accepted = sum(a * n for (_, a), n in verified.items())
    by_position = tuple(sum(n for (d, a), n in verified.items() if d > i and a > i)
                        / sum(n for (d, _), n in verified.items() if d > i)
                        for i in range(max(d for d, _ in verified)))
    return dict(num_drafts=num_drafts, num_draft_tokens=drafted, num_accepted_tokens=accepted,
                draft_acceptance_rate=accepted / drafted, mean_acceptance_length=1 + accepted / num_drafts,
                acceptance_by_position=by_position)


def relative_error(simulated: float, measured: float) -> float:
    """(simulated - measured) / measured, in percent: the error column every lesson prints."""
    if measured == 0 or math.isnan(measured) or math.isnan(simulated):
        return math.nan
    return 100.0 * (simulated - measured) / measured
