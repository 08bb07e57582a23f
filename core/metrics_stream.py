"""`MetricsStream`: one engine's `RunMetrics`, gathered while it runs, without keeping its requests and steps.

A kept run holds every `Request` (prompt ids, hash chain, token times) and a `StepRecord` per step until
`RunMetrics.from_requests` reads them at the end: ~100 KB a request on a chat trace, so a million requests
need ~100 GB. A stream keeps instead
- a `RequestRecord` per request, without token times, written when the request finishes (the `Request`
  itself can then go);
- per step, its end time and KV usage (16 bytes) and its verifies' counts (`StepTally`);
- every inter-token gap, counted without being listed (`InterTokenGaps`).
`metrics()` gives the `RunMetrics` the kept run gives, field for field, to the last bit: the same rows and the
same gaps feed the same formulas. What it leaves out: the step log (empty) and the rows' token times, so
service over time (`RunMetrics.tenant_service`, `jain_fairness`) and a dashboard replay need a kept run.

Lesson: lessons/07-tuning-knobs.md#from-one-replica-to-a-fleet (fleets, up to a million requests).
"""

from __future__ import annotations

import bisect
import itertools
import math
import operator
from array import array
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence

from core.metrics import RequestRecord, RunMetrics, StepTally
from core.request import Request


class InterTokenGaps:
    """Every gap between consecutive tokens of one engine's completed requests, counted exactly in memory
    that grows with the engine's steps (16 bytes each), not with the tokens.

    A running request gets one token per step, so its gaps are, nearly always, the engine's step-to-step
    intervals over one run of consecutive steps: it is counted as that range, +1 where the run starts and
    -1 past its end in a difference array over the steps, whatever its length. A request whose tokens do
    not line up with consecutive steps (preempted, paused behind a chunked prefill, or given several tokens
    in one step by speculation) has its gaps counted one by one."""

    def __init__(self) -> None:
        self.step_ends = array("d")  # each step's end: when its tokens were produced
        self._edges = array("q", [0])  # the difference array: one more entry than steps
        self._others: Counter[float] = Counter()

    def step(self, end: float) -> None:
        self.step_ends.append(end)
        self._edges.append(0)

    def add(self, token_times: Sequence[float]) -> None:
        """Count a request's gaps, right after the step that produced its last token."""
        n = len(token_times)
        if n < 2:
            return
        last = len(self.step_ends) - 1
        first = last - (n - 1)
        if first >= 0 and self.step_ends[first:] == array("d", token_times):  # one token in each step of a run
            self._edges[first + 1] += 1
            self._edges[last + 1] -= 1
        else:
            self._others.update(map(operator.sub, token_times[1:], token_times))

    def counted(self) -> tuple[array, array]:
        """Each gap (the same float subtraction a kept run does) and how many times it occurs, as two arrays
        (the iterators run in C: a million-request run has millions of steps)."""
        ends = self.step_ends
        in_runs = array("q", itertools.accumulate(self._edges[1:len(ends)]))  # requests decoding at step k >= 1
        gaps = array("d", itertools.compress(map(operator.sub, ends[1:], ends), in_runs))
        counts = array("q", itertools.compress(in_runs, in_runs))
        gaps.extend(self._others.keys())
        counts.extend(self._others.values())
        return gaps, counts


def counted_latency_summary(prefix: str, values_s: array, counts: array) -> dict[str, float]:
    """`latency_summary` (core/metrics.py) of latencies in seconds, given as values and how many times each
    occurs: the same numbers to the last bit, without a list of every value or a sort of all of them."""
    ms = array("d", map(operator.mul, values_s, itertools.repeat(1000.0)))  # as `latency_summary` scales
    n = sum(counts)
    if not n:
        return {f"{stat}_{prefix}_ms": math.nan for stat in ("mean", "median", "p90", "p99")}
    lo90, lo99 = math.floor((n - 1) * 0.9), math.floor((n - 1) * 0.99)
    at = values_at(ms, counts, {n // 2 - (n % 2 == 0), n // 2, lo90, min(lo90 + 1, n - 1), lo99,
                                min(lo99 + 1, n - 1)})

    def percentile(q: float) -> float:  # metrics._sorted_percentile, on the values at ranks
        pos = (n - 1) * q / 100
        lo = math.floor(pos)
        return at[lo] + (at[min(lo + 1, n - 1)] - at[lo]) * (pos - lo)

    return {  # fsum of every value repeated: exactly what fmean sums
        f"mean_{prefix}_ms": math.fsum(itertools.chain.from_iterable(map(itertools.repeat, ms, counts))) / n,
        f"median_{prefix}_ms": at[n // 2] if n % 2 else (at[n // 2 - 1] + at[n // 2]) / 2,  # statistics.median
        f"p90_{prefix}_ms": percentile(90),
        f"p99_{prefix}_ms": percentile(99),
    }


def values_at(values: array, counts: array, ranks: set[int]) -> dict[int, float]:
    """The value at each rank (from 0) of the sorted multiset, value i repeated counts[i] times (values >= 0).

    Exact, without sorting it all: a histogram by each value's leading 24 bits (a float >= 0 orders as its
    bits do) finds the bucket that holds each rank, and only the values of those buckets are sorted."""
    bits = array("q", values.tobytes())

    def buckets() -> Iterator[int]:  # made twice rather than kept: millions of ints
        return map(operator.rshift, bits, itertools.repeat(40))

    histogram: dict[int, int] = {}
    for bucket, count in zip(buckets(), counts):
        histogram[bucket] = histogram.get(bucket, 0) + count
    keys = sorted(histogram)
    ends = list(itertools.accumulate(histogram[k] for k in keys))  # how many values fall in buckets <= keys[i]
    bucket_of = {rank: keys[bisect.bisect_right(ends, rank)] for rank in ranks}
    chosen = bytes(map(set(bucket_of.values()).__contains__, buckets()))
    pairs = sorted(zip(itertools.compress(values, chosen), itertools.compress(counts, chosen)))
    pair_ends = list(itertools.accumulate(count for _, count in pairs))
    skipped, kept = {}, 0  # per chosen bucket: the values below it that were not chosen
    for key, end in zip(keys, ends):
        if key in bucket_of.values():
            skipped[key] = end - histogram[key] - kept
            kept += histogram[key]
    return {rank: pairs[bisect.bisect_right(pair_ends, rank - skipped[bucket_of[rank]])][0] for rank in ranks}


class MetricsStream:
    """One engine's run as it goes: `admitted`, `step` and `finished` as they happen, `metrics()` at the end."""

    def __init__(self) -> None:
        self.rows: list[RequestRecord | None] = []  # in order of admission, as a kept run lists requests
        self.steps = StepTally()
        self.gaps = InterTokenGaps()
        self._slots: dict[str, int] = {}  # request id -> its row, while it runs

    def admitted(self, request: Request) -> None:
        self._slots[request.request_id] = len(self.rows)
        self.rows.append(None)

    def step(self, end: float, kv_usage: float, verified: Iterable[tuple[int, int]] = ()) -> None:
        """A step that ended at `end`; `verified`: its (drafted, accepted) per verify."""
        self.steps.add(kv_usage, verified)
        self.gaps.step(end)

    def finished(self, request: Request) -> None:
        row = RequestRecord.from_request(request, keep_token_times=False)
        self.rows[self._slots.pop(request.request_id)] = row
        if row.finished:  # completed, as a kept run counts its gaps
            self.gaps.add(request.token_times)

    def metrics(self, num_failed: int = 0) -> RunMetrics:
        return combined_metrics([self], [self], num_failed)


def combined_metrics(row_streams: Sequence[MetricsStream], step_streams: Sequence[MetricsStream],
                     num_failed: int = 0) -> RunMetrics:
    """`RunMetrics` over the requests of `row_streams` (in their order) and the steps of `step_streams`: one
    engine, or a fleet's end-to-end requests and all its replicas' steps. Every request must have finished."""
    rows = [row for stream in row_streams for row in stream.rows if row is not None]
    if len(rows) < sum(len(stream.rows) for stream in row_streams):
        raise ValueError("a request of the stream has not finished")
    steps = StepTally()
    for stream in step_streams:
        steps.merge(stream.steps)
    gaps, counts = array("d"), array("q")
    for stream in row_streams:
        stream_gaps, stream_counts = stream.gaps.counted()
        gaps.extend(stream_gaps)
        counts.extend(stream_counts)
    aborted = sum(not row.finished for row in rows)
    return RunMetrics.from_rows(rows, steps, counted_latency_summary("itl", gaps, counts),
                                num_failed=num_failed + aborted)
