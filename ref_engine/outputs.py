"""What `LLM.generate` returns, in vLLM's shape (`RequestOutput.outputs[0].text`), so vLLM habits transfer.

Lesson: lessons/06-architecture-map.md (the offline API).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ref_engine.core.kv_cache_manager import PrefixCacheExplanation

if TYPE_CHECKING:
    from ref_engine.disagg.timings import DisaggTimings
    from ref_engine.kv_transfer.connector import KVTransferParams


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None  # "stop" (EOS, stop token or string), "length" or "abort"
    stop_reason: int | str | None = None  # the stop token id or string that ended it, if any
    logprobs: list[dict[int, float]] | None = None  # per output position: chosen token + top-N


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    num_preemptions: int = 0
    num_cached_tokens: int = 0  # prompt tokens whose K/V came from the prefix cache (vLLM's name)
    prefix_cache: PrefixCacheExplanation | None = None  # how much hit and why the next block missed
    # disaggregated prefill (lesson 3): a prefill engine's saved KV, for the decode engine (vLLM's name) ...
    kv_transfer_params: KVTransferParams | None = None
    # ... and, on what `DisaggregatedLLM.generate` returns, where the request's time went
    disagg_timings: DisaggTimings | None = None
