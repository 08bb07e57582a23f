"""The sampler: one step's logits [R, V] -> one token id per row, plus the logprobs requests asked for.

This module owns the step from "the model scored every token" to "each request got its next token".
`SamplingMetadata.build` turns the batch's `SamplingParams` into per-row tensors once per step, and
`Sampler.__call__` applies them in a fixed order:

    1. raw logprobs  log_softmax(logits), kept aside for reporting (only when a row asked for logprobs)
    2. bans          rows that have not reached `min_tokens` get -inf on EOS and their stop_token_ids
    3. greedy rows   take the argmax of the banned logits
    4. random rows   temperature -> top-k -> top-p -> min-p -> softmax = the processed distribution p
    5. draw          token = argmax(p / q) with q ~ Exp(1), one noise row per request

Step 4 is `process_logits`; `softmax_probs` wraps the same function for one request, so speculative
decoding's rejection sampler sees exactly the distribution the sampler draws from.

Why step 5 is an exact categorical draw: if q_i ~ Exp(1) independently, then q_i / p_i ~ Exp(rate p_i),
and the smallest of independent exponentials is index i with probability p_i / sum(p) = p_i. So
argmin(q / p) = argmax(p / q) is distributed as p. (It is the Gumbel-max trick with log taken off.)
It needs no cumulative sum or search, masked tokens (p = 0) can never win, and each row's randomness is
its own noise row, which is what makes per-request seeds work.

Invariants:
- Reported logprobs are the model's *raw* log-softmax (vLLM's default `logprobs_mode`): they do not
  change with temperature, top-k/top-p/min-p or min_tokens bans. A banned token keeps a finite logprob;
  it is just never chosen.
- Reproducibility: a row whose request has a seed draws its noise only from that request's own
  `torch.Generator`, so the same seed gives the same tokens whether the request runs alone or at any
  position in any batch. Rows without a seed share the sampler-wide generator, so they are reproducible
  for a fixed sequence of batches (the same engine seed and workload), not independently of neighbours.
- Top-k keeps every token tied with the k-th largest logit (so possibly more than k); top-p always keeps
  the most likely token (the lowest id among ties); min-p keeps tokens with p >= min_p * max(p).
- The input logits are never modified.

Lesson: lessons/06-architecture-map.md (the "sample" box of schedule -> run -> sample -> update).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from ref_engine.sampling_params import SamplingParams


def make_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A random stream for one request (or for the sampler), on the device where the noise is drawn."""
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    return generator


# ---- the processed distribution: temperature, top-k, top-p, min-p ----


def apply_temperature(logits: Tensor, temperature: Tensor) -> Tensor:
    """Divide each row [R, V] by its temperature [R]; T < 1 sharpens the distribution, T > 1 flattens it."""
    return logits / temperature.unsqueeze(-1)


def apply_top_k_top_p(logits: Tensor, top_k: Tensor | None, top_p: Tensor | None) -> Tensor:
    """Set tokens outside each row's top-k, then outside its top-p nucleus, to -inf.

    top_k [R] int64 (0 = off for that row) and top_p [R] float32 (1.0 = off); None = off for every row.
    Both filters need the row sorted, so they share one sort: work in sorted order, then scatter back.
    The sort is stable, so among equally likely tokens the lowest id ranks first (as in greedy argmax).
    """
    if top_k is None and top_p is None:
        return logits
    sorted_logits, sorted_ids = logits.sort(dim=-1, descending=True, stable=True)
    if top_k is not None:
        vocab_size = logits.shape[-1]
        k = torch.where(top_k > 0, top_k.clamp(max=vocab_size), vocab_size)
        kth_largest = sorted_logits.gather(-1, (k - 1).unsqueeze(-1))
        sorted_logits = sorted_logits.masked_fill(sorted_logits < kth_largest, float("-inf"))
    if top_p is not None:
        sorted_probs = sorted_logits.softmax(dim=-1)
        # A token is outside the nucleus if the tokens ranked above it already hold top_p of the mass.
        # The first token has 0 mass above it, so it always survives. Rows with top_p = 1 skip the
        # filter: float32 rounding can push the cumulative sum past 1.0 and cut the tail by accident.
        mass_above = sorted_probs.cumsum(dim=-1) - sorted_probs
        outside_nucleus = (mass_above >= top_p.unsqueeze(-1)) & (top_p < 1).unsqueeze(-1)
        sorted_logits = sorted_logits.masked_fill(outside_nucleus, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, sorted_ids, sorted_logits)


def apply_min_p(logits: Tensor, min_p: Tensor | None) -> Tensor:
    """Set tokens with p < min_p * max(p) to -inf (min_p [R], 0 = off; None = off for every row)."""
    if min_p is None:
        return logits
    probs = logits.softmax(dim=-1)
    too_unlikely = probs < min_p.unsqueeze(-1) * probs.amax(dim=-1, keepdim=True)
    return logits.masked_fill(too_unlikely, float("-inf"))


def process_logits(
    logits: Tensor,
    temperature: Tensor,
    top_k: Tensor | None,
    top_p: Tensor | None,
    min_p: Tensor | None,
) -> Tensor:
    """Logits [R, V] -> processed logits [R, V]: temperature, then top-k, top-p, min-p (-inf = filtered).

    softmax of the result is the distribution a random row samples from. Both the sampler and
    `softmax_probs` go through here, so there is one definition of that distribution.
    """
    logits = apply_temperature(logits, temperature)
    logits = apply_top_k_top_p(logits, top_k, top_p)
    return apply_min_p(logits, min_p)


def _filter_tensors(
    params: Sequence[SamplingParams], device: torch.device | str
) -> tuple[Tensor, Tensor | None, Tensor | None, Tensor | None]:
    """Per-row temperature, top_k, top_p, min_p tensors; a filter no row uses comes back as None.

    Greedy rows get temperature 1.0 so that the division in `apply_temperature` is harmless; their
    token is the argmax anyway.
    """
    temperature = torch.tensor(
        [1.0 if p.is_greedy else p.temperature for p in params], dtype=torch.float32, device=device
    )
    top_k = [max(p.top_k, 0) for p in params]  # -1 and 0 both mean off
    top_p = [p.top_p for p in params]
    min_p = [p.min_p for p in params]
    return (
        temperature,
        torch.tensor(top_k, dtype=torch.int64, device=device) if any(top_k) else None,
        torch.tensor(top_p, dtype=torch.float32, device=device) if any(v < 1 for v in top_p) else None,
        torch.tensor(min_p, dtype=torch.float32, device=device) if any(min_p) else None,
    )


def softmax_probs(logits: Tensor, params: SamplingParams) -> Tensor:
    """The distribution `params` samples from, for logits [V] or [N, V] (every row under `params`).

    Temperature, top-k, top-p and min-p are applied exactly as in `Sampler`; a greedy request gets a
    one-hot at the argmax. min_tokens bans are not applied here: they depend on how far the request has
    got, not on its params, so a caller that needs them sets those logits to -inf first.
    """
    rows = logits.float().reshape(-1, logits.shape[-1])
    if params.is_greedy:
        probs = torch.nn.functional.one_hot(rows.argmax(dim=-1), rows.shape[-1]).float()
    else:
        probs = process_logits(rows, *_filter_tensors([params] * rows.shape[0], rows.device)).softmax(-1)
    return probs.reshape(logits.shape)


# ---- one step's batch ----


@dataclass
class SamplingMetadata:
    """Everything the sampler needs about the R rows of one step, as tensors on the logits' device."""

    temperature: Tensor  # [R] float32; 1.0 on greedy rows
    greedy: Tensor  # [R] bool
    all_greedy: bool  # lets the sampler skip steps 4-5 entirely
    top_k: Tensor | None  # [R] int64, 0 = off; None when no row uses top-k
    top_p: Tensor | None  # [R] float32, 1.0 = off; None when no row uses top-p
    min_p: Tensor | None  # [R] float32, 0.0 = off; None when no row uses min-p
    generators: list[torch.Generator | None]  # a row's own stream, or None for the sampler-wide one
    banned_token_ids: list[list[int]]  # per row; non-empty only while the request is short of min_tokens
    max_num_logprobs: int | None  # top-N to return, the max over rows; None = no row asked for logprobs

    @classmethod
    def build(
        cls,
        params: Sequence[SamplingParams],
        generators: Sequence[torch.Generator | None],
        num_output_tokens: Sequence[int],
        eos_token_ids: set[int],
        device: torch.device | str,
    ) -> SamplingMetadata:
        """Metadata for one step: row i is a request with `params[i]` that has produced
        `num_output_tokens[i]` tokens so far and draws its noise from `generators[i]`."""
        if not len(params) == len(generators) == len(num_output_tokens):
            raise ValueError(
                f"params, generators and num_output_tokens must have one entry per row, got "
                f"{len(params)}, {len(generators)} and {len(num_output_tokens)}"
            )
        temperature, top_k, top_p, min_p = _filter_tensors(params, device)
        greedy = [p.is_greedy for p in params]
        requested_logprobs = [p.logprobs for p in params if p.logprobs is not None]
        return cls(
            temperature=temperature,
            greedy=torch.tensor(greedy, dtype=torch.bool, device=device),
            all_greedy=all(greedy),
            top_k=top_k,
            top_p=top_p,
            min_p=min_p,
            generators=list(generators),
            banned_token_ids=[
                _banned_token_ids(p, n, eos_token_ids) for p, n in zip(params, num_output_tokens, strict=True)
            ],
            max_num_logprobs=max(requested_logprobs, default=None),
        )


def _banned_token_ids(params: SamplingParams, num_output_tokens: int, eos_token_ids: set[int]) -> list[int]:
    """The ids a request may not sample yet: everything that would stop it before min_tokens."""
    if num_output_tokens >= params.min_tokens:
        return []
    stopping_ids = set(params.stop_token_ids)
    if not params.ignore_eos:
        stopping_ids |= eos_token_ids
    return sorted(stopping_ids)


def apply_token_bans(logits: Tensor, banned_token_ids: list[list[int]]) -> Tensor:
    """Set logits[row, id] to -inf for every banned id of every row (returns a new tensor)."""
    rows = [row for row, ids in enumerate(banned_token_ids) for _ in ids]
    if not rows:
        return logits
    cols = [token_id for ids in banned_token_ids for token_id in ids]
    index = (torch.tensor(rows, device=logits.device), torch.tensor(cols, device=logits.device))
    return logits.index_put(index, torch.tensor(float("-inf"), device=logits.device))


# ---- the sampler ----


@dataclass
class SamplerOutput:
    """One token per row, and the logprobs of the raw model distribution (see the module docstring)."""

    sampled_token_ids: Tensor  # [R] int64
    logprobs: Tensor | None  # [R] float32: raw logprob of the sampled token; None if no row asked
    top_logprobs: tuple[Tensor, Tensor] | None  # ([R, N] values, [R, N] ids), descending; None if N == 0


class Sampler:
    """Turns a step's logits into tokens; holds the random stream of requests that have no seed."""

    def __init__(self, seed: int = 0, device: torch.device | str = "cpu") -> None:
        self.generator = make_generator(seed, device)

    def __call__(self, logits: Tensor, meta: SamplingMetadata) -> SamplerOutput:
        logits = logits.float()
        raw_logprobs = logits.log_softmax(dim=-1) if meta.max_num_logprobs is not None else None
        logits = apply_token_bans(logits, meta.banned_token_ids)
        sampled = logits.argmax(dim=-1)  # the greedy rows' answer
        if not meta.all_greedy:
            probs = process_logits(logits, meta.temperature, meta.top_k, meta.top_p, meta.min_p).softmax(-1)
            noise = self._exponential_noise(probs, meta.generators)
            sampled = torch.where(meta.greedy, sampled, probs.div(noise).argmax(dim=-1))
        return with_logprobs(sampled, raw_logprobs, meta.max_num_logprobs)

    def _exponential_noise(self, like: Tensor, generators: list[torch.Generator | None]) -> Tensor:
        """q ~ Exp(1) shaped like `like` [R, V]; row i comes from generators[i] (or the sampler's own)."""
        noise = torch.empty_like(like)
        if all(generator is None for generator in generators):
            noise.exponential_(generator=self.generator)
        else:
            for row, generator in enumerate(generators):
                noise[row].exponential_(generator=generator if generator is not None else self.generator)
        # Guard against an exact 0: p / 0 would be NaN for a masked token, and argmax would pick NaN.
        return noise.clamp_(min=torch.finfo(noise.dtype).tiny)

    def draw(self, probs: Tensor, generator: torch.Generator | None) -> int:
        """One token from the distribution `probs` [V] (step 5), with `generator` or the sampler's own."""
        return int(probs.div(self._exponential_noise(probs.unsqueeze(0), [generator])[0]).argmax())


def with_logprobs(sampled: Tensor, raw_logprobs: Tensor | None, max_num_logprobs: int | None) -> SamplerOutput:
    """The sampler's output for tokens `sampled` [R], with the raw logprobs the rows asked for (step 1)."""
    if raw_logprobs is None:
        return SamplerOutput(sampled_token_ids=sampled, logprobs=None, top_logprobs=None)
    chosen = raw_logprobs.gather(-1, sampled.unsqueeze(-1)).squeeze(-1)
    top = None
    if max_num_logprobs > 0:
        values, ids = raw_logprobs.topk(max_num_logprobs, dim=-1)
        top = (values, ids)
    return SamplerOutput(sampled_token_ids=sampled, logprobs=chosen, top_logprobs=top)
