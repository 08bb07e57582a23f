"""The engine's logprobs (per output token: {token id: logprob}, the chosen token first, then the top N)
in the two shapes OpenAI's API returns them: the legacy completions shape (parallel lists) and the chat
shape (one object per token, with its UTF-8 bytes).

Lesson: lessons/06-architecture-map.md (the API server).
"""

from __future__ import annotations

from typing import Any

from ref_engine.model.tokenizer import Tokenizer


def _token(tokenizer: Tokenizer, token_id: int) -> str:
    return tokenizer.decode([token_id], skip_special_tokens=False)


def _top(entry: dict[int, float], num: int) -> list[tuple[int, float]]:
    return sorted(entry.items(), key=lambda item: -item[1])[:num]


def completion_logprobs(tokenizer: Tokenizer, token_ids: list[int], entries: list[dict[int, float]], num: int,
                        text_offset: int) -> dict[str, Any]:
    """`choices[i].logprobs` of /v1/completions; `text_offset`: where this delta's text starts."""
    tokens = [_token(tokenizer, t) for t in token_ids]
    offsets = []
    for token in tokens:
        offsets.append(text_offset)
        text_offset += len(token)
    return {"tokens": tokens, "token_logprobs": [entry[t] for t, entry in zip(token_ids, entries)],
            "top_logprobs": [{_token(tokenizer, t): lp for t, lp in _top(entry, num)} for entry in entries],
            "text_offset": offsets}


def chat_logprobs(tokenizer: Tokenizer, token_ids: list[int], entries: list[dict[int, float]],
                  num: int) -> dict[str, Any]:
    """`choices[i].logprobs` of /v1/chat/completions."""

    def item(token_id: int, logprob: float) -> dict[str, Any]:
        token = _token(tokenizer, token_id)
        return {"token": token, "logprob": logprob, "bytes": list(token.encode())}

    return {"content": [{**item(t, entry[t]), "top_logprobs": [item(k, lp) for k, lp in _top(entry, num)]}
                        for t, entry in zip(token_ids, entries)]}
