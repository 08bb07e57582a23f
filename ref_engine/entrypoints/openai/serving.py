"""`OpenAIServing`: what the completion and chat endpoints share, from an HTTP request to engine requests
and back (vLLM's `serving_engine.py`).

It checks the model name and the parameters (`OpenAIError` with a status and the field at fault, never a
500 for bad input: a lone surrogate in a string is a 400 here, before it can reach the engine core),
tokenizes, checks the prompt and `max_tokens` against the context, admits the request (admission.py: the
server's and the tenant's pending caps and token budget, checked and reserved in one synchronous call),
and fans one request out into engine requests, one per prompt and choice (`n`: vLLM's parallel sampling,
each choice its own request, seeded `seed + i`). Their streams are merged into one stream of (choice
index, delta), and leaving that stream early (the client went away) aborts every engine request it started.

Engine request ids are `<X-Request-Id>-<choice>-<8 hex>`: the client's id, so a trace is found by it,
made unique, so two requests that reuse an id never collide in the engine.

Tenants: `tenant` is the authenticated tenant (from an API key) or None (a server without keys is one
tenant, tenants.py); it goes into the engine prompt as "tenant", which isolates the prefix cache. The
request's `user` goes in as "user", which only groups requests for the "fair" policy.

Lesson: lessons/06-architecture-map.md (the API server).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from ref_engine.async_engine.async_llm import AsyncLLM, EngineGenerateError
from ref_engine.engine_core.client import EngineDeadError
from ref_engine.entrypoints.openai.admission import Admission, AdmissionRefused, Reservation
from ref_engine.entrypoints.openai.protocol import UNSUPPORTED, ErrorType, SamplingFields, StreamOptions
from ref_engine.outputs import CompletionOutput, RequestOutput
from ref_engine.sampling_params import SamplingParams

ERROR_TYPES: dict[int, ErrorType] = {400: "invalid_request_error", 401: "authentication_error",
                                     403: "permission_error", 404: "not_found_error",
                                     405: "invalid_request_error", 409: "invalid_request_error",
                                     413: "invalid_request_error", 429: "rate_limit_error", 500: "server_error",
                                     503: "service_unavailable"}

# the reason label of serving_lab:request_failures_total when the error does not name a finer one
REASONS = {400: "invalid_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
           405: "method_not_allowed", 409: "conflict", 413: "body_too_large", 429: "rate_limited",
           499: "client_closed", 500: "engine_error", 503: "unavailable"}

DEFAULT_MAX_LOGPROBS = 20  # vLLM's `max_logprobs`: a larger request is a 400, not megabytes of JSON


class OpenAIError(Exception):
    """An error the client sees in OpenAI's schema: {"error": {"message", "type", "param", "code"}};
    `headers` go with the response (Retry-After, Allow); `reason` labels it in the failure counter."""

    def __init__(self, status: int, message: str, param: str | None = None, *,
                 headers: dict[str, str] | None = None, reason: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param
        self.headers = headers or {}
        self.reason = reason or REASONS.get(status, str(status))

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": ERROR_TYPES.get(self.status, "invalid_request_error"),
                          "param": self.param, "code": self.status}}


def sse(data: dict[str, Any] | str) -> str:
    """One Server-Sent Event."""
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"


def check_text(value: str, param: str) -> None:
    """A 400 for a string that is not valid Unicode (a lone surrogate, which JSON's \\ud800 escape can
    carry): no tokenizer or hash could encode it."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as error:
        raise OpenAIError(400, f"{param} is not valid Unicode: a lone surrogate "
                               f"({value[error.start]!r}) at character {error.start}", param) from None


@dataclass
class Choice:
    """One engine request behind a response: which prompt it continues and its choice index."""

    index: int
    prompt_index: int
    request_id: str
    params: SamplingParams


class OpenAIServing:
    def __init__(self, engine: AsyncLLM, served_model_name: str, admission: Admission,
                 allow_streaming: bool = True, max_logprobs: int = DEFAULT_MAX_LOGPROBS) -> None:
        """`admission`: shared by every endpoint, so the caps count all open requests."""
        self.engine = engine
        self.served_model_name = served_model_name
        self.admission = admission
        self.allow_streaming = allow_streaming  # False: a deployment whose manifest says `api.stream: false`
        self.max_logprobs = max_logprobs

    # ---- checks ----

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.served_model_name:
            raise OpenAIError(404, f"the model {model!r} does not exist; this server serves "
                                   f"{self.served_model_name!r}", "model")

    def check_supported(self, request: SamplingFields) -> None:
        """A 400 for each field OpenAI defines that this engine cannot honour, set to a value that does
        something; for `priority` unless the engine schedules by priority; for strings that are not
        valid Unicode."""
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
        stops = [request.stop] if isinstance(request.stop, str) else request.stop or []
        for name, value in (("user", request.user), ("cache_salt", request.cache_salt), *(("stop", s) for s in stops)):
            if value is not None:
                check_text(value, name)

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

    def sampling_params(self, request: SamplingFields, max_tokens: int, logprobs: int | None,
                        logprobs_param: str = "logprobs") -> SamplingParams:
        """The engine's `SamplingParams`; its own checks become 400s naming the field. `logprobs` beyond
        `max_logprobs` is refused here, as vLLM does (`logprobs_param`: the field that asked for them)."""
        if logprobs is not None and logprobs > self.max_logprobs:
            raise OpenAIError(400, f"{logprobs_param}={logprobs} is more than this server's maximum of "
                                   f"{self.max_logprobs} (--max-logprobs)", logprobs_param)
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

    def stream_error(self, error: OpenAIError) -> str:
        """The SSE event that ends a stream which failed after its 200 went out, counted as a failure."""
        self.engine.stat_logger.record_failure(error.reason, error.status)
        return sse(error.body())

    async def stream_sse(self, stream: AsyncIterator[tuple[Choice, RequestOutput]], head: dict[str, Any],
                         stream_options: StreamOptions | None, num_prompt_tokens: int,
                         choice_delta: Callable[[Choice, CompletionOutput], dict[str, Any]]) -> AsyncIterator[str]:
        """The SSE body of a streamed response, the same for both routes but for each choice's delta
        (`choice_delta`): one chunk per delta, an error event if the engine fails after the 200, the usage
        chunk when the client asked for it, then `[DONE]`."""
        num_tokens = 0
        cached = CachedTokens()
        try:
            async for choice, output in stream:
                cached.add(choice, output)
                completion = output.outputs[0]
                num_tokens += len(completion.token_ids)
                chunk = sse({**head, "choices": [choice_delta(choice, completion)]})
                self.trace(choice.request_id, "chunk_sent", num_tokens=len(completion.token_ids))
                yield chunk
        except OpenAIError as error:
            yield self.stream_error(error)
        if stream_options and stream_options.include_usage:
            yield sse({**head, "choices": [], "usage": usage(num_prompt_tokens, num_tokens, cached)})
        yield sse("[DONE]")

    def trace(self, request_id: str, event: str, **attrs: Any) -> None:
        """Record an API-server event of this HTTP request when the server traces requests."""
        if self.engine.tracer is not None:
            self.engine.tracer.record(request_id, event, **attrs)

    # ---- generation ----

    def choices(self, request_id: str, num_prompts: int, request: SamplingFields,
                params: list[SamplingParams]) -> list[Choice]:
        """One engine request per prompt and choice, each with an id of its own (see the module docstring)."""
        unique = uuid.uuid4().hex[:8]
        choices = []
        for p in range(num_prompts):
            for i in range(request.n):
                seeded = params[p] if request.seed is None else _with_seed(params[p], request.seed + i)
                index = p * request.n + i
                choices.append(Choice(index, p, f"{request_id}-{index}-{unique}", seeded))
        return choices

    def admit(self, tenant: str | None, choices: list[Choice], prompts: list[dict[str, Any]]) -> Reservation:
        """Reserve the choices' slots (and their tokens: prompt + max_tokens each), or refuse: 400 when no
        wait could help, 429 (with Retry-After for a spent budget) when a later retry can succeed."""
        num_tokens = sum(len(prompts[c.prompt_index]["prompt_token_ids"]) + c.params.max_tokens for c in choices)
        try:
            return self.admission.admit(tenant, len(choices), num_tokens)
        except AdmissionRefused as refused:
            headers = {} if refused.retry_after_s is None else {"Retry-After": str(refused.retry_after_s)}
            raise OpenAIError(refused.status, refused.message, refused.param, headers=headers,
                              reason=refused.reason) from None

    def engine_prompt(self, token_ids: list[int], request: SamplingFields, tenant: str | None) -> dict[str, Any]:
        """`LLMEngine.add_request`'s dict form: "tenant" only for an authenticated tenant, "user" when the
        client gave one (scheduling only), "cache_salt" when given."""
        prompt: dict[str, Any] = {"prompt_token_ids": token_ids, "priority": request.priority}
        if tenant:
            prompt["tenant"] = tenant
        if request.user:
            prompt["user"] = request.user
        if request.cache_salt is not None:
            if not request.cache_salt:
                raise OpenAIError(400, "cache_salt must be a non-empty string", "cache_salt")
            prompt["cache_salt"] = request.cache_salt
        return prompt

    def generate(self, choices: list[Choice], prompts: list[dict[str, Any]], reservation: Reservation,
                 arrival_time: float | None = None) -> AsyncIterator[tuple[Choice, RequestOutput]]:
        """Start every choice's engine request now and return their deltas as they come, merged; closing
        the stream early aborts them all. Each choice gives its slot of `reservation` back when it ends,
        however it ends (a task's done callback runs even if the task was cancelled before it started).
        `arrival_time`: when the HTTP request reached the server (perf_counter), where latencies start."""
        queue: asyncio.Queue[tuple[Choice, RequestOutput | BaseException | None]] = asyncio.Queue()
        tasks = []
        for choice in choices:
            task = asyncio.create_task(self._pump(choice, prompts[choice.prompt_index], arrival_time, queue))
            task.add_done_callback(lambda _: reservation.release())
            tasks.append(task)
        return _merged(queue, tasks)

    async def _pump(self, choice: Choice, prompt: dict[str, Any], arrival_time: float | None,
                    queue: asyncio.Queue[tuple[Choice, RequestOutput | BaseException | None]]) -> None:
        stream = self.engine.generate(prompt, choice.params, choice.request_id, arrival_time=arrival_time)
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


async def _merged(queue: asyncio.Queue[tuple[Choice, RequestOutput | BaseException | None]],
                  tasks: list[asyncio.Task[None]]) -> AsyncIterator[tuple[Choice, RequestOutput]]:
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


class CachedTokens:
    """Prompt tokens the prefix cache served, for usage's `prompt_tokens_details.cached_tokens`: per prompt
    the most any of its choices got (each choice looks its prompt up on its own), summed over prompts."""

    def __init__(self) -> None:
        self._by_prompt: dict[int, int] = {}

    def add(self, choice: Choice, output: RequestOutput) -> None:
        self._by_prompt[choice.prompt_index] = max(self._by_prompt.get(choice.prompt_index, 0),
                                                   output.num_cached_tokens)

    @property
    def total(self) -> int:
        return sum(self._by_prompt.values())


async def accumulate(stream: AsyncIterator[tuple[Choice, RequestOutput]]
                     ) -> tuple[dict[int, Accumulated], CachedTokens]:
    """Each choice's completion, by choice index, and the prompts' cached tokens."""
    results: dict[int, Accumulated] = {}
    cached = CachedTokens()
    async for choice, output in stream:
        results.setdefault(choice.index, Accumulated()).add(output)
        cached.add(choice, output)
    return results, cached


def _with_seed(params: SamplingParams, seed: int) -> SamplingParams:
    return dataclasses.replace(params, seed=seed % 2**64)


def usage(prompt_tokens: int, completion_tokens: int, cached: CachedTokens) -> dict[str, Any]:
    """OpenAI's usage object, with `prompt_tokens_details.cached_tokens` (the prefix cache's hits)."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached.total}}


def created() -> int:
    return int(time.time())
