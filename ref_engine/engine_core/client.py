"""The clients of an engine-core process (vLLM's names): `AsyncMPClient`, the API server's handle, whose every
call is an awaitable on the server's event loop; and `SyncMPClient`, the blocking handle with which the
disaggregation router (ref_engine/disagg/llm.py) drives a prefill core and a decode core.

Both start the core process ("spawn": a fresh interpreter, never a fork of one running torch threads or an
event loop) with `run_engine_core`, bind the two ZeroMQ sockets it connects to (IPC files in a private
temporary folder), wait for `EngineCoreReady`, then send requests, aborts and utility calls and receive the
core's outputs, in the messages of messages.py. See core.py for why ZeroMQ.

ZeroMQ does not say when the other end dies, so every wait runs in slices and looks at the process between
them: a core that died raises `EngineDeadError`, once what it sent before dying has been read (a core whose
executor died says why, `EngineCoreDead`, and the error carries that instead of an exit code). The sync
client bounds every wait (`timeout_s`), and `wait_for_outputs` waits on several cores at once with a
`zmq.Poller`, as `multiprocessing.connection.wait` does on pipes. `close()` asks the core to stop, then
terminates it, then kills it.

Lesson: lessons/06-architecture-map.md (the engine core and the API server).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import multiprocessing
import tempfile
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio

from ref_engine.engine_core.core import EngineCoreArgs, run_engine_core
from ref_engine.engine_core.messages import (
    AbortRequests,
    EngineCoreDead,
    EngineCoreOutputs,
    EngineCoreReady,
    EngineCoreRequest,
    EngineCoreStartFailed,
    EngineCoreStats,
    Shutdown,
    UtilityCall,
    UtilityOutput,
)

logger = logging.getLogger(__name__)

POLL_SLICE_S = 0.2  # how often a waiting client looks whether its core is still alive
LAST_WORDS_S = 0.1  # how long a client waits for what a core sent just before it died


class EngineDeadError(RuntimeError):
    """The engine-core process is gone (it failed to start, or exited), or is being shut down."""


class MPClient:
    """What both clients share: the core process, and the two sockets it connects to."""

    def __init__(self, engine_args: EngineCoreArgs, context: zmq.Context) -> None:
        self.engine_args = engine_args
        # the sockets open in `_launch`: a client never started holds none, so collecting it cannot block
        # (a context collected with its sockets still open waits for them forever)
        self._context = context
        self._folder = tempfile.TemporaryDirectory(prefix="serving-lab-")
        self.process: multiprocessing.process.BaseProcess | None = None
        self._call_ids = itertools.count()

    def _launch(self, process_name: str) -> None:
        """Bind the sockets and start the core process, which connects to them."""
        folder = Path(self._folder.name)
        input_address, output_address = f"ipc://{folder / 'input'}", f"ipc://{folder / 'output'}"
        self._input = self._context.socket(zmq.PUSH)  # to the core
        self._output = self._context.socket(zmq.PULL)  # from the core
        self._input.bind(input_address)
        self._output.bind(output_address)
        self.process = multiprocessing.get_context("spawn").Process(
            target=run_engine_core, args=(self.engine_args, input_address, output_address),
            name=process_name, daemon=True)
        self.process.start()

    def is_alive(self) -> bool:
        return self.process is not None and self.process.is_alive()

    def _stop(self, timeout_s: float) -> None:
        """Wait for the core to exit, then insist: terminate, then kill. Bounded by about 2 x timeout_s."""
        self.process.join(timeout_s)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(timeout_s)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()

    def _close_sockets(self) -> None:
        self._context.destroy(linger=0)
        self._folder.cleanup()


class AsyncMPClient(MPClient):
    """The API server's handle on its engine core: every call an awaitable on the server's event loop."""

    def __init__(self, engine_args: EngineCoreArgs) -> None:
        super().__init__(engine_args, zmq.asyncio.Context())
        self._pending_calls: dict[int, asyncio.Future[Any]] = {}

    async def start(self, timeout_s: float = 600.0) -> EngineCoreReady:
        """Start the core process and wait until its model is loaded."""
        self._launch("EngineCore")
        deadline = time.monotonic() + timeout_s
        while not await self._output.poll(timeout=1000 * POLL_SLICE_S):  # a core dying while loading is noticed
            if not self.is_alive() or time.monotonic() > deadline:
                raise EngineDeadError(f"the engine core did not start (exit code {self.process.exitcode})")
        message = await self._output.recv_pyobj()
        if isinstance(message, EngineCoreStartFailed):
            raise EngineDeadError(f"the engine core failed to start: {message.error}")
        return message

    async def add_request(self, request: EngineCoreRequest) -> None:
        await self._input.send_pyobj(request)

    def abort_requests(self, request_ids: list[str]) -> None:
        """Not a coroutine: an abort is sent from a stream being cancelled (its client disconnected),
        where every await would be cancelled too. A PUSH socket queues it without blocking."""
        self._input.send_pyobj(AbortRequests(request_ids), flags=zmq.NOBLOCK)

    async def call_utility(self, method: str, *args: Any) -> Any:
        """Run `EngineCore.<method>(*args)` in the core and return its result (`get_output` delivers it, so
        the output loop must be running)."""
        call_id = next(self._call_ids)
        future = asyncio.get_running_loop().create_future()
        self._pending_calls[call_id] = future
        await self._input.send_pyobj(UtilityCall(call_id, method, args))
        return await future

    async def get_output(self) -> EngineCoreOutputs:
        """The core's next outputs; utility answers are handed to their callers on the way. Raises
        `EngineDeadError` once the core process has exited."""
        while True:
            while not await self._output.poll(timeout=1000 * POLL_SLICE_S):
                if not self.is_alive():
                    raise EngineDeadError(f"the engine core exited (exit code {self.process.exitcode})")
            message = await self._output.recv_pyobj()
            if isinstance(message, EngineCoreDead):
                raise EngineDeadError(f"the engine core died: {message.error}")
            if isinstance(message, UtilityOutput):
                future = self._pending_calls.pop(message.call_id)
                if isinstance(message.result, BaseException):  # the call raised in the core
                    future.set_exception(message.result)
                else:
                    future.set_result(message.result)
                continue
            return message

    async def shutdown(self, timeout_s: float = 10.0) -> None:
        """Ask the core to abort what it still runs and exit (its last outputs can still be read);
        terminate it if it does not."""
        if self.is_alive():
            await self._input.send_pyobj(Shutdown())
            await asyncio.to_thread(self._stop, timeout_s)

    def close(self) -> None:
        """Close the sockets (after `shutdown`, once nobody reads outputs any more)."""
        for future in self._pending_calls.values():
            future.cancel()
        self._close_sockets()


class SyncMPClient(MPClient):
    """A blocking handle on one engine core (`name`: its role, such as "prefill"), started at once; every wait
    is bounded. Once its core has died, every call raises `EngineDeadError` with `death`."""

    def __init__(self, engine_args: EngineCoreArgs, name: str) -> None:
        super().__init__(engine_args, zmq.Context())
        self.name = name
        self.death: str | None = None  # how the core died, once that was seen
        self._outputs: deque[EngineCoreOutputs] = deque()  # read while waiting for a utility's answer
        self._closed = False
        self._launch(f"{name}-engine")

    @property
    def dead(self) -> bool:
        return self.death is not None

    def wait_ready(self, timeout_s: float) -> EngineCoreReady:
        """Wait until the core has loaded its model."""
        message = self._receive(timeout_s)
        if message is None:
            raise TimeoutError(f"the {self.name} engine did not start within {timeout_s:g} s")
        if isinstance(message, EngineCoreStartFailed):
            raise EngineDeadError(f"the {self.name} engine failed to start: {message.error}")
        return message

    def add_request(self, request: EngineCoreRequest) -> None:
        self._send(request)

    def abort_requests(self, request_ids: list[str]) -> None:
        self._send(AbortRequests(request_ids))

    def call_utility(self, method: str, *args: Any, timeout_s: float) -> Any:
        """Run `EngineCore.<method>(*args)` in the core and return its result; outputs that arrive meanwhile
        are kept for `get_output`. TimeoutError if no answer comes within `timeout_s`."""
        call_id = next(self._call_ids)
        self._send(UtilityCall(call_id, method, args))
        deadline = time.monotonic() + timeout_s
        while True:
            message = self._receive(deadline - time.monotonic())
            if message is None:
                raise TimeoutError(f"the {self.name} engine did not answer {method} within {timeout_s:g} s")
            if isinstance(message, UtilityOutput) and message.call_id == call_id:
                if isinstance(message.result, BaseException):  # the call raised in the core
                    raise message.result
                return message.result
            self._keep(message)

    def call_utility_nowait(self, method: str, *args: Any) -> None:
        """Run `EngineCore.<method>(*args)` in the core without waiting: its answer is dropped when it
        comes (logged if the call raised)."""
        self._send(UtilityCall(next(self._call_ids), method, args))

    def stats(self, timeout_s: float) -> EngineCoreStats:
        """The core's pool and queues now (the `get_stats` utility)."""
        return self.call_utility("get_stats", timeout_s=timeout_s)

    def get_output(self, timeout_s: float) -> EngineCoreOutputs | None:
        """The core's next outputs, waiting at most `timeout_s`; None if none came."""
        deadline = time.monotonic() + timeout_s
        while not self._outputs:
            message = self._receive(deadline - time.monotonic())
            if message is None:
                return None
            self._keep(message)
        return self._outputs.popleft()

    def close(self, timeout_s: float = 10.0) -> None:
        """Ask the core to stop, then insist: terminate, then kill (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self.is_alive():
            try:
                self._input.send_pyobj(Shutdown(), flags=zmq.NOBLOCK)
            except zmq.Again:  # the core reads nothing: terminate it
                pass
        self._stop(timeout_s)
        self._close_sockets()

    def _send(self, message: Any) -> None:
        while True:
            if self.death is not None:
                raise EngineDeadError(self.death)
            if not self.process.is_alive():
                raise self._died()
            try:
                self._input.send_pyobj(message, flags=zmq.NOBLOCK)
                return
            except zmq.Again:  # its queue is full: wait for room, watching the process
                self._input.poll(1000 * POLL_SLICE_S, zmq.POLLOUT)

    def _receive(self, timeout_s: float) -> Any:
        """The next message, waiting at most `timeout_s` (None if none came). EngineDeadError once the core
        is gone and every message it sent has been read."""
        if self.death is not None:
            raise EngineDeadError(self.death)
        deadline = time.monotonic() + timeout_s
        while True:
            if self._output.poll(1000 * max(0.0, min(POLL_SLICE_S, deadline - time.monotonic()))):
                return self._checked(self._output.recv_pyobj())
            if not self.process.is_alive():
                if self._output.poll(1000 * LAST_WORDS_S):
                    return self._checked(self._output.recv_pyobj())
                raise self._died()
            if time.monotonic() >= deadline:
                return None

    def _checked(self, message: Any) -> Any:
        """`message`, unless it is the core's last words: then the death they tell is raised."""
        if isinstance(message, EngineCoreDead):
            self.death = f"the {self.name} engine core died: {message.error}"
            raise EngineDeadError(self.death)
        return message

    def _keep(self, message: Any) -> None:
        """Keep outputs for `get_output`; drop the answer of a `call_utility_nowait` (logged if it raised)."""
        if not isinstance(message, UtilityOutput):
            self._outputs.append(message)
        elif isinstance(message.result, BaseException):
            logger.warning("the %s engine: %s", self.name, message.result)

    def _died(self) -> EngineDeadError:
        self.process.join(timeout=5)
        self.death = f"the {self.name} engine process died (exit code {self.process.exitcode})"
        return EngineDeadError(self.death)


def wait_for_outputs(clients: Sequence[SyncMPClient], timeout_s: float) -> list[SyncMPClient]:
    """The clients with outputs to read or whose core died (`get_output` then raises), waiting at most
    `timeout_s` for one: `multiprocessing.connection.wait` for engine cores."""
    poller = zmq.Poller()
    for client in clients:
        poller.register(client._output, zmq.POLLIN)
    deadline = time.monotonic() + timeout_s
    while True:
        ready = [c for c in clients if c._outputs or not c.is_alive()]
        remaining = deadline - time.monotonic()
        if ready or remaining <= 0:
            return ready
        events = dict(poller.poll(1000 * min(POLL_SLICE_S, remaining)))
        ready = [c for c in clients if c._output in events]
        if ready:
            return ready
