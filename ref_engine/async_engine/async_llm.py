"""`AsyncLLM`: the engine as the API server sees it, one async stream of `RequestOutput` per request.

`generate(prompt, params, request_id)` sends the request to the engine-core process (through
`AsyncMPClient`, ref_engine/engine_core/client.py) and yields its
deltas as steps produce them, the last with `finished=True`. One task (`_output_handler`) reads the
core's outputs and puts each into its request's queue, so a slow client only fills its own queue. When the
consumer stops early (the HTTP client disconnected: the server closes or cancels the iterator), the
request is aborted in the core, which frees its KV blocks. A request the core failed raises
`EngineGenerateError` in its own stream only, and so does an output this process fails to handle. A core
that dies (its executor lost a worker, or the process itself was killed) ends every open stream with
`EngineDeadError`, and so does every later `generate`: the server answers both with a 503.
With the dashboard on (`EngineCoreArgs.dashboard`), the core's step summaries and each tenant's service go
into `step_feed` (step_feed.py), which `serve --dashboard`'s page reads.

Lesson: lessons/06-architecture-map.md (the engine core and the API server).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from core.request import DEFAULT_TENANT
from ref_engine.async_engine.prometheus import PrometheusStatLogger
from ref_engine.async_engine.step_feed import StepFeed
from ref_engine.engine_core.client import AsyncMPClient, EngineDeadError
from ref_engine.engine_core.core import EngineCoreArgs
from ref_engine.engine_core.messages import (
    EngineCoreOutputs,
    EngineCoreReady,
    EngineCoreRequest,
    RequestError,
)
from ref_engine.engine_core.tracing import RequestTracer
from ref_engine.model.loader import load_tokenizer
from ref_engine.model.tokenizer import Tokenizer
from ref_engine.outputs import RequestOutput
from ref_engine.sampling_params import RequestOutputKind, SamplingParams

logger = logging.getLogger(__name__)


class EngineGenerateError(RuntimeError):
    """The engine failed this request; `invalid` when the request itself was at fault."""

    def __init__(self, request_id: str, error: RequestError) -> None:
        super().__init__(f"request {request_id}: {error.message}")
        self.invalid = error.invalid


@dataclass
class _Stream:
    """One open request: its outputs' queue, whether its first output came (its prompt is counted then),
    and whose it is."""

    queue: asyncio.Queue[RequestOutput | RequestError | EngineDeadError] = field(default_factory=asyncio.Queue)
    started: bool = False
    tenant: str = DEFAULT_TENANT


class AsyncLLM:
    def __init__(self, engine_args: EngineCoreArgs, model_name: str | None = None) -> None:
        """`model_name`: the name clients use (the model's id if None)."""
        self.engine_args = engine_args
        self.client = AsyncMPClient(engine_args)
        self.model_name = model_name
        self.model_config: EngineCoreReady | None = None
        self.tokenizer: Tokenizer | None = None
        self.stat_logger: PrometheusStatLogger | None = None
        self._streams: dict[str, _Stream] = {}  # open requests only: a stream leaves as it ends
        self._output_task: asyncio.Task[None] | None = None
        self.dead_error: str | None = None  # why the engine core is gone, once it is
        self.tracer = RequestTracer() if engine_args.trace_requests else None  # --trace-requests
        self.step_feed = StepFeed() if engine_args.dashboard else None  # --dashboard

    async def start(self) -> None:
        """Start the engine core and load the tokenizer here, both before serving a request."""
        self.tokenizer, self.model_config = await asyncio.gather(
            asyncio.to_thread(load_tokenizer, self.engine_args.model), self.client.start())
        self.model_name = self.model_name or self.model_config.model_id
        self.stat_logger = PrometheusStatLogger(self.model_name)
        self._output_task = asyncio.create_task(self._output_handler(), name="AsyncLLM.output_handler")

    @property
    def num_open_streams(self) -> int:
        """Requests sent to the engine whose streams are still open (what admission control counts)."""
        return len(self._streams)

    async def generate(self, prompt: dict[str, Any], params: SamplingParams, request_id: str,
                       arrival_time: float | None = None) -> AsyncIterator[RequestOutput]:
        """Stream one request's outputs. `prompt` is `LLMEngine.add_request`'s dict form; `arrival_time`
        (time.perf_counter()) is when the request reached the server, where TTFT and e2e latency start
        (None: now)."""
        if self.dead_error is not None:
            raise EngineDeadError(self.dead_error)
        if request_id in self._streams:
            raise ValueError(f"request_id {request_id!r} is already in use")
        stream = self._streams[request_id] = _Stream(tenant=prompt.get("tenant") or DEFAULT_TENANT)
        queue = stream.queue
        arrival_time = time.perf_counter() if arrival_time is None else arrival_time
        params = dataclasses.replace(params, output_kind=RequestOutputKind.DELTA)
        finished = False
        try:
            if self.tracer is not None:
                self.tracer.record(request_id, "sent_to_core")
            await self.client.add_request(EngineCoreRequest(request_id, prompt, params, arrival_time))
            while not finished:
                item = await queue.get()
                if isinstance(item, EngineDeadError):
                    finished = True
                    raise item
                if isinstance(item, RequestError):
                    finished = True
                    raise EngineGenerateError(request_id, item)
                if item.error is not None:
                    finished = True
                    raise EngineGenerateError(request_id, RequestError(item.error))
                finished = item.finished
                yield item
        finally:
            self._streams.pop(request_id, None)
            if not finished:  # the consumer left early: free the request's blocks in the core
                self.abort(request_id)

    def abort(self, request_id: str) -> None:
        self._streams.pop(request_id, None)
        if self.dead_error is None:
            self.client.abort_requests([request_id])
        self.stat_logger.record_abort()

    def abort_all(self, reason: str) -> None:
        """End every open stream with `EngineDeadError(reason)` (the server is going, so the client should
        retry elsewhere: a 503) and abort its request in the core, which frees its blocks: the end of a
        graceful shutdown whose requests outlived the drain."""
        self._end_streams(EngineDeadError(reason), abort_in_core=True)

    async def reset_prefix_cache(self, tenant: str | None = None) -> bool:
        """Forget the prefix cache (only `tenant`'s entries when given), under load too: blocks in use leave
        the cache index now and are freed when their requests finish."""
        return await self.client.call_utility("reset_prefix_cache", *(() if tenant is None else (tenant,)))

    async def _output_handler(self) -> None:
        try:
            while True:
                outputs = await self.client.get_output()
                if self.tracer is not None:
                    self._trace(outputs)
                self.stat_logger.record_stats(outputs)
                if self.step_feed is not None:
                    self.step_feed.add(outputs.step_summaries)
                for output in outputs.outputs:
                    self._route(output)
                for request_id, error in outputs.errors.items():
                    stream = self._streams.get(request_id)
                    if stream is not None:
                        stream.queue.put_nowait(error)
        except EngineDeadError as error:
            logger.error("%s", error)
            self._fail_all(str(error))
        except Exception:  # a bug here would leave every stream waiting forever: end them instead
            logger.exception("the output handler failed")
            self._fail_all("the server's output handler failed")

    def _route(self, output: RequestOutput) -> None:
        """Count one output and hand it to its stream (None: aborted meanwhile). An error here fails this
        request only: a bug in one output's handling must not end every stream."""
        stream = self._streams.get(output.request_id)
        try:
            first = stream is not None and not stream.started
            self.stat_logger.record_output(output, first=first)
            if self.step_feed is not None and stream is not None:
                self.step_feed.add_service(stream.tenant, len(output.outputs[0].token_ids)
                                           + (len(output.prompt_token_ids) if first else 0))
        except Exception as error:
            logger.exception("request %s: its output could not be handled", output.request_id)
            if stream is not None:
                stream.queue.put_nowait(RequestError(f"the server failed on this request's output: "
                                                     f"{type(error).__name__}"))
                self.abort(output.request_id)
            return
        if stream is not None:
            stream.started = True
            stream.queue.put_nowait(output)

    def _trace(self, outputs: EngineCoreOutputs) -> None:
        """Keep the core's events, and when each output reached this process."""
        self.tracer.add(outputs.trace_events)
        for output in outputs.outputs:
            self.tracer.record(output.request_id, "output_received",
                               num_tokens=len(output.outputs[0].token_ids), finished=output.finished)

    def _fail_all(self, message: str) -> None:
        """The core is gone (or going): end every open stream with `EngineDeadError(message)`, which the
        server answers with a 503 (no request's fault: retry elsewhere), as it answers new requests now."""
        self.dead_error = message
        self._end_streams(EngineDeadError(message), abort_in_core=False)

    def _end_streams(self, error: Exception, *, abort_in_core: bool) -> None:
        """Put `error` on every open stream; with `abort_in_core`, also abort its request in the core, which
        frees its blocks (pointless once the core is gone)."""
        for request_id, stream in list(self._streams.items()):
            stream.queue.put_nowait(error)
            if abort_in_core:
                self.abort(request_id)

    async def shutdown(self) -> None:
        """Graceful: the core aborts what it runs (freeing the blocks) and exits; open streams end."""
        await self.client.shutdown()
        if self._output_task is not None:
            self._output_task.cancel()
            await asyncio.gather(self._output_task, return_exceptions=True)
        self._fail_all("the server is shutting down")
        self.client.close()
