"""`OpenAIServingChat`: POST /v1/chat/completions. The messages go through the model's chat template
(or the server's `--chat-template`), then as a completion; the stream's first chunk of each choice
carries the assistant role, as OpenAI's does. A message's `content` is a string or, in OpenAI's schema, a
list of parts: text parts are joined (one per line) into the string the template sees; other part types
(images, audio) are a 400 naming the type, since the model reads text only.

Lesson: lessons/06-architecture-map.md (the API server).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from jinja2 import TemplateError

from ref_engine.entrypoints.openai.logprobs import chat_logprobs
from ref_engine.entrypoints.openai.protocol import ChatCompletionRequest, ChatMessage
from ref_engine.entrypoints.openai.serving import (
    Choice,
    OpenAIError,
    OpenAIServing,
    accumulate,
    check_text,
    created,
    sse,
    usage,
)
from ref_engine.outputs import CompletionOutput


class OpenAIServingChat(OpenAIServing):
    def render(self, messages: list[ChatMessage]) -> list[int]:
        """The prompt's token ids: the chat template's text, tokenized without adding specials again."""
        tokenizer = self.engine.tokenizer
        try:
            text = tokenizer.apply_chat_template([_template_message(i, m) for i, m in enumerate(messages)])
        except (ValueError, TemplateError) as error:
            raise OpenAIError(400, f"the chat template failed: {error}", "messages") from None
        check_text(text, "messages")  # any field of any message
        return tokenizer.encode(text, add_special_tokens=False)

    async def create_chat_completion(self, request: ChatCompletionRequest, request_id: str, tenant: str | None,
                                     arrival_time: float | None = None) -> dict[str, Any] | AsyncIterator[str]:
        self.check_model(request.model)
        self.check_supported(request)
        if request.top_logprobs is not None and not request.logprobs:
            raise OpenAIError(400, "top_logprobs needs logprobs=true", "top_logprobs")
        token_ids = self.render(request.messages)
        self.trace(request_id, "tokenized", num_prompt_tokens=len(token_ids))
        max_tokens = request.max_completion_tokens if request.max_completion_tokens is not None else request.max_tokens
        num_logprobs = (request.top_logprobs or 0) if request.logprobs else None
        params = self.sampling_params(request, self.check_prompt(token_ids, max_tokens, "messages"), num_logprobs,
                                      "top_logprobs")
        prompt = self.engine_prompt(token_ids, request, tenant)
        choices = self.choices(request_id, 1, request, [params])
        reservation = self.admit(tenant, choices, [prompt])  # no await since the checks: atomic
        head = {"id": f"chatcmpl-{request_id}", "created": created(), "model": self.served_model_name}
        stream = self.generate(choices, [prompt], reservation, arrival_time)
        if request.stream:
            return self._stream(stream, head, request, len(token_ids), [c.index for c in choices])
        results, cached = await accumulate(stream)
        body = [{"index": i, "message": {"role": "assistant", "content": r.text},
                 "logprobs": self._logprobs(num_logprobs, r.token_ids, r.logprobs),
                 "finish_reason": r.finish_reason, "stop_reason": r.stop_reason}
                for i, r in sorted(results.items())]
        return {**head, "object": "chat.completion", "choices": body,
                "usage": usage(len(token_ids), sum(len(r.token_ids) for r in results.values()), cached)}

    async def _stream(self, stream: AsyncIterator, head: dict[str, Any], request: ChatCompletionRequest,
                      num_prompt_tokens: int, indices: list[int]) -> AsyncIterator[str]:
        head = {**head, "object": "chat.completion.chunk"}
        num_logprobs = (request.top_logprobs or 0) if request.logprobs else None
        for index in indices:
            yield sse({**head, "choices": [{"index": index, "delta": {"role": "assistant", "content": ""},
                                            "logprobs": None, "finish_reason": None}]})
        def delta(choice: Choice, completion: CompletionOutput) -> dict[str, Any]:
            return {"index": choice.index, "delta": {"content": completion.text},
                    "logprobs": self._logprobs(num_logprobs, completion.token_ids, completion.logprobs),
                    "finish_reason": completion.finish_reason, "stop_reason": completion.stop_reason}

        async for chunk in self.stream_sse(stream, head, request.stream_options, num_prompt_tokens, delta):
            yield chunk

    def _logprobs(self, num: int | None, token_ids: list[int], entries: list | None) -> dict[str, Any] | None:
        if num is None or entries is None:
            return None
        return chat_logprobs(self.engine.tokenizer, token_ids, entries, num)


def _template_message(index: int, message: ChatMessage) -> dict[str, Any]:
    """The message as the chat template reads it: `content` as one string (text parts joined)."""
    data = message.model_dump(exclude_none=True)
    if isinstance(message.content, list):
        texts = []
        for j, part in enumerate(message.content):
            kind = part.get("type")
            if kind != "text" or not isinstance(part.get("text"), str):
                raise OpenAIError(400, f"messages[{index}].content[{j}]: a part of type {kind!r} is not supported; "
                                       "this server takes text parts only ({\"type\": \"text\", \"text\": ...})",
                                  "messages")
            texts.append(part["text"])
        data["content"] = "\n".join(texts)
    return data
