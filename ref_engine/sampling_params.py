"""What a request asks of the sampler: `SamplingParams`, with vLLM's names and defaults.

This module owns the *request-side* description of decoding: how random (temperature, top-k, top-p,
min-p, seed), how long (max_tokens, min_tokens), when to stop (stop strings, stop token ids, EOS) and
what to report back (logprobs). It has no torch in it, so the core and the simulator can carry it
around; only `ref_engine/sampler.py` turns it into tensors, and only the engine's stop checks read the
stop fields.

Invariants, checked once in `__post_init__` so that the sampler never has to re-check them:
- every field has a legal value, and a bad one raises a ValueError whose message starts with the
  field's name and shows the value;
- `stop` and `stop_token_ids` are always lists (a single string is wrapped, None becomes []);
- `top_k` of 0 or -1 both mean "off" (vLLM accepts both spellings);
- a temperature below `SAMPLING_EPS` means greedy decoding (dividing logits by a tiny temperature
  would overflow float32, so the sampler takes the argmax instead).

Treat an instance as read-only once built: `dataclasses.replace(params, ...)` makes a changed copy and
validates it again.

Lesson: lessons/06-architecture-map.md (the "sample" box of schedule -> run -> sample -> update).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

# Temperatures below this are treated as 0, i.e. greedy (vLLM uses the same threshold).
SAMPLING_EPS = 1e-5

# torch.Generator.manual_seed accepts seeds in [0, 2**64).
_MAX_SEED = 2**64


def _is_int(value: object) -> bool:
    """True for real integers; bool is an int subclass in Python but is never a legal count or seed."""
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)) and math.isfinite(value)


class RequestOutputKind(enum.Enum):
    """What `LLMEngine.step()` returns for a request (vLLM's names): DELTA streams each step's new tokens
    and text with `finished=False` until the last; FINAL_ONLY returns one whole output when it finishes
    (what `LLM.generate` needs)."""

    DELTA = "delta"
    FINAL_ONLY = "final_only"


@dataclass
class SamplingParams:
    """How to decode one request; field names and defaults follow vLLM's `SamplingParams`."""

    max_tokens: int = 16  # generate at most this many tokens
    temperature: float = 1.0  # 0 = greedy (argmax); < 1 sharpens, > 1 flattens the distribution
    top_k: int = 0  # keep the k most likely tokens; 0 or -1 = off
    top_p: float = 1.0  # keep the smallest set of top tokens whose probability mass reaches top_p
    min_p: float = 0.0  # drop tokens less likely than min_p * (probability of the most likely token)
    seed: int | None = None  # per-request random stream; None = the engine-wide stream
    stop: list[str] = field(default_factory=list)  # stop when the text ends with one; a str is wrapped
    stop_token_ids: list[int] = field(default_factory=list)  # stop when one of these ids is sampled
    ignore_eos: bool = False  # keep going past the model's end-of-sequence token
    min_tokens: int = 0  # EOS and stop_token_ids are banned until this many tokens are out
    logprobs: int | None = None  # None = no logprobs; 0 = the chosen token's; N = also the top N
    include_stop_str_in_output: bool = False  # keep the matched stop string at the end of the text
    output_kind: RequestOutputKind = RequestOutputKind.FINAL_ONLY  # stream deltas, or one final output

    def __post_init__(self) -> None:
        # Normalize the two list fields first, so the checks below see one shape.
        if self.stop is None:
            self.stop = []
        elif isinstance(self.stop, str):
            self.stop = [self.stop]
        else:
            self.stop = list(self.stop)
        self.stop_token_ids = [] if self.stop_token_ids is None else list(self.stop_token_ids)
        self._validate()

    def _validate(self) -> None:
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not _is_number(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if not _is_int(self.top_k) or self.top_k < -1:
            raise ValueError(f"top_k must be an integer >= 0, or -1 for off, got {self.top_k!r}")
        if not _is_number(self.top_p) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not _is_number(self.min_p) or not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p!r}")
        if self.seed is not None and (not _is_int(self.seed) or not 0 <= self.seed < _MAX_SEED):
            raise ValueError(f"seed must be None or an integer in [0, 2**64), got {self.seed!r}")
        for stop_str in self.stop:
            if not isinstance(stop_str, str) or not stop_str:
                raise ValueError(f"stop must hold non-empty strings, got {stop_str!r} in {self.stop!r}")
        for token_id in self.stop_token_ids:
            if not _is_int(token_id) or token_id < 0:
                raise ValueError(
                    f"stop_token_ids must hold integers >= 0, got {token_id!r} in {self.stop_token_ids!r}"
                )
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos must be a bool, got {self.ignore_eos!r}")
        if not _is_int(self.min_tokens) or self.min_tokens < 0:
            raise ValueError(f"min_tokens must be an integer >= 0, got {self.min_tokens!r}")
        if self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens must be <= max_tokens ({self.max_tokens}), got {self.min_tokens!r}")
        if self.logprobs is not None and (not _is_int(self.logprobs) or self.logprobs < 0):
            raise ValueError(f"logprobs must be None or an integer >= 0, got {self.logprobs!r}")
        if not isinstance(self.include_stop_str_in_output, bool):
            raise ValueError(
                f"include_stop_str_in_output must be a bool, got {self.include_stop_str_in_output!r}"
            )
        if not isinstance(self.output_kind, RequestOutputKind):
            raise ValueError(f"output_kind must be a RequestOutputKind, got {self.output_kind!r}")

    @property
    def is_greedy(self) -> bool:
        """True when decoding takes the argmax: the temperature is (numerically) zero."""
        return self.temperature < SAMPLING_EPS

    def validate_for_vocab(self, vocab_size: int) -> None:
        """Check the fields that only make sense against a model's vocabulary (called on add_request)."""
        for token_id in self.stop_token_ids:
            if token_id >= vocab_size:
                raise ValueError(
                    f"stop_token_ids must be < vocab_size ({vocab_size}), got {token_id!r} "
                    f"in {self.stop_token_ids!r}"
                )
        if self.logprobs is not None and self.logprobs > vocab_size:
            raise ValueError(f"logprobs must be <= vocab_size ({vocab_size}), got {self.logprobs!r}")
