"""`OpenAIServingCompletion`: POST /v1/completions, streamed (one SSE chunk per step's delta of each
choice, `data: [DONE]` last) or as one response.

A prompt is a string, a list of strings, a list of token ids or a list of those; each prompt gets `n`
choices, numbered prompt by prompt (choice `p * n + i`), as OpenAI numbers them.

Lesson: lessons/06-architecture-map.md (the API server).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from ref_engine.entrypoints.openai.logprobs import completion_logprobs
from ref_engine.entrypoints.openai.protocol import CompletionRequest
from ref_engine.entrypoints.openai.serving import (
    Choice,
    OpenAIError,
    OpenAIServing,
    accumulate,
    check_text,
    created,
    usage,
)
from ref_engine.outputs import CompletionOutput


class OpenAIServingCompletion(OpenAIServing):
    def prompts(self, request: CompletionRequest) -> list[list[int]]:
        """Token ids of each prompt."""
        prompt = request.prompt
        if isinstance(prompt, str):
            prompt = [prompt]
        if not prompt:
            raise OpenAIError(400, "prompt is empty", "prompt")
        if isinstance(prompt[0], int):
            prompt = [prompt]
        for text in prompt:
            if isinstance(text, str):
                check_text(text, "prompt")
        tokenizer = self.engine.tokenizer
        return [tokenizer.encode(p) if isinstance(p, str) else list(p) for p in prompt]

    async def create_completion(self, request: CompletionRequest, request_id: str, tenant: str | None,
                                arrival_time: float | None = None) -> dict[str, Any] | AsyncIterator[str]:
        """The response body, or the SSE stream when `request.stream`. `tenant`: the authenticated tenant or
        None; `arrival_time`: when the request reached the server (perf_counter)."""
        self.check_model(request.model)
        self.check_supported(request)
        if request.best_of is not None and request.best_of != request.n:
            raise OpenAIError(400, "best_of is not implemented by this server (only best_of == n)", "best_of")
        token_ids = self.prompts(request)
        self.trace(request_id, "tokenized", num_prompt_tokens=sum(len(ids) for ids in token_ids))
        params = [self.sampling_params(request, self.check_prompt(ids, request.max_tokens, "prompt"),
                                       request.logprobs) for ids in token_ids]
        prompts = [self.engine_prompt(ids, request, tenant) for ids in token_ids]
        choices = self.choices(request_id, len(prompts), request, params)
        reservation = self.admit(tenant, choices, prompts)  # no await since the checks: atomic
        num_prompt_tokens = sum(len(ids) for ids in token_ids)
        head = {"id": f"cmpl-{request_id}", "object": "text_completion", "created": created(),
                "model": self.served_model_name}
        stream = self.generate(choices, prompts, reservation, arrival_time)
        if request.stream:
            return self._stream(stream, head, request, num_prompt_tokens)
        results, cached = await accumulate(stream)
        body = [{"index": i, "text": r.text, "finish_reason": r.finish_reason, "stop_reason": r.stop_reason,
                 "logprobs": self._logprobs(request, r.token_ids, r.logprobs, 0)}
                for i, r in sorted(results.items())]
        return {**head, "choices": body,
                "usage": usage(num_prompt_tokens, sum(len(r.token_ids) for r in results.values()), cached)}

    def _stream(self, stream: AsyncIterator, head: dict[str, Any], request: CompletionRequest,
                num_prompt_tokens: int) -> AsyncIterator[str]:
        text_offsets: dict[int, int] = {}  # each choice's text so far, where its logprobs' offsets start

        def delta(choice: Choice, completion: CompletionOutput) -> dict[str, Any]:
            offset = text_offsets.get(choice.index, 0)
            text_offsets[choice.index] = offset + len(completion.text)
            return {"index": choice.index, "text": completion.text, "finish_reason": completion.finish_reason,
                    "stop_reason": completion.stop_reason,
                    "logprobs": self._logprobs(request, completion.token_ids, completion.logprobs, offset)}

        return self.stream_sse(stream, head, request.stream_options, num_prompt_tokens, delta)

    def _logprobs(self, request: CompletionRequest, token_ids: list[int], entries: list | None,
                  text_offset: int) -> dict[str, Any] | None:
        if request.logprobs is None or entries is None:
            return None
        return completion_logprobs(self.engine.tokenizer, token_ids, entries, request.logprobs, text_offset)
