"""What an engine core and its client say to each other over ZeroMQ: one vocabulary for both clients.

Client -> core: `EngineCoreRequest` (one request; with `kv_transfer_params` a request another engine
prefilled, for a consumer core), `AbortRequests`, `UtilityCall` (one of `UTILITY_METHODS` of `EngineCore`),
`Shutdown`. Core -> client: `EngineCoreReady` or `EngineCoreStartFailed` once, then `EngineCoreOutputs`
(each step's outputs, the requests it failed, the scheduler's stats, trace events, the dashboard's step
summaries) and `UtilityOutput`, and `EngineCoreDead` as its last words when it can no longer run the model.

Plain dataclasses, pickled (`send_pyobj`): both ends are this package on one machine, started by the same
user, so pickle is safe here and needs no schema (vLLM uses msgpack to go faster and across languages).
Every time that crosses is a `time.perf_counter()` reading, one clock for every process on the machine,
except a `RequestMetrics`' times, which are on the engine's clock: `EngineCoreOutputs.clock_origin` turns
them into perf_counter time.

Lesson: lessons/06-architecture-map.md (the engine core and the API server).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from core.interfaces import SchedulerStats
from core.step_summary import StepSummary
from ref_engine.engine import PromptType
from ref_engine.engine_core.tracing import TraceEvent
from ref_engine.kv_transfer.connector import KVTransferParams
from ref_engine.outputs import RequestOutput
from ref_engine.sampling_params import SamplingParams

# ---- client -> core ----


@dataclass(frozen=True)
class EngineCoreRequest:
    """One request. The API server sends `LLMEngine.add_request`'s dict form, tokenized (prompt_token_ids,
    tenant, user, cache_salt, priority); the router may send any prompt `LLMEngine` takes. With
    `kv_transfer_params` (the prefill engine's output's), a consumer core loads that K/V and decodes."""

    request_id: str
    prompt: PromptType
    params: SamplingParams
    arrival_time: float | None = None  # time.perf_counter() when the client got it (None: when the core does)
    kv_transfer_params: KVTransferParams | None = None


@dataclass(frozen=True)
class AbortRequests:
    request_ids: list[str]


@dataclass(frozen=True)
class UtilityCall:
    """Call one of `UTILITY_METHODS` on the `EngineCore`; the answer comes back as `UtilityOutput`."""

    call_id: int
    method: str
    args: tuple[Any, ...] = ()


UTILITY_METHODS = frozenset({"reset_prefix_cache", "discard_kv", "get_stats"})


@dataclass(frozen=True)
class Shutdown:
    pass


# ---- core -> client ----


@dataclass(frozen=True)
class EngineCoreReady:
    """The core loaded its model: what the API server checks requests against."""

    model_id: str
    max_model_len: int
    vocab_size: int
    num_kv_blocks: int
    scheduling_policy: str  # "priority" is the one that honours a request's priority


@dataclass(frozen=True)
class EngineCoreStartFailed:
    error: str


@dataclass(frozen=True)
class EngineCoreDead:
    """The core cannot run another step (its executor is dead: a worker died or hung) and exits next; `error`
    says why, for the client to tell its callers instead of an exit code."""

    error: str


@dataclass(frozen=True)
class RequestError:
    """Why the core failed a request: `invalid` when the request itself was refused (a client error), else
    the engine broke while serving it."""

    message: str
    invalid: bool = False


@dataclass(frozen=True)
class EngineCoreStats(SchedulerStats):
    """The `get_stats` utility's answer: the scheduler's stats, and the requests the core holds outside it."""

    num_staged_requests: int = 0  # consumer: K/V arrived, waiting for room in the batch


@dataclass
class EngineCoreOutputs:
    """One step's outputs (streamed deltas and finished requests), failed requests, and the stats after it."""

    outputs: list[RequestOutput] = field(default_factory=list)
    errors: dict[str, RequestError] = field(default_factory=dict)
    scheduler_stats: SchedulerStats | None = None
    trace_events: list[TraceEvent] = field(default_factory=list)  # only with tracing on (tracing.py)
    clock_origin: float = 0.0  # time.perf_counter() at the engine clock's zero (for `RequestMetrics`)
    step_summaries: list[StepSummary] = field(default_factory=list)  # only with the dashboard on (core/step_summary.py)


@dataclass(frozen=True)
class UtilityOutput:
    call_id: int
    result: Any  # an exception when the call raised
