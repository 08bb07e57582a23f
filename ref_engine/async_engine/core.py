"""`EngineCore`: the engine-core process, the busy loop of vLLM V1 (schedule, run the model, sample).

The API server's process does HTTP, tokenization and streaming; this process only serves the model, so
Python work on the server side (parsing JSON, writing SSE) never stalls a step, and a step never stalls a
client. The loop: take every message waiting (new requests, aborts, utility calls), run one
`LLMEngine.step()`, push its outputs; block on the input socket only while there is nothing to run.

Transport: ZeroMQ (pyzmq), as vLLM: a PUSH/PULL socket pair each way over IPC. The API server's side is
asyncio, and a zmq.asyncio socket can be awaited directly, where a multiprocessing pipe would need a
thread or a reader callback on its file descriptor; ZeroMQ also queues messages while the other side is
busy, so the core reads them between steps. (The disaggregated pair of lesson 3, `ref_engine/disagg/`,
uses a pipe: its router is synchronous.)

Failures stay with their request: an `add_request` that raises refuses that request only
(`RequestError`, `invalid` for a ValueError); a sampling error is pinned on its request by the engine itself
(`finish_reason="error"`). An exception the engine cannot pin on one request fails the likeliest culprits
and the loop goes on: the requests added since the last good step if any (a new request that breaks
scheduling), else those the step had running, else every unfinished one. Each failed step thus removes
at least one request, so a bad request can never make every later step fail (and the log grow).

A request's arrival is the API server's (`EngineCoreRequest.arrival_time`), so TTFT and end-to-end
latency include HTTP parsing, tokenization and the hop here, as vLLM measures them. The process ignores SIGINT (Ctrl-C reaches the whole process
group; the API server decides), and on `Shutdown` aborts what is left, which frees its blocks, and tells
each stream.

Lesson: lessons/06-architecture-map.md (the engine core).
"""

from __future__ import annotations

import logging
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import zmq

from core.metrics import StepRecord
from core.request import RequestStatus
from core.step_summary import StepSummarizer
from ref_engine.async_engine.messages import (
    UTILITY_METHODS,
    AbortRequests,
    EngineCoreOutputs,
    EngineCoreReady,
    EngineCoreRequest,
    EngineCoreStartFailed,
    RequestError,
    SchedulerStats,
    Shutdown,
    UtilityCall,
    UtilityOutput,
)
from ref_engine.async_engine.tracing import TraceEvent, step_events
from ref_engine.engine import LLMEngine
from ref_engine.outputs import RequestOutput

logger = logging.getLogger(__name__)


@dataclass
class EngineArgs:
    """What the core process needs to build its engine: a model path (each process loads its own) and
    `LLMEngine`'s keywords. Picklable, so it crosses into the spawned process."""

    model: str | Path | None = None
    dtype: str = "float32"
    device: str | None = None
    quantization: str | None = None  # None: the float reference; "int8", "int4": ref_engine/model/quantization.py
    kv_cache_dtype: str = "auto"  # what the KV cache stores K/V in (ref_engine/attention.py)
    enforce_eager: bool = True  # False: the model's forward through torch.compile (ref_engine/model/compile.py)
    num_threads: int | None = None  # torch threads in the core; None leaves torch's default
    engine_kwargs: dict[str, Any] = field(default_factory=dict)  # EngineConfig knobs
    trace_requests: bool = False  # ship per-request trace events with the outputs (tracing.py)
    dashboard: bool = False  # ship a StepSummary per step with the outputs (core/step_summary.py)

    def create_engine(self) -> LLMEngine:
        if self.num_threads:
            torch.set_num_threads(self.num_threads)
        return LLMEngine(self.model, dtype=self.dtype, device=self.device, quantization=self.quantization,
                         kv_cache_dtype=self.kv_cache_dtype, enforce_eager=self.enforce_eager, **self.engine_kwargs)


def run_engine_core(engine_args: EngineArgs, input_address: str, output_address: str) -> None:
    """The core process's main: build the engine, say ready (or why not), serve until `Shutdown`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    context = zmq.Context()
    input_socket = context.socket(zmq.PULL)
    input_socket.connect(input_address)
    output_socket = context.socket(zmq.PUSH)
    output_socket.connect(output_address)
    try:
        try:
            engine = engine_args.create_engine()
        except Exception as error:
            logger.exception("the engine core could not start")
            output_socket.send_pyobj(EngineCoreStartFailed(f"{type(error).__name__}: {error}"))
            return
        output_socket.send_pyobj(EngineCoreReady(
            model_id=engine.model_id, max_model_len=engine.config.max_model_len,
            vocab_size=engine.arch.vocab_size, num_kv_blocks=engine.num_kv_blocks,
            scheduling_policy=engine.config.scheduling_policy))
        EngineCore(engine, input_socket, output_socket, trace=engine_args.trace_requests,
                   dashboard=engine_args.dashboard).run()
    finally:
        context.destroy(linger=1000)


class EngineCore:
    """The loop around one `LLMEngine`, between the two sockets."""

    def __init__(self, engine: LLMEngine, input_socket: zmq.Socket, output_socket: zmq.Socket,
                 trace: bool = False, dashboard: bool = False) -> None:
        self.engine = engine
        self.input_socket = input_socket
        self.output_socket = output_socket
        self.parent_pid = os.getppid()
        self.trace_events: list[TraceEvent] | None = [] if trace else None  # sent with the next outputs
        self.summarizer = StepSummarizer(engine.scheduler) if dashboard else None
        self._added_since_step: list[str] = []  # the suspects when a step fails
        self._preempted: set[str] = set()  # unfinished requests preempted at least once (counted once)

    def run(self) -> None:
        engine = self.engine
        while self._read_messages(block=not engine.has_unfinished_requests()):
            if engine.has_unfinished_requests():
                self._step()
        self._abort_all("the server is shutting down")

    def _read_messages(self, *, block: bool) -> bool:
        """Handle every message waiting (first waiting for one if `block`); False on `Shutdown`, or when
        the API server's process is gone (killed without a word: nobody is left to serve)."""
        if block:
            while not self.input_socket.poll(1000):
                if os.getppid() != self.parent_pid:
                    return False
        while self.input_socket.poll(0):
            message = self.input_socket.recv_pyobj()
            if isinstance(message, Shutdown):
                return False
            try:
                self._handle(message)
            except Exception:  # a malformed message is the client's bug; the core serves on
                logger.exception("could not handle %s", type(message).__name__)
        return True

    def _handle(self, message: Any) -> None:
        if isinstance(message, EngineCoreRequest):
            self._add_request(message)
        elif isinstance(message, AbortRequests):
            for request_id in message.request_ids:
                self.engine.abort_request(request_id)
            self._send(EngineCoreOutputs(scheduler_stats=self._stats()))  # the gauges see the freed blocks
        elif isinstance(message, UtilityCall):
            try:
                if message.method not in UTILITY_METHODS:
                    raise ValueError(f"unknown utility method {message.method!r}")
                result = getattr(self.engine, message.method)(*message.args)
            except Exception as error:
                result = RuntimeError(f"{message.method} failed: {type(error).__name__}: {error}")
            self._send(UtilityOutput(message.call_id, result))
        else:
            raise TypeError(f"unexpected message {type(message).__name__}")

    def _add_request(self, message: EngineCoreRequest) -> None:
        """Queue one request; any error refuses that request only (and leaves nothing of it queued)."""
        request_id = message.request_id
        if self.trace_events is not None:
            self.trace_events.append(TraceEvent(
                request_id, "queued", time.perf_counter(), "engine_core",
                {"num_prompt_tokens": len(message.prompt.get("prompt_token_ids", ()))}))
        # perf_counter is CLOCK_MONOTONIC on Linux (and system-wide on macOS and Windows): the API server's
        # reading and this process's mean the same instant, so only the engine clock's origin differs
        arrival_time = None if message.arrival_time is None else (
            message.arrival_time - (time.perf_counter() - self.engine.now()))
        known = self.engine.scheduler.get_request(request_id) is not None  # a duplicate id: leave the first
        try:
            self.engine.add_request(request_id, message.prompt, message.params, arrival_time=arrival_time)
        except Exception as error:
            if not isinstance(error, ValueError):
                logger.exception("request %s could not be added", request_id)
            if not known:
                self.engine.abort_request(request_id)  # in case it got in before the error
            self._send(EngineCoreOutputs(errors={request_id: RequestError(
                str(error), invalid=isinstance(error, ValueError))}))
            return
        self._added_since_step.append(request_id)

    def _step(self) -> None:
        engine = self.engine
        try:
            outputs, errors = engine.step(), {}
        except Exception as error:
            logger.exception("engine step failed")
            suspects = self._suspects()
            for request_id in suspects:
                engine.abort_request(request_id)
            outputs = []
            errors = {r: RequestError(f"engine step failed: {type(error).__name__}: {error}") for r in suspects}
        self._added_since_step = []
        outputs_time = time.perf_counter()
        records, engine.step_records = engine.step_records, []  # a server runs for days: keep no log
        summaries = [self.summarizer.summarize(r, outputs_time) for r in records] if self.summarizer else []
        self._send(EngineCoreOutputs(outputs, errors, self._stats(records),
                                     self._take_trace_events(records, outputs, outputs_time), summaries))

    def _suspects(self) -> list[str]:
        """Whom a failed step fails (see the module docstring): never nobody while any request is unfinished."""
        scheduler = self.engine.scheduler
        added = [r for r in self._added_since_step if scheduler.get_request(r) is not None]
        return added or [r.request_id for r in scheduler.running] or list(scheduler.requests)

    def _take_trace_events(self, records: list[StepRecord], outputs: list[RequestOutput],
                           outputs_time: float) -> list[TraceEvent]:
        """The events since the last send (queued requests, this step's), for tracing; [] when it is off."""
        if self.trace_events is None:
            return []
        clock_offset = time.perf_counter() - self.engine.now()
        emitted = {o.request_id: o.outputs[0].finish_reason if o.finished else None for o in outputs}
        for record in records:
            self.trace_events += step_events(record, clock_offset, outputs_time, emitted)
        events, self.trace_events = self.trace_events, []
        return events

    def _stats(self, records: list[StepRecord] = ()) -> SchedulerStats:
        scheduler = self.engine.scheduler
        kv = scheduler.kv_cache_manager
        num_newly_preempted, num_waiting_preempted = self._track_preemptions(records)
        return SchedulerStats(
            num_running_reqs=len(scheduler.running), num_waiting_reqs=scheduler.num_waiting,
            kv_cache_usage=kv.usage, num_used_blocks=kv.block_pool.num_used_blocks,
            num_preempted=sum(r.num_preempted for r in records), num_preempted_reqs=num_newly_preempted,
            num_waiting_preempted_reqs=num_waiting_preempted)

    def _track_preemptions(self, records: list[StepRecord]) -> tuple[int, int]:
        """(requests preempted for the first time in these steps, requests now waiting after a preemption).
        Looks at the requests only while some step preempts or a preempted request is unfinished; the set
        it keeps holds unfinished requests only."""
        if not self._preempted and not any(r.num_preempted for r in records):
            return 0, 0
        requests = self.engine.scheduler.requests
        preempted = {request_id for request_id, r in requests.items() if r.num_preemptions}
        num_new = len(preempted - self._preempted)
        self._preempted = preempted
        return num_new, sum(1 for r in preempted if requests[r].status != RequestStatus.RUNNING)

    def _abort_all(self, reason: str) -> None:
        """Graceful shutdown: free every unfinished request's blocks and tell its stream why it ended."""
        request_ids = list(self.engine.scheduler.requests)
        for request_id in request_ids:
            self.engine.abort_request(request_id)
        if request_ids:
            self._send(EngineCoreOutputs(errors={r: RequestError(reason) for r in request_ids}))

    def _send(self, message: Any) -> None:
        self.output_socket.send_pyobj(message)
