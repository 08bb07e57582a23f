"""`OpenAIServing`: what the completion and chat endpoints share, from an HTTP request to engine requests
and back (vLLM's `serving_engine.py`).

It checks the model name and the parameters (`OpenAIError` with a status and the field at fault, never a
500 for bad input), tokenizes, checks the prompt and `max_tokens` against the context, applies admission
control (a cap on open requests: 429 past it), and fans one request out into engine requests, one per
prompt and choice (`n`: vLLM's parallel sampling, each choice its own request, seeded `seed + i`). Their
streams are merged into one stream of (choice index, delta), and leaving that stream early (the client
went away) aborts every engine request it started.

Lesson: lessons/06-architecture-map.md (the API server).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from ref_engine.async_engine.async_llm import AsyncLLM, EngineGenerateError
from ref_engine.async_engine.core_client import EngineDeadError
from ref_engine.entrypoints.openai.protocol import UNSUPPORTED, ErrorType, SamplingFields
from ref_engine.outputs import RequestOutput
from ref_engine.sampling_params import SamplingParams

ERROR_TYPES: dict[int, ErrorType] = {400: "invalid_request_error", 401: "authentication_error",
                                     404: "not_found_error", 409: "invalid_request_error",
                                     413: "invalid_request_error", 429: "rate_limit_error", 500: "server_error",
                                     503: "service_unavailable"}


class OpenAIError(Exception):
    """An error the client sees in OpenAI's schema: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": ERROR_TYPES[self.status], "param": self.param,
                          "code": self.status}}


def sse(data: dict[str, Any] | str) -> str:
    """One Server-Sent Event."""
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"


@dataclass
class Choice:
    """One engine request behind a response: which prompt it continues and its choice index."""

    index: int
    prompt_index: int
    request_id: str
    params: SamplingParams


class OpenAIServing:
    def __init__(self, engine: AsyncLLM, served_model_name: str, max_pending_requests: int,
                 allow_streaming: bool = True) -> None:
        self.engine = engine
        self.served_model_name = served_model_name
        self.max_pending_requests = max_pending_requests
        self.allow_streaming = allow_streaming  # False: a deployment whose manifest says `api.stream: false`

    # ---- checks ----

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.served_model_name:
            raise OpenAIError(404, f"the model {model!r} does not exist; this server serves "
                                   f"{self.served_model_name!r}", "model")

    def check_supported(self, request: SamplingFields) -> None:
        """A 400 for each field OpenAI defines that this engine cannot honour, set to a value that does
        something; and for `priority` unless the engine schedules by priority."""
        for name, (off, why) in UNSUPPORTED.items():
            if getattr(request, name, off) != off:
                raise OpenAIError(400, f"{name}={getattr(request, name)!r}: {why}", name)
        if request.priority and self.engine.model_config.scheduling_policy != "priority":
            raise OpenAIError(400, f"priority={request.priority} needs a server started with "
                                   "--scheduling-policy priority", "priority")
        if request.n < 1:
            raise OpenAIError(400, f"n must be >= 1, got {request.n}", "n")
        if request.stream and not self.allow_streaming:
            raise OpenAIError(400, "this deployment does not stream (its manifest says api.stream: false); "
                                   "send stream=false", "stream")
        if request.stream_options is not None and not request.stream:
            raise OpenAIError(400, "stream_options is only allowed with stream=true", "stream_options")

    def check_prompt(self, token_ids: list[int], max_tokens: int | None, param: str) -> int:
        """`max_tokens`, or what the context leaves when it is None; 400 when the prompt or the prompt plus
        `max_tokens` does not fit `max_model_len`."""
        max_model_len = self.engine.model_config.max_model_len
        vocab_size = self.engine.model_config.vocab_size
        if not token_ids:
            raise OpenAIError(400, "the prompt is empty", param)
        bad = [t for t in token_ids if not 0 <= t < vocab_size]
        if bad:
            raise OpenAIError(400, f"token ids outside the vocabulary [0, {vocab_size}): {bad[:5]}", param)
        if len(token_ids) >= max_model_len:
            raise OpenAIError(400, f"the prompt has {len(token_ids)} tokens; this model's maximum context length "
                                   f"is {max_model_len} tokens, so at most {max_model_len - 1} fit", param)
        room = max_model_len - len(token_ids)
        if max_tokens is None:
            return room
        if max_tokens > room:
            raise OpenAIError(400, f"max_tokens={max_tokens} does not fit: the prompt has {len(token_ids)} tokens "
                                   f"and the maximum context length is {max_model_len}, so at most {room} remain",
                              "max_tokens")
        return max_tokens

    def sampling_params(self, request: SamplingFields, max_tokens: int, logprobs: int | None) -> SamplingParams:
        """The engine's `SamplingParams`; its own checks become 400s naming the field."""
        try:
            params = SamplingParams(
                max_tokens=max_tokens, temperature=1.0 if request.temperature is None else request.temperature,
                top_p=1.0 if request.top_p is None else request.top_p, top_k=request.top_k or 0,
                min_p=request.min_p or 0.0, seed=request.seed, stop=request.stop,
                stop_token_ids=request.stop_token_ids, min_tokens=request.min_tokens,
                ignore_eos=request.ignore_eos, logprobs=logprobs)
            params.validate_for_vocab(self.engine.model_config.vocab_size)
            return params
        except ValueError as error:
            message = str(error)
            raise OpenAIError(400, message, message.split(" ", 1)[0]) from None

    def trace(self, request_id: str, event: str, **attrs: Any) -> None:
        """Record an API-server event of this HTTP request when the server traces requests."""
        if self.engine.tracer is not None:
            self.engine.tracer.record(request_id, event, **attrs)

    # ---- generation ----

    def choices(self, request_id: str, num_prompts: int, request: SamplingFields,
                params: list[SamplingParams]) -> list[Choice]:
        """One engine request per prompt and choice; admission control refuses what would overflow."""
        total = num_prompts * request.n
        if self.engine.num_open_streams + total > self.max_pending_requests:
            raise OpenAIError(429, f"the server is at its limit of {self.max_pending_requests} open requests; "
                                   "retry later")
        choices = []
        for p in range(num_prompts):
            for i in range(request.n):
                seeded = params[p] if request.seed is None else _with_seed(params[p], request.seed + i)
                index = p * request.n + i
                choices.append(Choice(index, p, f"{request_id}-{index}", seeded))
        return choices

    def engine_prompt(self, token_ids: list[int], request: SamplingFields, tenant: str | None) -> dict[str, Any]:
        prompt: dict[str, Any] = {"prompt_token_ids": token_ids, "priority": request.priority}
        if tenant:
            prompt["tenant"] = tenant
        if request.cache_salt is not None:
            if not request.cache_salt:
                raise OpenAIError(400, "cache_salt must be a non-empty string", "cache_salt")
            prompt["cache_salt"] = request.cache_salt
        return prompt

    async def generate(self, choices: list[Choice], prompts: list[dict[str, Any]]
                       ) -> AsyncIterator[tuple[Choice, RequestOutput]]:
        """Every choice's deltas as they come, merged; closing this early aborts them all."""
        queue: asyncio.Queue[tuple[Choice, RequestOutput | BaseException | None]] = asyncio.Queue()

        async def pump(choice: Choice) -> None:
            stream = self.engine.generate(prompts[choice.prompt_index], choice.params, choice.request_id)
            try:
                async with contextlib.aclosing(stream):
                    async for output in stream:
                        queue.put_nowait((choice, output))
            except EngineGenerateError as error:
                queue.put_nowait((choice, OpenAIError(400 if error.invalid else 500, str(error))))
            except EngineDeadError as error:
                queue.put_nowait((choice, OpenAIError(503, str(error))))
            except Exception as error:
                queue.put_nowait((choice, error))
            queue.put_nowait((choice, None))

        tasks = [asyncio.create_task(pump(c)) for c in choices]
        try:
            remaining = len(tasks)
            while remaining:
                choice, item = await queue.get()
                if item is None:
                    remaining -= 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    yield choice, item
        finally:
            for task in tasks:
                task.cancel()  # a stream still open aborts its engine request as it closes


@dataclass
class Accumulated:
    """A choice's whole completion, summed from its deltas (for a response that does not stream)."""

    text: str = ""
    token_ids: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[dict[int, float]] = dataclasses.field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    def add(self, output: RequestOutput) -> None:
        completion = output.outputs[0]
        self.text += completion.text
        self.token_ids += completion.token_ids
        self.logprobs += completion.logprobs or []
        self.finish_reason, self.stop_reason = completion.finish_reason, completion.stop_reason


async def accumulate(stream: AsyncIterator[tuple[Choice, RequestOutput]]) -> dict[int, Accumulated]:
    """Each choice's completion, by choice index."""
    results: dict[int, Accumulated] = {}
    async for choice, output in stream:
        results.setdefault(choice.index, Accumulated()).add(output)
    return results


def _with_seed(params: SamplingParams, seed: int) -> SamplingParams:
    return dataclasses.replace(params, seed=seed % 2**64)


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def created() -> int:
    return int(time.time())
