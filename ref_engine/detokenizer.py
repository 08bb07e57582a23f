"""`IncrementalDetokenizer`: a request's new tokens as new text, step by step, for streaming.

A stream sends each step's text as it comes, so what is sent must never change later. Two things would
change it: a multi-byte UTF-8 character cut between tokens (a byte-level tokenizer gives each byte its own
token, so "é" may arrive as two), which decodes to U+FFFD until its last byte arrives; and a stop string
that is still being matched, which must not reach the client if the request stops on it. So the text sent
is the decoded output minus any trailing U+FFFD and minus the last `len(longest stop string) - 1`
characters; at the end, the rest of the final text (already cut at its stop string) is sent.

It decodes the whole output every step (O(output length) per step) rather than vLLM's window of recent
tokens (`prefix_offset`/`read_offset`): simpler, and right for any tokenizer's decoder rules; outputs
here are a few hundred tokens.

Lesson: lessons/06-architecture-map.md (the detokenizer and streamer boxes).
"""

from __future__ import annotations

from ref_engine.model.tokenizer import Tokenizer

REPLACEMENT_CHAR = "\ufffd"  # what an incomplete UTF-8 sequence decodes to


class IncrementalDetokenizer:
    """What one request has sent so far, and what each step adds."""

    def __init__(self, tokenizer: Tokenizer, stop: list[str]) -> None:
        self.tokenizer = tokenizer
        self.holdback = max((len(s) for s in stop), default=1) - 1  # chars a stop string may still claim
        self.num_sent_chars = 0
        self.num_sent_tokens = 0

    def delta(self, token_ids: list[int], final_text: str | None = None) -> tuple[list[int], str]:
        """(new token ids, new text) since the last call. `final_text`: the request finished with this
        text, so send all of it that is left."""
        if final_text is None:
            text = self.tokenizer.decode(token_ids)
            end = len(text.rstrip(REPLACEMENT_CHAR)) - self.holdback
        else:
            text, end = final_text, len(final_text)
        new_text = text[self.num_sent_chars:end] if end > self.num_sent_chars else ""
        new_ids = token_ids[self.num_sent_tokens:]
        self.num_sent_chars += len(new_text)
        self.num_sent_tokens = len(token_ids)
        return new_ids, new_text
