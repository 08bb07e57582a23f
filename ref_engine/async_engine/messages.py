"""What the API server's process and the engine-core process say to each other over ZeroMQ.

Plain dataclasses, pickled (`send_pyobj`): both ends are this package on one machine, started by the same
user, so pickle is safe here and needs no schema (vLLM uses msgpack to go faster and across languages).

Lesson: lessons/06-architecture-map.md (the engine core and the API server).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from core.step_summary import StepSummary
from ref_engine.async_engine.tracing import TraceEvent
from ref_engine.outputs import RequestOutput
from ref_engine.sampling_params import SamplingParams

# ---- client -> core ----


@dataclass(frozen=True)
class EngineCoreRequest:
    """One request, tokenized by the API server: `prompt` is `LLMEngine.add_request`'s dict form
    (prompt_token_ids, tenant, user, cache_salt, priority)."""

    request_id: str
    prompt: dict[str, Any]
    params: SamplingParams
    arrival_time: float | None = None  # time.perf_counter() when the API server got it (None: when the core does)


@dataclass(frozen=True)
class AbortRequests:
    request_ids: list[str]


@dataclass(frozen=True)
class UtilityCall:
    """Call one of `UTILITY_METHODS` on the engine; the answer comes back as `UtilityOutput`."""

    call_id: int
    method: str
    args: tuple[Any, ...] = ()


UTILITY_METHODS = frozenset({"reset_prefix_cache"})


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
class RequestError:
    """Why the core failed a request: `invalid` when the request itself was refused (a client error), else
    the engine broke while serving it."""

    message: str
    invalid: bool = False


@dataclass(frozen=True)
class SchedulerStats:
    """The scheduler after a step: the gauges of /metrics, and the step's preemptions."""

    num_running_reqs: int
    num_waiting_reqs: int
    kv_cache_usage: float  # fraction of KV blocks in use
    num_used_blocks: int
    num_preempted: int  # preemptions in this step (events)
    num_preempted_reqs: int = 0  # requests preempted for the first time in this step
    num_waiting_preempted_reqs: int = 0  # requests waiting (or swapped out) after a preemption, now


@dataclass
class EngineCoreOutputs:
    """One step's outputs (streamed deltas and finished requests), failed requests, and the stats after it."""

    outputs: list[RequestOutput] = field(default_factory=list)
    errors: dict[str, RequestError] = field(default_factory=dict)
    scheduler_stats: SchedulerStats | None = None
    trace_events: list[TraceEvent] = field(default_factory=list)  # only with tracing on (tracing.py)
    step_summaries: list[StepSummary] = field(default_factory=list)  # only with the dashboard on


@dataclass(frozen=True)
class UtilityOutput:
    call_id: int
    result: Any  # an exception when the call raised
