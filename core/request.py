"""`Request`: one sequence's tokens, progress and timestamps, as the scheduler sees it.

The one number that drives scheduling is `num_computed_tokens`: how many of the request's known tokens
(prompt + generated so far) already have their K/V in the cache. A step gives a request N >= 1 new tokens;
prefill chunks, decode steps and speculative verification are all that same move. Preemption by
recompute just sets it back to 0: the generated tokens are kept and recomputed as if they were prompt.

`spec_token_ids` are a proposer's guesses at the next tokens (lesson 5). They are not part of the sequence:
the next step runs them after the last known token, and only those the verifier accepts become output.

Each field is `given` (what the request is: the sender's prompt, limits, tenant, ...) or `served` (how far
one replica has served it: `SERVING_STATE`), so a copy of the request for another replica (disaggregated
prefill and decode, sim/cluster.py) knows what to carry and what to start afresh.

Timestamps are plain floats of whatever clock the caller uses: wall-clock seconds in the engine, SimPy
time in the simulator, so `metrics.py` computes TTFT and ITL the same way for both.

Lesson: lessons/01-continuous-batching.md (a request's life); lessons/05-speculative-decoding.md (drafts).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any


class RequestStatus(enum.IntEnum):
    """Ordered so that every finished state compares at or above FINISHED_STOPPED (a cheap test on the hot
    path)."""

    WAITING = 0  # queued (new, or preempted by recompute)
    RUNNING = 1  # holds KV blocks on the device
    SWAPPED = 2  # preempted by swap: its KV blocks wait in the host pool
    FINISHED_STOPPED = 3  # EOS or a stop token/string
    FINISHED_LENGTH = 4  # max_tokens reached
    FINISHED_ABORTED = 5

    @property
    def is_finished(self) -> bool:
        return self >= _FIRST_FINISHED

    @property
    def finish_reason(self) -> str | None:
        """vLLM's `finish_reason` strings."""
        return {RequestStatus.FINISHED_STOPPED: "stop", RequestStatus.FINISHED_LENGTH: "length",
                RequestStatus.FINISHED_ABORTED: "abort"}.get(self)


DEFAULT_TENANT = "default"  # the tenant of requests that name none, wherever tenants are counted

# A plain int: on Python 3.11 reading a member off the enum class (RequestStatus.SWAPPED) goes through
# EnumType's attribute hook, which made `is_finished`, checked per request per step, 3x slower.
_FIRST_FINISHED = int(RequestStatus.FINISHED_STOPPED)


def given(**kwargs: Any) -> Any:
    """A field of what the request is (its sender's words): a copy for another replica carries it."""
    return field(metadata={"serving_state": False}, **kwargs)


def served(**kwargs: Any) -> Any:
    """A field of how far one replica has served the request: a copy for another replica starts it afresh
    (disaggregation, sim/cluster.py)."""
    return field(metadata={"serving_state": True}, **kwargs)


@dataclass(eq=False)
class Request:
    """A sequence to serve. `sampling_params` is opaque to the core: only the engine's sampler reads it.
    Every field is `given` (what the request is) or `served` (how far a replica got): `SERVING_STATE`."""

    request_id: str = given()
    prompt_token_ids: Sequence[int] = given()  # a list, or `SeededTokens` (core/seeded_tokens.py): ids drawn
    # when read, for simulated prompts whose content nobody needs
    max_tokens: int = given()
    arrival_time: float = given(default=0.0)
    eos_token_ids: frozenset[int] = given(default=frozenset())
    stop_token_ids: frozenset[int] = given(default=frozenset())
    ignore_eos: bool = given(default=False)
    min_tokens: int = given(default=0)
    tenant: str | None = given(default=None)  # who sent it, as authenticated: isolates the prefix cache,
    # and tenant caps count it
    cache_salt: str | None = given(default=None)  # with the tenant, the prefix-cache isolation key
    user: str | None = given(default=None)  # a label the client chose: groups requests for the fair policy,
    # isolates nothing
    priority: int = given(default=0)  # scheduling_policy="priority": lower runs first, as in vLLM
    sampling_params: Any = given(default=None)

    output_token_ids: list[int] = served(default_factory=list)
    num_computed_tokens: int = served(default=0)
    status: RequestStatus = served(default=RequestStatus.WAITING)
    num_preemptions: int = served(default=0)
    num_cached_tokens: int | None = served(default=None)  # prompt tokens the prefix cache served (set when
    # first scheduled)
    block_hashes: list[bytes] = served(default_factory=list, repr=False)  # hash chain of full blocks

    first_scheduled_time: float | None = served(default=None)
    first_token_time: float | None = served(default=None)
    token_times: list[float] = served(default_factory=list)  # when each output token was produced
    finish_time: float | None = served(default=None)
    spec_token_ids: list[int] = served(default_factory=list)  # draft tokens for the next step (lesson 5)

    def __post_init__(self) -> None:
        # a prompt never changes, so its length is read once: the scheduler asks for it millions of times,
        # and a `SeededTokens` answers len() in Python, not C
        self._num_prompt_tokens = len(self.prompt_token_ids)
        if not self._num_prompt_tokens:
            raise ValueError(f"request {self.request_id!r}: prompt_token_ids is empty")
        if self.max_tokens < 1:
            raise ValueError(f"request {self.request_id!r}: max_tokens must be >= 1, got {self.max_tokens}")
        for name in ("tenant", "cache_salt", "user"):  # they key the cache and the fair policy's counters
            value = getattr(self, name)
            if value is not None and not is_utf8_text(value):
                raise ValueError(f"request {self.request_id!r}: {name} must be a string of valid Unicode text "
                                 f"(no lone surrogates), got {value!r}")

    @property
    def tenant_key(self) -> str:
        """The tenant this request is counted under: its own, or `DEFAULT_TENANT`."""
        return DEFAULT_TENANT if self.tenant is None else self.tenant

    @property
    def group_key(self) -> str:
        """Whom the fair policy shares the device between: the tenant; without one, the client's `user`
        label (a grouping, not a security boundary); else `DEFAULT_TENANT`."""
        if self.tenant is not None:
            return self.tenant
        return DEFAULT_TENANT if self.user is None else self.user

    @property
    def num_prompt_tokens(self) -> int:
        return self._num_prompt_tokens

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        """Known tokens: prompt plus generated."""
        return self._num_prompt_tokens + len(self.output_token_ids)

    @property
    def max_total_tokens(self) -> int:
        """The most tokens this request can ever hold in the cache (what a reserving allocator reserves)."""
        return self._num_prompt_tokens + self.max_tokens

    def token_ids(self, start: int, stop: int) -> Sequence[int]:
        """Known tokens in [start, stop): prompt first, then output (a prompt's `SeededTokens` stay lazy)."""
        n_prompt = self._num_prompt_tokens
        if stop <= n_prompt:
            return self.prompt_token_ids[start:stop]
        if start >= n_prompt:
            return self.output_token_ids[start - n_prompt: stop - n_prompt]
        return self.prompt_token_ids[start:] + self.output_token_ids[: stop - n_prompt]

    def append_output_token(self, token_id: int, now: float) -> bool:
        """Record a generated token; if it ends the request, set the finished status and return True."""
        output = self.output_token_ids
        output.append(token_id)
        self.token_times.append(now)
        if self.first_token_time is None:
            self.first_token_time = now
        n_out = len(output)
        if n_out >= self.min_tokens and (
            token_id in self.stop_token_ids or (not self.ignore_eos and token_id in self.eos_token_ids)
        ):
            self.status = RequestStatus.FINISHED_STOPPED
            return True
        if n_out >= self.max_tokens:
            self.status = RequestStatus.FINISHED_LENGTH
            return True
        return False


# The `served` fields: how far a replica has served a request, as opposed to what the request is.
SERVING_STATE = frozenset(f.name for f in fields(Request) if f.metadata.get("serving_state"))


def is_utf8_text(value: object) -> bool:
    """A str that encodes to UTF-8 (Python strings may hold lone surrogates, which do not)."""
    if not isinstance(value, str):
        return False
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True
