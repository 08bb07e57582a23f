"""The request bodies of the OpenAI API that the server accepts, as pydantic models with OpenAI's names,
plus vLLM's extra fields (top_k, min_p, stop_token_ids, min_tokens, ignore_eos, priority, cache_salt).

Unknown fields are refused (`extra="forbid"`): a misspelt parameter silently ignored would be a wrong
answer, so it is a 400 naming the field. Fields OpenAI defines but this engine cannot honour
(penalties, logit_bias, echo, ...) are accepted only at their no-op values; `UNSUPPORTED` says which.

Lesson: lessons/06-architecture-map.md (the API server).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class OpenAIBaseModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(OpenAIBaseModel):
    include_usage: bool = False


class SamplingFields(OpenAIBaseModel):
    """What both endpoints share: the model, the sampling parameters, streaming and the tenant."""

    model: str | None = None
    n: int = 1
    temperature: float | None = None  # None: 1.0, OpenAI's default
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    priority: int = 0
    cache_salt: str | None = None
    # OpenAI's fields this engine has no mechanism for: accepted at the value that means "off"
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[str, float] | None = None


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = 16
    logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")  # name, tool_call_id, ...: passed to the chat template

    role: str
    content: str | list[dict[str, Any]] | None = None


class ChatCompletionRequest(SamplingFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: int | None = None  # deprecated by OpenAI in favour of max_completion_tokens
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    response_format: dict[str, Any] | None = None


class TokenizeRequest(OpenAIBaseModel):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True


class DetokenizeRequest(OpenAIBaseModel):
    model: str | None = None
    tokens: list[int]


# field -> (the value that means "not used", why it is refused otherwise)
UNSUPPORTED: dict[str, tuple[Any, str]] = {
    "presence_penalty": (0.0, "penalties are not implemented by this engine"),
    "frequency_penalty": (0.0, "penalties are not implemented by this engine"),
    "repetition_penalty": (1.0, "penalties are not implemented by this engine"),
    "logit_bias": (None, "logit_bias is not implemented by this engine"),
    "echo": (False, "echo is not implemented by this server"),
    "suffix": (None, "suffix (insertion) is not supported by this model"),
    "tools": (None, "tool calling is not implemented by this server"),
    "response_format": (None, "structured output is not implemented by this server"),
}

ErrorType = Literal["invalid_request_error", "authentication_error", "not_found_error", "rate_limit_error",
                    "server_error", "service_unavailable"]
