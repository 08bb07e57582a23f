"""`Workload`: the requests of an experiment, with arrival times, as one seeded, immutable object.

The same `Workload` runs on the real engine (`ref_engine.bench.run`) and in the simulator
(`sim.Simulator.run`), which is what makes their numbers comparable. A workload fixes prompt and output
lengths (outputs are forced with `ignore_eos`, so both sides produce exactly the same number of tokens);
prompts are real token ids when given, otherwise seeded random ids.

Lengths are given as an int (fixed), a `(lo, hi)` tuple (uniform, inclusive) or an `Exponential` (mean,
capped), the distributions the lessons' experiments use, or drawn in pairs from a published production
trace (`from_trace`). Arrivals are "all" at time 0 or a Poisson
process of `rate` requests per second. `replay` plays a production trace (core/trace.py) as it was sent:
its arrival times, sped up or slowed down, with its lengths.

For prefix caching, a request can start with a prefix drawn from a shared *prefix group*: one seeded token
stream per group, so every request of a group (and of later workloads with the same seed: chat turns)
begins with the same tokens. A request can also open with the workload's *system prompt*, one seeded stream
shared by every request that has one, before its group's tokens (`chat`: a system prompt, then the history).

For a million-request replay, `with_lazy_prompts` makes each wholly random prompt a `SeededTokens` (drawn
only when read) and `iter_requests` makes each request only when a run reaches its arrival.

Workloads of several senders are built by tagging each (`with_tenant`, `with_priority`) and adding them:
`a + b` holds the requests of both in arrival order; or one stream is shared out among tenants in fixed
proportions (`with_tenant_mix`, the command line's `tenants=a:3,b:1`).

Lesson: lessons/01-continuous-batching.md (experiment protocol); lessons/04-prefix-caching.md (shared
prefixes, chat rounds, tenants); scheduling policies in lessons/03-chunked-prefill-and-disaggregation.md#fairness.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from core.request import Request
from core.seeded_tokens import SeededTokens
from core.trace import Trace, load_trace


@dataclass(frozen=True)
class Exponential:
    """Exponentially distributed lengths with the given mean, cut to [minimum, cap]."""

    mean: float
    cap: int
    minimum: int = 1

    def sample(self, rng: random.Random) -> int:
        return max(self.minimum, min(self.cap, round(rng.expovariate(1.0 / self.mean))))


LengthSpec = int | tuple[int, int] | Exponential


def _sample_length(spec: LengthSpec, rng: random.Random, what: str) -> int:
    if isinstance(spec, Exponential):
        return spec.sample(rng)
    if isinstance(spec, tuple):
        lo, hi = spec
        if not 1 <= lo <= hi:
            raise ValueError(f"{what} range must satisfy 1 <= lo <= hi, got {spec}")
        return rng.randint(lo, hi)
    if isinstance(spec, int) and spec >= 1:
        return spec
    raise ValueError(f"{what} must be an int >= 1, a (lo, hi) tuple or an Exponential, got {spec!r}")


COPY_PASSAGE_LEN = 64  # `Workload.copying`'s passage: long enough that a small model copies it


@dataclass(frozen=True, slots=True)  # slots: a million-request replay holds a million of these
class WorkloadRequest:
    arrival_time: float
    prompt_len: int
    output_len: int
    prompt_token_ids: tuple[int, ...] | None = None
    tenant: str | None = None
    cache_salt: str | None = None
    prefix_group: int | None = None  # `prefix_len` prompt tokens (after the system prompt) from this group's stream
    prefix_len: int = 0
    system_len: int = 0  # the first `system_len` prompt tokens: the system prompt, one stream for all requests
    priority: int = 0  # scheduling_policy="priority": lower runs first
    passage_len: int = 0  # > 0: the prompt is one random passage of this many tokens, repeated (`Workload.copying`)
    user: str | None = None  # the client's label (OpenAI's `user`): a session for a router's affinity


@dataclass(frozen=True)
class Workload:
    requests: tuple[WorkloadRequest, ...]
    seed: int = 0
    name: str = "workload"
    prefix_seed: int | None = None  # seeds the prefix groups' streams (None: `seed`); a warm-up shares it
    lazy_prompts: bool = False  # random prompts as `SeededTokens`, drawn when read (`with_lazy_prompts`)

    @classmethod
    def synthetic(cls, num_requests: int, prompt_len: LengthSpec, output_len: LengthSpec,
                  arrival: str | float = "all", seed: int = 0, name: str = "synthetic") -> Workload:
        """Random lengths and arrivals from one seed. `arrival` is "all" or a rate in requests/s."""
        if num_requests < 1:
            raise ValueError(f"num_requests must be >= 1, got {num_requests}")
        rng = random.Random(seed)
        times = _arrival_times(num_requests, arrival, rng)
        reqs = tuple(
            WorkloadRequest(arrival_time=t, prompt_len=_sample_length(prompt_len, rng, "prompt_len"),
                            output_len=_sample_length(output_len, rng, "output_len"))
            for t in times)
        return cls(reqs, seed, name)

    @classmethod
    def from_token_ids(cls, prompts: list[list[int]], output_len: LengthSpec, arrival: str | float = "all",
                       seed: int = 0, name: str = "prompts") -> Workload:
        """Real prompts (already tokenized), with seeded output lengths and arrivals."""
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("prompts must be a non-empty list of non-empty token-id lists")
        rng = random.Random(seed)
        times = _arrival_times(len(prompts), arrival, rng)
        reqs = tuple(
            WorkloadRequest(arrival_time=t, prompt_len=len(p), output_len=_sample_length(output_len, rng, "output_len"),
                            prompt_token_ids=tuple(p))
            for t, p in zip(times, prompts))
        return cls(reqs, seed, name)

    @classmethod
    def shared_prefix(cls, num_groups: int, requests_per_group: int, prefix_len: int, suffix_len: LengthSpec,
                      output_len: LengthSpec, arrival: str | float = "all", seed: int = 0,
                      prefix_seed: int | None = None, name: str = "shared-prefix") -> Workload:
        """Groups of requests that share a `prefix_len`-token prefix (a system prompt, few-shot examples)
        and differ after it (`suffix_len=0`: the whole prompt is shared); requests of the groups are
        interleaved, as independent users would send them.
        Two workloads with the same `prefix_seed` (default: `seed`) share their groups' prefixes, and with
        different `seed`s differ in everything else (a warm-up and the measured run)."""
        if num_groups < 1 or requests_per_group < 1 or prefix_len < 0:
            raise ValueError("num_groups and requests_per_group must be >= 1 and prefix_len >= 0, got "
                             f"{num_groups}, {requests_per_group}, {prefix_len}")
        rng = random.Random(seed)
        n = num_groups * requests_per_group
        times = _arrival_times(n, arrival, rng)
        reqs = []
        for i, t in enumerate(times):
            suffix = 0 if suffix_len == 0 else _sample_length(suffix_len, rng, "suffix_len")
            prompt_len = prefix_len + suffix
            if prompt_len < 1:
                raise ValueError("a request needs at least one token: prefix_len + suffix_len is 0")
            reqs.append(WorkloadRequest(t, prompt_len, _sample_length(output_len, rng, "output_len"),
                                        prefix_group=i % num_groups, prefix_len=prefix_len))
        return cls(tuple(reqs), seed, name, prefix_seed)

    @classmethod
    def chat_rounds(cls, num_conversations: int, num_turns: int, first_prompt_len: int, turn_len: int,
                    output_len: int, seed: int = 0) -> list[Workload]:
        """Multi-turn chat replay: round k holds turn k of every conversation. A turn's prompt is the whole
        history (earlier prompts, replies, the new message), so it extends the previous turn's prompt by
        `turn_len` tokens; run the rounds one after another on one engine to see the history hit."""
        rounds = []
        for k in range(num_turns):
            length = first_prompt_len + k * turn_len
            reqs = tuple(WorkloadRequest(0.0, length, output_len, prefix_group=c, prefix_len=length)
                         for c in range(num_conversations))
            rounds.append(cls(reqs, seed, f"chat-turn-{k + 1}"))
        return rounds

    @classmethod
    def chat(cls, num_conversations: int, num_turns: int, system_len: int, user_len: int, output_len: int,
             arrival: str | float = "all", seed: int = 0, name: str = "chat") -> Workload:
        """A chat service's shape in one stream: every conversation opens with the same `system_len`-token
        system prompt, and turn k's prompt is the system prompt plus the whole history (k earlier messages of
        `user_len` tokens and replies of `output_len`) plus a new message, so prefix caching can hit the system
        prompt across conversations and the earlier turns within one. Requests go turn by turn (every
        conversation's first turn, then every second, ...), all at time 0 or at `arrival` requests/s; a turn
        that arrives before its previous turn was prefilled finds no history cached, as in vLLM.
        The history's replies are the replay's tokens, not what the model generated: a turn hits the cache
        on the previous turn's prompt, while a real client re-sending the model's reply would hit on it too."""
        counts = {"num_conversations": num_conversations, "num_turns": num_turns, "user_len": user_len,
                  "output_len": output_len}
        if any(not isinstance(n, int) or n < 1 for n in counts.values()) or not isinstance(system_len, int) \
                or system_len < 0:
            raise ValueError(f"chat needs system_len >= 0 and the rest >= 1, got system_len={system_len}, "
                             + ", ".join(f"{k}={v}" for k, v in counts.items()))
        rng = random.Random(seed)
        times = iter(_arrival_times(num_conversations * num_turns, arrival, rng))
        reqs = []
        for k in range(num_turns):
            history = k * (user_len + output_len) + user_len  # k messages and replies, then the new message
            reqs += [WorkloadRequest(next(times), system_len + history, output_len, prefix_group=c,
                                     prefix_len=history, system_len=system_len) for c in range(num_conversations)]
        return cls(tuple(reqs), seed, name)

    @classmethod
    def from_trace(cls, trace: str, num_requests: int, arrival: str | float = "all", seed: int = 0,
                   name: str | None = None) -> Workload:
        """`num_requests` (prompt, output) length pairs drawn at random, with replacement, from a published
        production trace (`TRACES`: a systematic sample of Azure's 2023 LLM inference traces kept in
        core/data), so a run meets a real service's mix of short and long prompts and replies, with the
        correlation between them. Lengths only: the prompts are seeded random ids, the arrivals "all" or
        Poisson, as in `synthetic`."""
        pairs = trace_lengths(trace)
        if num_requests < 1:
            raise ValueError(f"num_requests must be >= 1, got {num_requests}")
        rng = random.Random(seed)
        times = _arrival_times(num_requests, arrival, rng)
        reqs = tuple(WorkloadRequest(t, *rng.choice(pairs)) for t in times)
        return cls(reqs, seed, name or f"trace-{trace}")

    @classmethod
    def replay(cls, trace: Trace | str | Path, time_scale: float = 1.0, num_requests: int | None = None,
               seed: int = 0, name: str | None = None) -> Workload:
        """A production trace's requests as its service received them: each arrives at its time in the
        trace divided by `time_scale` (10: ten times faster, the same requests at ten times the rate), with
        the trace's prompt and output lengths (the prompts are seeded random ids). `trace` is a `Trace`, the
        name of a shipped one (`core.trace.TRACE_FILES`) or a file in Azure's format (`core.trace.read_trace`).
        Fewer `num_requests` than the trace holds take its first ones; more play it again, end to end, each
        pass starting one mean inter-arrival gap after the previous pass's last arrival, so an hour's trace
        makes a run of any length."""
        if isinstance(time_scale, bool) or not (isinstance(time_scale, (int, float))
                                                and 0 < time_scale < math.inf):
            raise ValueError("time_scale must be a positive number (10 plays the trace ten times faster), "
                             f"got {time_scale!r}")
        trace = trace if isinstance(trace, Trace) else load_trace(trace)
        count = len(trace) if num_requests is None else num_requests
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"num_requests must be an integer >= 1, or None for the whole trace, "
                             f"got {num_requests!r}")
        period = trace.duration + trace.mean_interarrival  # one pass and the gap before the next
        reqs = []
        for i in range(count):
            n, j = divmod(i, len(trace))  # pass n, the trace's request j
            arrival_time = (n * period + trace.arrival_times[j]) / time_scale
            reqs.append(WorkloadRequest(arrival_time, trace.prompt_lens[j], trace.output_lens[j]))
        scale = f"-x{time_scale:g}" if time_scale != 1 else ""
        return cls(tuple(reqs), seed, name or f"replay-{trace.name}{scale}")

    @classmethod
    def copying(cls, num_requests: int, prompt_len: int, output_len: int, arrival: str | float = "all",
                seed: int = 0, passage_len: int = COPY_PASSAGE_LEN, name: str = "copy") -> Workload:
        """Prompts whose continuation repeats them: each a random `passage_len`-token passage written out again
        and again up to `prompt_len` tokens, so a model that has seen it twice goes on copying it (SmolLM2 keeps
        22 of 24 greedy tokens on the passage at 64 tokens, none at 16). Work that quotes its input (editing
        code, extracting from a document) at its extreme: prompt lookup's best case (lesson 5), where random
        prompts give it nothing to draft."""
        if num_requests < 1 or passage_len < 1 or prompt_len < 2 * passage_len:
            raise ValueError(f"copying needs num_requests >= 1 and a prompt of at least two passages, got "
                             f"{num_requests} requests of {prompt_len} tokens with passage_len={passage_len}")
        times = _arrival_times(num_requests, arrival, random.Random(seed))
        reqs = tuple(WorkloadRequest(t, prompt_len, output_len, passage_len=passage_len) for t in times)
        return cls(reqs, seed, name)

    def with_tenant(self, tenant: str | None, cache_salt: str | None = None) -> Workload:
        """The same requests, all sent by `tenant` with `cache_salt` (the prefix cache isolates both)."""
        return replace(self, requests=tuple(replace(r, tenant=tenant, cache_salt=cache_salt)
                                            for r in self.requests), name=f"{self.name}@{tenant}")

    def with_tenant_mix(self, shares: Mapping[str, int]) -> Workload:
        """The same requests shared out among tenants in proportion to `shares` (`tenant_sequence`)."""
        tenants = tenant_sequence(len(self.requests), shares)
        mix = ",".join(f"{tenant}:{share}" for tenant, share in shares.items())
        return replace(self, requests=tuple(replace(r, tenant=t) for r, t in zip(self.requests, tenants)),
                       name=f"{self.name}@{mix}")

    def with_sessions(self) -> Workload:
        """The same requests, each labelled with its conversation (`user` = "session-<prefix group>"; requests
        of no prefix group get none), as a client sends a conversation id: a session-affinity router keeps a
        conversation on one replica. Opt-in, because the fair policy groups tenant-less requests by `user`."""
        return replace(self, requests=tuple(replace(r, user=None if r.prefix_group is None else
                                                    f"session-{r.prefix_group}") for r in self.requests),
                       name=f"{self.name}@sessions")

    def with_lazy_prompts(self) -> Workload:
        """The same requests, each wholly random prompt (no given ids, passage, system prompt or prefix group)
        made a `SeededTokens` of its own seed: nothing in memory until read, so a million-request replay fits.
        Its ids differ from an eager run's (drawn per request, not from one stream), its length does not; a
        random prompt shares no full block with another either way, so the decisions are the same."""
        return replace(self, lazy_prompts=True)

    def delayed(self, seconds: float) -> Workload:
        """The same requests, each arriving `seconds` later: phases of a day composed with `+` (a spike
        at minute 2 of a quiet stream)."""
        if not seconds >= 0:
            raise ValueError(f"a delay must be >= 0 seconds, got {seconds!r}")
        return replace(self, requests=tuple(replace(r, arrival_time=r.arrival_time + seconds)
                                            for r in self.requests), name=f"{self.name}+{seconds:g}s")

    def with_priority(self, priority: int) -> Workload:
        """The same requests, all with `priority` (lower runs first under scheduling_policy="priority")."""
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise ValueError(f"priority must be an integer, got {priority!r}")
        return replace(self, requests=tuple(replace(r, priority=priority) for r in self.requests),
                       name=f"{self.name}!{priority}")

    def __add__(self, other: Workload) -> Workload:
        """Both workloads' requests in arrival order, ties in operand order (`self` first), so request ids
        are deterministic. Seeds come from `self`: random prompts are drawn afresh for the whole, and prefix
        group k of both operands is one group (tag each with its tenant to keep their caches apart)."""
        if not isinstance(other, Workload):
            return NotImplemented
        merged = sorted(self.requests + other.requests, key=lambda r: r.arrival_time)  # stable: ties keep order
        return replace(self, requests=tuple(merged), name=f"{self.name}+{other.name}")

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def total_output_tokens(self) -> int:
        return sum(r.output_len for r in self.requests)

    def make_requests(self, vocab_size: int, eos_token_ids: frozenset[int] = frozenset()) -> list[Request]:
        """Fresh `Request` objects (ids "0", "1", ...); random prompts avoid the first ids, where
        tokenizers keep their special tokens."""
        return list(self._requests(vocab_size, eos_token_ids))

    def iter_requests(self, vocab_size: int, eos_token_ids: frozenset[int] = frozenset()) -> Iterator[Request]:
        """`make_requests`'s requests in arrival order (ties in workload order), each made only when the caller
        reaches it, so a run that lets finished requests go holds just those in flight. A workload out of
        arrival order (rare: every constructor and `+` keep it) is made whole and sorted first."""
        times = [w.arrival_time for w in self.requests]
        if any(later < earlier for earlier, later in zip(times, times[1:])):
            return iter(sorted(self.make_requests(vocab_size, eos_token_ids), key=lambda r: r.arrival_time))
        return self._requests(vocab_size, eos_token_ids)

    def _requests(self, vocab_size: int, eos_token_ids: frozenset[int]) -> Iterator[Request]:
        rng = random.Random(self.seed + 1)
        low = min(100, vocab_size // 2)
        streams: dict[int, list[int]] = {}
        prefix_seed = self.seed if self.prefix_seed is None else self.prefix_seed
        system_len = max((w.system_len for w in self.requests), default=0)
        system = random.Random(f"{prefix_seed}:system").choices(range(low, vocab_size), k=system_len)
        for w in self.requests:
            if w.prefix_group is not None and w.prefix_len > len(streams.get(w.prefix_group, ())):
                # a group's stream comes from its own seed, so it is the same in every workload (chat turns)
                group_rng = random.Random(f"{prefix_seed}:prefix:{w.prefix_group}")
                streams[w.prefix_group] = group_rng.choices(range(low, vocab_size), k=w.prefix_len)
        for i, w in enumerate(self.requests):
            ids: Sequence[int]
            if w.prompt_token_ids is not None:
                ids = list(w.prompt_token_ids)
            elif w.passage_len:
                passage = rng.choices(range(low, vocab_size), k=w.passage_len)
                ids = (passage * -(-w.prompt_len // w.passage_len))[:w.prompt_len]
            elif self.lazy_prompts and not w.system_len and w.prefix_group is None:
                ids = SeededTokens.seeded(f"{self.seed}:prompt:{i}", w.prompt_len, low, vocab_size)
            else:
                prefix = system[:w.system_len] + streams.get(w.prefix_group, [])[:w.prefix_len]
                ids = prefix + rng.choices(range(low, vocab_size), k=w.prompt_len - len(prefix))
            yield Request(request_id=str(i), prompt_token_ids=ids, max_tokens=w.output_len,
                          arrival_time=w.arrival_time, eos_token_ids=eos_token_ids, ignore_eos=True,
                          tenant=w.tenant, cache_salt=w.cache_salt, priority=w.priority, user=w.user)


# Published traces' (prompt, output) lengths, in core/data: each file says where it comes from. Small samples
# of the full traces that `Workload.replay` plays (`core.trace.TRACE_FILES`, the same names), so that
# `from_trace` also works in the browser's playgrounds, which are not sent the full ones.
TRACES = {
    "azure-conv-2023": "azure-llm-2023-conv.csv",  # a chat service: median prompt ~1,020 tokens, reply ~130
    "azure-code-2023": "azure-llm-2023-code.csv",  # code completion: median prompt ~1,400 tokens, reply ~13
}


@functools.cache
def trace_lengths(trace: str) -> tuple[tuple[int, int], ...]:
    """The (prompt_tokens, output_tokens) pairs of a trace in `TRACES`."""
    if trace not in TRACES:
        raise ValueError(f"unknown trace {trace!r}; known: {', '.join(TRACES)}")
    lines = (Path(__file__).parent / "data" / TRACES[trace]).read_text().splitlines()
    rows = [line.split(",") for line in lines if line and not line.startswith("#")][1:]  # past the header
    return tuple((int(prompt), int(output)) for prompt, output in rows)


def _arrival_times(n: int, arrival: str | float, rng: random.Random) -> list[float]:
    if arrival == "all":
        return [0.0] * n
    if isinstance(arrival, (int, float)) and not isinstance(arrival, bool) and arrival > 0:
        t, times = 0.0, []
        for _ in range(n):
            t += rng.expovariate(arrival)
            times.append(t)
        return times
    raise ValueError(f"arrival must be 'all' or a positive rate in requests/s, got {arrival!r}")


def tenant_sequence(num_requests: int, shares: Mapping[str, int]) -> list[str]:
    """The tenant of each of `num_requests` requests, in proportion to `shares` (tenant -> a positive integer),
    interleaved by smooth weighted round robin: {"a": 3, "b": 1} gives a, a, b, a, a, a, b, a, ... No
    randomness, so the mix is exact for every prefix of the stream and does not move other draws."""
    if not shares or not all(isinstance(t, str) and t for t in shares) or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in shares.values()):
        raise ValueError(f"shares must map non-empty tenant names to positive integers, got {dict(shares)!r}")
    total = sum(shares.values())
    credit = dict.fromkeys(shares, 0)
    tenants = []
    for _ in range(num_requests):
        for tenant, share in shares.items():
            credit[tenant] += share
        chosen = max(credit, key=credit.__getitem__)  # ties: the first named
        credit[chosen] -= total
        tenants.append(chosen)
    return tenants
