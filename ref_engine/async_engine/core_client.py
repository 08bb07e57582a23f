"""`EngineCoreClient`: the API server's handle on the engine-core process (vLLM's `AsyncMPClient`).

It starts the core process ("spawn": a fresh interpreter, never a fork of one running torch threads or an
event loop), binds the two ZeroMQ sockets the core connects to (IPC files in a private temporary folder),
waits for `EngineCoreReady`, then sends requests, aborts and utility calls and receives the core's
outputs, all as awaitables on the server's event loop. See `core.py` for why ZeroMQ.

Lesson: lessons/06-architecture-map.md (the engine core and the API server).
"""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing
import tempfile
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio

from ref_engine.async_engine.core import EngineArgs, run_engine_core
from ref_engine.async_engine.messages import (
    AbortRequests,
    EngineCoreOutputs,
    EngineCoreReady,
    EngineCoreRequest,
    EngineCoreStartFailed,
    Shutdown,
    UtilityCall,
    UtilityOutput,
)


class EngineDeadError(RuntimeError):
    """The engine-core process is gone (it failed to start, or exited), or the server is shutting it down."""


class EngineCoreClient:
    def __init__(self, engine_args: EngineArgs) -> None:
        self.engine_args = engine_args
        self._folder = tempfile.TemporaryDirectory(prefix="serving-lab-")
        # the sockets open in `start`: a client never started holds none, so collecting it cannot block
        # (a context collected with its sockets still open waits for them forever)
        self._context = zmq.asyncio.Context()
        self._process: multiprocessing.process.BaseProcess | None = None
        self._call_ids = itertools.count()
        self._pending_calls: dict[int, asyncio.Future[Any]] = {}

    async def start(self, timeout_s: float = 600.0) -> EngineCoreReady:
        """Start the core process and wait until its model is loaded."""
        folder = Path(self._folder.name)
        input_address, output_address = f"ipc://{folder / 'input'}", f"ipc://{folder / 'output'}"
        self._input = self._context.socket(zmq.PUSH)  # to the core
        self._output = self._context.socket(zmq.PULL)  # from the core
        self._input.bind(input_address)
        self._output.bind(output_address)
        self._process = multiprocessing.get_context("spawn").Process(
            target=run_engine_core, args=(self.engine_args, input_address, output_address),
            name="EngineCore", daemon=True)
        self._process.start()
        while True:  # poll in slices, so a core that dies while loading is noticed
            if await self._output.poll(timeout=200):
                message = await self._output.recv_pyobj()
                break
            timeout_s -= 0.2
            if not self._process.is_alive() or timeout_s <= 0:
                raise EngineDeadError(f"the engine core did not start (exit code {self._process.exitcode})")
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
        """Run `LLMEngine.<method>(*args)` in the core and return its result (`get_output` delivers it, so
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
            while not await self._output.poll(timeout=1000):
                if not self.is_alive():
                    raise EngineDeadError(f"the engine core exited (exit code {self._process.exitcode})")
            message = await self._output.recv_pyobj()
            if isinstance(message, UtilityOutput):
                future = self._pending_calls.pop(message.call_id)
                if isinstance(message.result, BaseException):  # the call raised in the core
                    future.set_exception(message.result)
                else:
                    future.set_result(message.result)
                continue
            return message

    def is_alive(self) -> bool:
        return self._process is not None and self._process.is_alive()

    async def shutdown(self, timeout_s: float = 10.0) -> None:
        """Ask the core to abort what it still runs and exit (its last outputs can still be read);
        terminate it if it does not."""
        if self._process is not None and self._process.is_alive():
            await self._input.send_pyobj(Shutdown())
            await asyncio.to_thread(self._process.join, timeout_s)
            if self._process.is_alive():
                self._process.terminate()
                await asyncio.to_thread(self._process.join, timeout_s)

    def close(self) -> None:
        """Close the sockets (after `shutdown`, once nobody reads outputs any more)."""
        for future in self._pending_calls.values():
            future.cancel()
        self._context.destroy(linger=0)
        self._folder.cleanup()
