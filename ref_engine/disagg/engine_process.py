"""One `LLMEngine` in a process of its own, driven by small messages over a pipe.

A disaggregated deployment runs its prefill and decode engines side by side, each busy with its own batch;
in one Python process they would take turns, so each gets a process (started with "spawn": a fresh
interpreter, not a fork of one whose torch threads are running). The parent keeps an `EngineProcess`; the
child runs `run_engine_process`, a loop of: read the messages waiting on the pipe, admit what it can, run
one `step`, report each finished request. When it has no work it blocks on the pipe. The pipe carries
only control messages (these dataclasses, pickled); the K/V itself moves through the KV connector.

A consumer (decode engine) keeps requests whose K/V has arrived but that cannot start yet (its batch or
pool is full) in a staging queue, in arrival order, and admits them as steps free room. Every error of one
request (refused, its K/V failed to load) comes back as `RequestFailed`, and the loop goes on.

Lesson: lessons/03-chunked-prefill-and-disaggregation.md#disaggregation
"""

from __future__ import annotations

import multiprocessing
import time
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch

from core.config import EngineConfig
from core.request import Request
from ref_engine.engine import LLMEngine, PromptType
from ref_engine.kv_transfer.config import KVTransferConfig
from ref_engine.kv_transfer.connector import KVTransferParams
from ref_engine.outputs import RequestOutput
from ref_engine.sampling_params import SamplingParams

# ---- messages: parent -> engine ----


@dataclass(frozen=True)
class AddRequest:
    request_id: str
    prompt: PromptType
    params: SamplingParams


@dataclass(frozen=True)
class AddRemotePrefilled:
    """A request that the producer prefilled, with the description of its saved K/V (consumer only)."""

    request_id: str
    prompt: PromptType
    params: SamplingParams
    kv_transfer_params: KVTransferParams


@dataclass(frozen=True)
class DiscardKV:
    """Free K/V this engine saved and nobody will load (producer only)."""

    kv_transfer_params: KVTransferParams


@dataclass(frozen=True)
class GetStats:
    pass


@dataclass(frozen=True)
class Shutdown:
    pass


# ---- messages: engine -> parent ----


@dataclass(frozen=True)
class EngineStats:
    """The reply to `GetStats`: a finished run must leave every block free."""

    num_kv_blocks: int
    num_free_blocks: int  # evictable prefix-cache blocks count as free
    num_unfinished_requests: int
    num_staged_requests: int  # consumer: K/V arrived, waiting for room in the batch


@dataclass(frozen=True)
class Ready:
    stats: EngineStats


@dataclass(frozen=True)
class StartFailed:
    error: str


@dataclass(frozen=True)
class RequestFinished:
    output: RequestOutput
    # consumer only: seconds spent loading the K/V, and when each output token came, as time.perf_counter()
    # readings (one clock for every process on this machine)
    kv_load_s: float = 0.0
    token_times: tuple[float, ...] = ()


@dataclass(frozen=True)
class RequestFailed:
    request_id: str
    error: str


# ---- the engine's side ----


@dataclass(frozen=True)
class EngineSpec:
    """What the child needs to build its engine (a model path, not loaded weights: each loads its own)."""

    model: str | Path | None
    config: EngineConfig
    kv_transfer_config: KVTransferConfig
    dtype: str = "float32"
    device: str | None = None
    num_threads: int = 1  # torch threads: the two engines share the machine's cores


def run_engine_process(conn: Connection, spec: EngineSpec) -> None:
    """The child's main: build the engine, say `Ready` (or `StartFailed`), then serve until `Shutdown` or
    until the parent is gone."""
    torch.set_num_threads(spec.num_threads)
    try:
        engine = LLMEngine(spec.model, dtype=spec.dtype, device=spec.device, config=spec.config,
                           kv_transfer_config=spec.kv_transfer_config)
    except Exception as error:
        conn.send(StartFailed(f"{type(error).__name__}: {error}"))
        return
    loop = _EngineLoop(engine, conn)
    try:
        conn.send(Ready(loop.stats()))
        loop.run()
    except (EOFError, BrokenPipeError):  # the parent is gone: nobody to serve
        pass
    finally:
        loop.discard_staged()


class _EngineLoop:
    def __init__(self, engine: LLMEngine, conn: Connection) -> None:
        self.engine = engine
        self.conn = conn
        self.staged: deque[AddRemotePrefilled] = deque()
        self.admitted: dict[str, tuple[Request, float]] = {}  # consumer: (request, seconds its K/V took to load)

    def run(self) -> None:
        engine = self.engine
        while self._read_messages(block=not (engine.has_unfinished_requests() or self.staged)):
            self._admit_staged()
            for output in engine.step():
                self.conn.send(self._finished(output))

    def _read_messages(self, *, block: bool) -> bool:
        """Handle every message waiting (first waiting for one if `block`); False on `Shutdown`."""
        if block:
            self.conn.poll(None)
        while self.conn.poll(0):
            message = self.conn.recv()
            if isinstance(message, Shutdown):
                return False
            self._handle(message)
        return True

    def _handle(self, message: Any) -> None:
        if isinstance(message, AddRequest):
            try:
                self.engine.add_request(message.request_id, message.prompt, message.params)
            except ValueError as error:
                self.conn.send(RequestFailed(message.request_id, str(error)))
        elif isinstance(message, AddRemotePrefilled):
            self.staged.append(message)
        elif isinstance(message, DiscardKV):
            self.engine.kv_connector.discard(message.kv_transfer_params)
        elif isinstance(message, GetStats):
            self.conn.send(self.stats())
        else:
            raise TypeError(f"unknown message {message!r}")

    def _admit_staged(self) -> None:
        """Start staged requests in arrival order until one cannot start yet."""
        engine = self.engine
        while self.staged:
            message = self.staged[0]
            start = time.perf_counter()
            try:
                request = engine.add_remote_prefilled_request(message.request_id, message.prompt, message.params,
                                                              message.kv_transfer_params)
            except Exception as error:  # refused, or its K/V failed to load: this request only
                self.staged.popleft()
                engine.kv_connector.discard(message.kv_transfer_params)
                self.conn.send(RequestFailed(message.request_id, f"{type(error).__name__}: {error}"))
                continue
            if request is None:
                return
            self.staged.popleft()
            self.admitted[message.request_id] = (request, time.perf_counter() - start)

    def _finished(self, output: RequestOutput) -> RequestFinished:
        admitted = self.admitted.pop(output.request_id, None)
        if admitted is None:
            return RequestFinished(output)
        request, load_s = admitted
        to_perf_counter = time.perf_counter() - self.engine.now()  # the engine's clock starts at its _t0
        return RequestFinished(output, load_s, tuple(t + to_perf_counter for t in request.token_times))

    def stats(self) -> EngineStats:
        pool = self.engine.scheduler.kv_cache_manager.block_pool
        return EngineStats(pool.num_blocks, pool.num_free_blocks,
                           self.engine.scheduler.get_num_unfinished_requests(), len(self.staged))

    def discard_staged(self) -> None:
        while self.staged:
            self.engine.kv_connector.discard(self.staged.popleft().kv_transfer_params)


# ---- the parent's side ----


class EngineProcessError(RuntimeError):
    """An engine process died, failed to start, or did not answer in time."""


class EngineProcess:
    """The parent's handle on one engine process: start it, message it, stop it."""

    def __init__(self, name: str, spec: EngineSpec) -> None:
        context = multiprocessing.get_context("spawn")
        self.name = name
        self.conn, child_conn = context.Pipe()
        self.process = context.Process(target=run_engine_process, args=(child_conn, spec),
                                       name=f"{name}-engine", daemon=True)
        self.process.start()
        child_conn.close()  # the child holds the only other end: its death reads as end-of-file here
        self.death: str | None = None  # how it died, once it has

    @property
    def dead(self) -> bool:
        return self.death is not None

    def wait_ready(self, timeout_s: float) -> EngineStats:
        reply = self.receive(timeout_s)
        if isinstance(reply, StartFailed):
            raise EngineProcessError(f"the {self.name} engine failed to start: {reply.error}")
        return reply.stats

    def send(self, message: Any) -> None:
        try:
            self.conn.send(message)
        except OSError as error:  # BrokenPipeError and kin: the child is gone
            raise self._died() from error

    def receive(self, timeout_s: float) -> Any:
        """The next message; EngineProcessError if none comes within `timeout_s` or the process died."""
        if not self.conn.poll(timeout_s):
            raise EngineProcessError(f"the {self.name} engine sent nothing for {timeout_s:g} s")
        try:
            return self.conn.recv()
        except (EOFError, OSError) as error:
            raise self._died() from error

    def stats(self, timeout_s: float) -> EngineStats:
        """Free blocks and queues now; only between runs, when no other reply is on its way."""
        self.send(GetStats())
        return self.receive(timeout_s)

    def _died(self) -> EngineProcessError:
        self.process.join(timeout=5)
        self.death = f"the {self.name} engine process died (exit code {self.process.exitcode})"
        return EngineProcessError(self.death)

    def close(self, timeout_s: float = 10.0) -> None:
        """Ask the loop to stop, then insist: terminate, then kill. Bounded by about 2 x timeout_s."""
        if self.process.is_alive():
            try:
                self.conn.send(Shutdown())
            except OSError:
                pass
            self.process.join(timeout_s)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(timeout_s)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.conn.close()
