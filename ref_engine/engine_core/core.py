"""`EngineCore`: the engine-core process, the busy loop of vLLM V1 (schedule, run the model, sample).

A client (the API server's `AsyncMPClient`, or a disaggregation router's `SyncMPClient`, client.py) starts
this process and talks to it in the messages of messages.py; the process only serves the model, so work on
the client's side (parsing JSON, writing SSE, routing between two engines) never stalls a step, and a step
never stalls a client. The loop: take every message waiting (new requests, aborts, utility calls), run one
`LLMEngine.step()` (schedule -> execute -> update), push its outputs; block on the input socket only while
there is nothing to run.

Transport: ZeroMQ (pyzmq), as vLLM: a PUSH/PULL socket pair each way over IPC. The API server's side is
asyncio, and a zmq.asyncio socket can be awaited directly, where a multiprocessing pipe would need a
thread or a reader callback on its file descriptor; the router waits on two cores at once with a
`zmq.Poller`. ZeroMQ also queues messages while the other side is busy, so the core reads them between steps.

A consumer core (`kv_role="kv_consumer"`, lesson 3) stages the requests that arrive with
`kv_transfer_params` in arrival order and admits them (`LLMEngine.add_remote_prefilled_request`, which
loads their K/V) as steps free room; its utility `discard_kv` lets a producer free K/V nobody will load.

Failures stay with their request: an `add_request` that raises refuses that request only
(`RequestError`, `invalid` for a ValueError), and so does a staged request whose K/V fails to load; a
sampling error is pinned on its request by the engine itself (`finish_reason="error"`). An exception the
engine cannot pin on one request fails the likeliest culprits and the loop goes on: the requests added
since the last good step if any (a new request that breaks scheduling), else those the step had running,
else every unfinished one. Each failed step thus removes at least one request, so a bad request can never
make every later step fail (and the log grow). One failure is no request's: an `ExecutorDeadError` (a
worker process died or hung, ref_engine/executor/) means no step can run again, so the core sends
`EngineCoreDead` with the reason and exits with code 1; its executor has already ended the other workers.

A request's arrival is the client's (`EngineCoreRequest.arrival_time`), so the API server's TTFT and
end-to-end latency include HTTP parsing, tokenization and the hop here, as vLLM measures them. The process
ignores SIGINT (Ctrl-C reaches the whole process group; the client decides), and on `Shutdown` aborts what
is left, which frees its blocks, and tells each request's client; it exits as well when the client's
process is gone.

Lesson: lessons/06-architecture-map.md (the engine core).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import sys
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import zmq

from core.metrics import StepRecord
from core.step_summary import StepSummarizer
from ref_engine.engine import LLMEngine
from ref_engine.engine_core.messages import (
    UTILITY_METHODS,
    AbortRequests,
    EngineCoreDead,
    EngineCoreOutputs,
    EngineCoreReady,
    EngineCoreRequest,
    EngineCoreStartFailed,
    EngineCoreStats,
    RequestError,
    Shutdown,
    UtilityCall,
    UtilityOutput,
)
from ref_engine.engine_core.tracing import TraceEvent, step_events
from ref_engine.executor import ExecutorDeadError
from ref_engine.kv_transfer.config import KVTransferConfig
from ref_engine.kv_transfer.connector import KVTransferParams
from ref_engine.outputs import RequestOutput

logger = logging.getLogger(__name__)

PARENT_CHECK_MS = 1000  # how often a core with nothing to do, or unable to send, looks for its client


@dataclass
class EngineCoreArgs:
    """What the core process needs to build its engine: a model path (each process loads its own) and
    `LLMEngine`'s keywords. Picklable, so it crosses into the spawned process."""

    model: str | Path | None = None
    dtype: str = "float32"
    device: str | None = None
    quantization: str | None = None  # None: the float reference; "int8", "int4": ref_engine/model/quantization.py
    kv_cache_dtype: str = "auto"  # what the KV cache stores K/V in (ref_engine/attention.py)
    enforce_eager: bool = True  # False: the model's forward through torch.compile (ref_engine/model/compile.py)
    num_threads: int | None = None  # torch threads in the core; None leaves torch's default
    engine_kwargs: dict[str, Any] = field(default_factory=dict)  # an EngineConfig as "config", and/or its knobs
    kv_transfer_config: KVTransferConfig | None = None  # one half of a disaggregated pair (lesson 3)
    trace_requests: bool = False  # ship per-request trace events with the outputs (tracing.py)
    dashboard: bool = False  # ship a StepSummary per step with the outputs (core/step_summary.py)

    def __post_init__(self) -> None:
        if self.num_threads is not None and (not isinstance(self.num_threads, int) or self.num_threads < 1):
            raise ValueError(f"num_threads must be a positive integer or None, got {self.num_threads!r}")

    def create_engine(self) -> LLMEngine:
        if self.num_threads:
            torch.set_num_threads(self.num_threads)
        return LLMEngine(self.model, dtype=self.dtype, device=self.device,
                         kv_transfer_config=self.kv_transfer_config, quantization=self.quantization,
                         kv_cache_dtype=self.kv_cache_dtype, enforce_eager=self.enforce_eager, **self.engine_kwargs)


def run_engine_core(engine_args: EngineCoreArgs, input_address: str, output_address: str) -> None:
    """The core process's main: build the engine, say ready (or why not), serve until `Shutdown`; exit code 1
    when the executor died."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # the client starts the core daemonic, so that the client's exit ends it; the core may still start worker
    # processes (distributed_executor_backend="mp"), which multiprocessing refuses to a daemonic process.
    # They cannot outlive it: they exit when it does, however it ends (multiproc_executor.py)
    multiprocessing.current_process().daemon = False
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
    except ExecutorDeadError:
        sys.exit(1)  # after the finally: the last words get their linger to leave
    finally:
        context.destroy(linger=1000)


class ClientGone(Exception):
    """The client's process exited without a word: nobody is left to serve."""


class EngineCore:
    """The loop around one `LLMEngine`, between the two sockets."""

    def __init__(self, engine: LLMEngine, input_socket: zmq.Socket, output_socket: zmq.Socket,
                 trace: bool = False, dashboard: bool = False) -> None:
        self.engine = engine
        self.input_socket = input_socket
        self.output_socket = output_socket
        self.parent_pid = os.getppid()
        self.trace_events: list[TraceEvent] | None = [] if trace else None  # sent with the next outputs
        self.summarizer = StepSummarizer(engine.scheduler) if dashboard else None  # None: no cost per step
        self._staged: deque[tuple[EngineCoreRequest, float]] = deque()  # consumer: (request, when it came)
        self._added_since_step: list[str] = []  # the suspects when a step fails

    def run(self) -> None:
        """Serve until `Shutdown` or until the client is gone; K/V staged and never loaded is discarded. An
        `ExecutorDeadError` is told to the client (`EngineCoreDead`) and raised: the model cannot run again."""
        engine = self.engine
        try:
            while self._read_messages(block=not (engine.has_unfinished_requests() or self._staged)):
                self._admit_staged()
                if engine.has_unfinished_requests():
                    self._step()
            self._abort_all("the engine core is shutting down")
        except ClientGone:
            logger.warning("the engine core's client is gone; exiting")
        except ExecutorDeadError as error:
            logger.error("the engine core cannot run the model any more: %s", error)
            self._send(EngineCoreDead(str(error)))
            raise
        finally:
            while self._staged:
                self.discard_kv(self._staged.popleft()[0].kv_transfer_params)

    # ---- messages in ----

    def _read_messages(self, *, block: bool) -> bool:
        """Handle every message waiting (first waiting for one if `block`); False on `Shutdown`."""
        if block:
            while not self.input_socket.poll(PARENT_CHECK_MS):
                self._check_client()
        while self.input_socket.poll(0):
            message = self.input_socket.recv_pyobj()
            if isinstance(message, Shutdown):
                return False
            try:
                self._handle(message)
            except ClientGone:
                raise
            except Exception:  # a malformed message is the client's bug; the core serves on
                logger.exception("could not handle %s", type(message).__name__)
        return True

    def _handle(self, message: Any) -> None:
        if isinstance(message, EngineCoreRequest):
            if message.kv_transfer_params is None:
                self._add_request(message, time.perf_counter())
            elif self.engine.kv_connector is None:
                self._fail(message.request_id, ValueError(
                    "kv_transfer_params sent to an engine without kv_transfer_config (kv_role='kv_consumer')"))
            else:
                self._staged.append((message, time.perf_counter()))
        elif isinstance(message, AbortRequests):
            self._abort(message.request_ids)
        elif isinstance(message, UtilityCall):
            try:
                if message.method not in UTILITY_METHODS:
                    raise ValueError(f"unknown utility method {message.method!r}")
                result = getattr(self, message.method)(*message.args)
            except Exception as error:
                result = RuntimeError(f"{message.method} failed: {type(error).__name__}: {error}")
            self._send(UtilityOutput(message.call_id, result))
        else:
            raise TypeError(f"unexpected message {type(message).__name__}")

    def _add_request(self, message: EngineCoreRequest, received: float) -> None:
        """Queue one request; any error refuses that request only (and leaves nothing of it queued)."""
        request_id = message.request_id
        # perf_counter is CLOCK_MONOTONIC on Linux (and system-wide on macOS and Windows): the client's
        # reading and this process's mean the same instant, so only the engine clock's origin differs
        arrival_time = None if message.arrival_time is None else message.arrival_time - self._clock_origin()
        known = self.engine.get_request(request_id) is not None  # a duplicate id: leave the first
        try:
            request = self.engine.add_request(request_id, message.prompt, message.params, arrival_time=arrival_time)
        except Exception as error:
            if not isinstance(error, ValueError):
                logger.exception("request %s could not be added", request_id)
            if not known:
                self.engine.abort_request(request_id)  # in case it got in before the error
            self._fail(request_id, error)
            return
        self._added(request_id, request.num_prompt_tokens, received)

    def _admit_staged(self) -> None:
        """Consumer: start staged requests in arrival order until one cannot start yet (no room: a later
        step frees some). One that never could, or whose K/V fails to load, fails alone."""
        engine = self.engine
        while self._staged:
            message, received = self._staged[0]
            try:
                request = engine.add_remote_prefilled_request(message.request_id, message.prompt, message.params,
                                                              message.kv_transfer_params)
            except Exception as error:
                self._staged.popleft()
                self.discard_kv(message.kv_transfer_params)
                self._fail(message.request_id, error)
                continue
            if request is None:
                return
            self._staged.popleft()
            self._added(message.request_id, request.num_prompt_tokens, received)

    def _added(self, request_id: str, num_prompt_tokens: int, received: float) -> None:
        self._added_since_step.append(request_id)
        if self.trace_events is not None:
            self.trace_events.append(TraceEvent(request_id, "queued", received, "engine_core",
                                                {"num_prompt_tokens": num_prompt_tokens}))

    def _abort(self, request_ids: list[str]) -> None:
        """Abort requests wherever they are (staged ones discard their K/V); the gauges see the freed blocks."""
        ids = set(request_ids)
        for message, _ in self._staged:
            if message.request_id in ids:
                self.discard_kv(message.kv_transfer_params)
        self._staged = deque(entry for entry in self._staged if entry[0].request_id not in ids)
        for request_id in request_ids:
            self.engine.abort_request(request_id)
        self._send(EngineCoreOutputs(scheduler_stats=self.engine.make_stats(), clock_origin=self._clock_origin()))

    # ---- utility methods (UTILITY_METHODS) ----

    def reset_prefix_cache(self, tenant: str | None = None) -> bool:
        return self.engine.reset_prefix_cache(tenant)

    def discard_kv(self, kv_transfer_params: KVTransferParams) -> None:
        """Producer: free K/V this engine saved and nobody will load."""
        if self.engine.kv_connector is None:
            raise ValueError("this engine has no KV connector (kv_transfer_config is None)")
        self.engine.kv_connector.discard(kv_transfer_params)

    def get_stats(self) -> EngineCoreStats:
        """The scheduler's stats and the staged requests: between runs, a pool left with every block free."""
        return EngineCoreStats(**asdict(self.engine.make_stats()), num_staged_requests=len(self._staged))

    # ---- one step ----

    def _step(self) -> None:
        engine = self.engine
        try:
            outputs, errors = engine.step(), {}
        except ExecutorDeadError:
            raise  # no request's fault, and no step can run again: `run` ends the core
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
        clock_origin = self._clock_origin()
        summaries = [self.summarizer.summarize(r, outputs_time) for r in records] if self.summarizer else []
        self._send(EngineCoreOutputs(outputs, errors, engine.make_stats(),
                                     self._take_trace_events(records, outputs, outputs_time, clock_origin),
                                     clock_origin, summaries))

    def _suspects(self) -> list[str]:
        """Whom a failed step fails (see the module docstring): never nobody while any request is unfinished."""
        engine = self.engine
        added = [r for r in self._added_since_step if engine.get_request(r) is not None]
        return added or engine.running_request_ids() or engine.unfinished_request_ids()

    def _take_trace_events(self, records: list[StepRecord], outputs: list[RequestOutput], outputs_time: float,
                           clock_origin: float) -> list[TraceEvent]:
        """The events since the last send (queued requests, this step's), for tracing; [] when it is off."""
        if self.trace_events is None:
            return []
        emitted = {o.request_id: o.outputs[0].finish_reason if o.finished else None for o in outputs}
        for record in records:
            self.trace_events += step_events(record, clock_origin, outputs_time, emitted)
        events, self.trace_events = self.trace_events, []
        return events

    # ---- helpers ----

    def _clock_origin(self) -> float:
        """time.perf_counter() at the engine clock's zero."""
        return time.perf_counter() - self.engine.now()

    def _fail(self, request_id: str, error: Exception) -> None:
        """Tell the client the core could not take this request: refused (a ValueError) or broken."""
        invalid = isinstance(error, ValueError)
        message = str(error) if invalid else f"{type(error).__name__}: {error}"
        self._send(EngineCoreOutputs(errors={request_id: RequestError(message, invalid)},
                                     clock_origin=self._clock_origin()))

    def _abort_all(self, reason: str) -> None:
        """Graceful shutdown: free every unfinished request's blocks and tell its client why it ended."""
        request_ids = self.engine.unfinished_request_ids() + [m.request_id for m, _ in self._staged]
        for request_id in request_ids:
            self.engine.abort_request(request_id)
        if request_ids:
            self._send(EngineCoreOutputs(errors={r: RequestError(reason) for r in request_ids},
                                         clock_origin=self._clock_origin()))

    def _check_client(self) -> None:
        if os.getppid() != self.parent_pid:
            raise ClientGone

    def _send(self, message: Any) -> None:
        """Push one message; while the client reads none (its queue is full), look for it now and then."""
        while True:
            try:
                self.output_socket.send_pyobj(message, flags=zmq.NOBLOCK)
                return
            except zmq.Again:
                if not self.output_socket.poll(PARENT_CHECK_MS, zmq.POLLOUT):
                    self._check_client()
