"""What `LLM.generate` returns, in vLLM's shape (`RequestOutput.outputs[0].text`), so vLLM habits transfer.

`LLMEngine.step()` returns the same classes. For a request streamed with `RequestOutputKind.DELTA`, each
step's `RequestOutput` holds only that step's new tokens and text, `finished=False` until the last one;
otherwise one output holds the whole completion. A finished output carries `RequestMetrics`, the request's
timestamps, from which a server's latency histograms are filled.

Lesson: lessons/06-architecture-map.md (the offline API).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from core.kv_cache_manager import PrefixCacheExplanation

if TYPE_CHECKING:
    from ref_engine.disagg.timings import DisaggTimings
    from ref_engine.kv_transfer.connector import KVTransferParams


@dataclass
class RequestMetrics:
    """When a request's events happened, in seconds on the engine's clock (`LLMEngine.now`)."""

    arrival_time: float
    first_scheduled_time: float | None
    first_token_time: float | None
    finished_time: float | None
    token_times: list[float]  # when each output token was produced (inter-token latencies)
    kv_load_s: float = 0.0  # disaggregated decode: seconds loading the K/V the prefill engine saved


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None  # "stop" (EOS, stop token or string), "length", "abort" or "error"
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
    metrics: RequestMetrics | None = None  # set on finished outputs
    error: str | None = None  # why the engine failed this request (finish_reason "error")
