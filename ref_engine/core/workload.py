"""`Workload`: the requests of an experiment, with arrival times, as one seeded, immutable object.

The same `Workload` runs on the real engine (`ref_engine.bench.run`) and in the simulator
(`sim.Simulator.run`), which is what makes their numbers comparable. A workload fixes prompt and output
lengths (outputs are forced with `ignore_eos`, so both sides produce exactly the same number of tokens);
prompts are real token ids when given, otherwise seeded random ids.

Lengths are given as an int (fixed), a `(lo, hi)` tuple (uniform, inclusive) or an `Exponential` (mean,
capped), the distributions the curriculum's experiments use. Arrivals are "all" at time 0 or a Poisson
process of `rate` requests per second.

Lesson: lessons/01-continuous-batching.md (experiment protocol).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from ref_engine.core.request import Request


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


@dataclass(frozen=True)
class WorkloadRequest:
    arrival_time: float
    prompt_len: int
    output_len: int
    prompt_token_ids: tuple[int, ...] | None = None
    tenant: str | None = None


@dataclass(frozen=True)
class Workload:
    requests: tuple[WorkloadRequest, ...]
    seed: int = 0
    name: str = "workload"

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

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def total_output_tokens(self) -> int:
        return sum(r.output_len for r in self.requests)

    def make_requests(self, vocab_size: int, eos_token_ids: frozenset[int] = frozenset()) -> list[Request]:
        """Fresh `Request` objects (ids "0", "1", ...); random prompts avoid the first ids, where
        tokenizers keep their special tokens."""
        rng = random.Random(self.seed + 1)
        low = min(100, vocab_size // 2)
        out = []
        for i, w in enumerate(self.requests):
            ids = list(w.prompt_token_ids) if w.prompt_token_ids is not None else rng.choices(
                range(low, vocab_size), k=w.prompt_len)
            out.append(Request(request_id=str(i), prompt_token_ids=ids, max_tokens=w.output_len,
                               arrival_time=w.arrival_time, eos_token_ids=eos_token_ids, ignore_eos=True,
                               tenant=w.tenant))
        return out


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
