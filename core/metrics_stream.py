"""`MetricsStream`: one engine's `RunMetrics`, gathered while it runs, without keeping its requests and steps.

A kept run holds every `Request` (prompt ids, hash chain, token times) and a `StepRecord` per step until
`RunMetrics.from_requests` reads them at the end: ~100 KB a request on a chat trace, so a million requests
need ~100 GB. A stream keeps instead
- a `RequestRecord` per request, without token times, written when the request finishes (the `Request`
  itself can then go);
- per step, its end time and KV usage (16 bytes) and its verifies' counts (`StepTally`);
- every inter-token gap, counted without being listed (`InterTokenGaps`).
`metrics()` gives the `RunMetrics` the kept run gives, field for field (an empty step log apart), to the
last bit: the same rows and the same gaps feed the same formulas.

Lesson: lessons/07-tuning-knobs.md#from-one-replica-to-a-fleet (fleets, up to a million requests).
"""

from __future__ import annotations

import operator
from array import array
from collections import Counter
from collections.abc import Iterable, Sequence

from core.metrics import RequestRecord, RunMetrics, StepTally, counted_latency_summary
from core.request import Request, RequestStatus


class InterTokenGaps:
    """Every gap between consecutive tokens of one engine's completed requests, counted exactly in memory
    that grows with the engine's steps (8 bytes each), not with the tokens.

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

    def counts(self) -> Counter[float]:
        """gap -> how many times it occurs (the same float subtraction a kept run does)."""
        counts = Counter(self._others)
        ends, in_runs = self.step_ends, 0
        for k in range(1, len(ends)):
            in_runs += self._edges[k]
            if in_runs:
                counts[ends[k] - ends[k - 1]] += in_runs
        return counts


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
        self.rows[self._slots.pop(request.request_id)] = RequestRecord.from_request(request, keep_token_times=False)
        if request.status in (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH):
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
    gaps: Counter[float] = Counter()
    for stream in step_streams:
        steps.merge(stream.steps)
    for stream in row_streams:
        gaps.update(stream.gaps.counts())
    aborted = sum(not row.finished for row in rows)
    return RunMetrics.from_rows(rows, steps, counted_latency_summary("itl", gaps), num_failed=num_failed + aborted)
