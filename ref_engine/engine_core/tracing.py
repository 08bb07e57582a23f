"""Request tracing: one timeline of timestamped events per request, across the API server and the engine core.

Opt-in (`serving-lab serve --trace-requests`), because a busy server should not keep per-step records. The
API server records what it does (arrived, tokenized, sent to the core, each output received, each SSE chunk
handed to uvicorn to send); the engine core records what the loop does to each request (queued, then per step: scheduled with
its token count, sampled, detokenized; finished) and ships its events with the step's outputs, the way
vLLM V1's engine core attaches per-request events (queued, scheduled) to its outputs. Every time is
`time.perf_counter()`, a system-wide monotonic clock on Linux, macOS and Windows, so the two processes' events
(and a client's on the same machine) line up without translation.

vLLM exports the same story as one OpenTelemetry span per request to a collector (`--otlp-traces-endpoint`);
with no collector to run, this server keeps the last `max_requests` timelines in memory and serves one at
GET /debug/trace/{request_id}, keyed by the X-Request-Id the client sent.

Lesson: lessons/06-architecture-map.md#one-request-traced
"""

from __future__ import annotations

import re
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from core.metrics import StepRecord

ENGINE_ID_SUFFIX = re.compile(r"\d+-[0-9a-f]{8}")  # what the server adds to an X-Request-Id (serving.py)


@dataclass(frozen=True)
class TraceEvent:
    """Something that happened to one engine request, in one box, at `time` (perf_counter seconds)."""

    request_id: str  # the engine request: the HTTP request's id, plus "-<choice>"
    event: str
    time: float
    box: str  # "api_server" or "engine_core"
    attrs: dict[str, Any] = field(default_factory=dict)


class RequestTracer:
    """The API server's store of timelines: the newest `max_requests` requests, oldest dropped first."""

    def __init__(self, max_requests: int = 1024) -> None:
        if max_requests < 1:
            raise ValueError(f"max_requests must be >= 1, got {max_requests}")
        self.max_requests = max_requests
        self._events: OrderedDict[str, list[TraceEvent]] = OrderedDict()

    def record(self, request_id: str, event: str, at: float | None = None, **attrs: Any) -> None:
        """An API-server event, now unless `at` says when."""
        self.add([TraceEvent(request_id, event, time.perf_counter() if at is None else at, "api_server", attrs)])

    def add(self, events: Iterable[TraceEvent]) -> None:
        for event in events:
            self._events.setdefault(event.request_id, []).append(event)
            self._events.move_to_end(event.request_id)
        while len(self._events) > self.max_requests:
            self._events.popitem(last=False)

    def timeline(self, request_id: str) -> list[TraceEvent]:
        """The HTTP request's events and those of its engine requests (`<id>-<choice>-<8 hex>`, the server's
        ids), in time order. Two requests that reused one X-Request-Id share a timeline."""
        prefix = f"{request_id}-"
        return sorted((e for key, events in self._events.items()
                       if key == request_id or (key.startswith(prefix) and ENGINE_ID_SUFFIX.fullmatch(key[len(prefix):]))
                       for e in events), key=lambda e: e.time)


def step_events(record: StepRecord, clock_offset: float, outputs_time: float,
                outputs: dict[str, str | None]) -> list[TraceEvent]:
    """The engine core's events of one step: for each request it ran, scheduled (the step starts; the
    request's tokens this step and those computed before) and sampled (forward, sampling and the scheduler's
    update done); for each request with an output (`outputs`: request id -> finish reason or None),
    detokenized (the step's outputs built, text included) and, when it ended, finished. `clock_offset` turns
    the engine's clock into perf_counter time. (A mid-prompt chunk samples nothing; its "sampled" marks the
    step's end.)"""
    start = record.start + clock_offset
    sampled = start + record.duration
    events = []
    for request_id, query_len, context_len in zip(record.request_ids, record.query_lens, record.context_lens):
        events += [TraceEvent(request_id, "scheduled", start, "engine_core",
                              {"step": record.step_id, "num_tokens": query_len,
                               "num_computed_tokens": context_len, "batch_size": record.num_seqs}),
                   TraceEvent(request_id, "sampled", sampled, "engine_core", {"step": record.step_id})]
    for request_id, finish_reason in outputs.items():
        events.append(TraceEvent(request_id, "detokenized", outputs_time, "engine_core", {"step": record.step_id}))
        if finish_reason is not None:
            events.append(TraceEvent(request_id, "finished", outputs_time, "engine_core",
                                     {"finish_reason": finish_reason}))
    return events
