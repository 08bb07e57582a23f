"""`OpenAIServingChat`: POST /v1/chat/completions. The messages go through the model's chat template
(or the server's `--chat-template`), then as a completion; the stream's first chunk of each choice
carries the assistant role, as OpenAI's does.

Lesson: lessons/06-architecture-map.md (the API server).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from jinja2 import TemplateError

from ref_engine.entrypoints.openai.logprobs import chat_logprobs
from ref_engine.entrypoints.openai.protocol import ChatCompletionRequest, ChatMessage
from ref_engine.entrypoints.openai.serving import (
    OpenAIError,
    OpenAIServing,
    accumulate,
    created,
    sse,
    usage,
)


class OpenAIServingChat(OpenAIServing):
    def render(self, messages: list[ChatMessage]) -> list[int]:
        """The prompt's token ids: the chat template's text, tokenized without adding specials again."""
        tokenizer = self.engine.tokenizer
        try:
            text = tokenizer.apply_chat_template([m.model_dump(exclude_none=True) for m in messages])
        except (ValueError, TemplateError) as error:
            raise OpenAIError(400, f"the chat template failed: {error}", "messages") from None
        return tokenizer.encode(text, add_special_tokens=False)

    async def create_chat_completion(self, request: ChatCompletionRequest, request_id: str,
                                     tenant: str | None) -> dict[str, Any] | AsyncIterator[str]:
        self.check_model(request.model)
        self.check_supported(request)
        if request.top_logprobs is not None and not request.logprobs:
            raise OpenAIError(400, "top_logprobs needs logprobs=true", "top_logprobs")
        token_ids = self.render(request.messages)
        self.trace(request_id, "tokenized", num_prompt_tokens=len(token_ids))
        max_tokens = request.max_completion_tokens if request.max_completion_tokens is not None else request.max_tokens
        num_logprobs = (request.top_logprobs or 0) if request.logprobs else None
        params = self.sampling_params(request, self.check_prompt(token_ids, max_tokens, "messages"), num_logprobs)
        prompt = self.engine_prompt(token_ids, request, tenant)
        choices = self.choices(request_id, 1, request, [params])
        head = {"id": f"chatcmpl-{request_id}", "created": created(), "model": self.served_model_name}
        stream = self.generate(choices, [prompt])
        if request.stream:
            return self._stream(stream, head, request, len(token_ids), [c.index for c in choices])
        results = await accumulate(stream)
        body = [{"index": i, "message": {"role": "assistant", "content": r.text},
                 "logprobs": self._logprobs(num_logprobs, r.token_ids, r.logprobs),
                 "finish_reason": r.finish_reason, "stop_reason": r.stop_reason}
                for i, r in sorted(results.items())]
        return {**head, "object": "chat.completion", "choices": body,
                "usage": usage(len(token_ids), sum(len(r.token_ids) for r in results.values()))}

    async def _stream(self, stream: AsyncIterator, head: dict[str, Any], request: ChatCompletionRequest,
                      num_prompt_tokens: int, indices: list[int]) -> AsyncIterator[str]:
        head = {**head, "object": "chat.completion.chunk"}
        num_logprobs = (request.top_logprobs or 0) if request.logprobs else None
        for index in indices:
            yield sse({**head, "choices": [{"index": index, "delta": {"role": "assistant", "content": ""},
                                            "logprobs": None, "finish_reason": None}]})
        num_tokens = 0
        try:
            async for choice, output in stream:
                completion = output.outputs[0]
                num_tokens += len(completion.token_ids)
                chunk = sse({**head, "choices": [{
                    "index": choice.index, "delta": {"content": completion.text},
                    "logprobs": self._logprobs(num_logprobs, completion.token_ids, completion.logprobs),
                    "finish_reason": completion.finish_reason, "stop_reason": completion.stop_reason}]})
                self.trace(choice.request_id, "chunk_sent", num_tokens=len(completion.token_ids))
                yield chunk
        except OpenAIError as error:
            yield sse(error.body())
        if request.stream_options and request.stream_options.include_usage:
            yield sse({**head, "choices": [], "usage": usage(num_prompt_tokens, num_tokens)})
        yield sse("[DONE]")

    def _logprobs(self, num: int | None, token_ids: list[int], entries: list | None) -> dict[str, Any] | None:
        if num is None or entries is None:
            return None
        return chat_logprobs(self.engine.tokenizer, token_ids, entries, num)
