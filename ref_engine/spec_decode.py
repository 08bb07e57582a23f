"""Speculative decoding: proposers that guess the next k tokens, and the verifier that keeps them exact.

A decode step reads every weight to produce one token per request; while decode is memory-bound, running
1 + k tokens of the same request costs about as much as running one. So a cheap proposer drafts k tokens,
the target model scores the last known token and the k drafts in one step (k + 1 rows of logits), and the
verifier keeps the longest acceptable prefix of the draft plus one token of the target's own.

Proposers (`EngineConfig.speculative_method`), both answering `propose(requests, max_drafts, generators)`:
- `NgramProposer` ("ngram", prompt lookup decoding): find the context's last n-gram earlier in the context
  and propose what followed it. Free to run, q is a point mass; it shines when the output copies its input.
- `DraftModelProposer` ("draft_model"): a smaller model with the same tokenizer and its own paged KV cache,
  run k times autoregressively per engine step. `speculative_model="self:L"` makes the target's first L
  layers (with its final norm and lm_head) the draft, so one model on disk is enough to try it.

The verifier, `RejectionSampler` (Leviathan et al., ICML'23; Chen et al., 2023), on the target's
processed distribution p (exactly what `Sampler` would sample from: bans, temperature, top-k/p, min-p):
- greedy requests accept drafts while they equal the target's argmax, then add the target's argmax at the
  first mismatch (or after the last draft: the bonus token), so the output is greedy decoding's, token
  for token;
- sampled requests accept draft token x with probability min(1, p(x) / q(x)); on rejection they draw
  from the residual max(0, p - q) normalized, and stop; if all k are accepted they draw a bonus token from
  the next position's p. Every emitted token is then distributed exactly as p (lesson 5 proves it). The
  uniform draws and the residual draws come from the request's own seeded generator.

Invariant: the proposer never changes what is generated, only how many steps it takes.

Lesson: lessons/05-speculative-decoding.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn

from core.arch_config import ArchConfig
from core.block_pool import BlockPool
from core.config import EngineConfig
from core.interfaces import ScheduledRequest, SchedulerOutput
from core.kv_sizing import DraftFootprint
from core.math_utils import cdiv
from core.request import Request
from ref_engine.model.loader import LoadedModel, load_model
from ref_engine.runner import ModelRunner
from ref_engine.sampler import (
    Sampler,
    SamplerOutput,
    SamplingMetadata,
    apply_token_bans,
    process_logits,
    softmax_probs,
    with_logprobs,
)
from ref_engine.worker import parameter_bytes


@dataclass
class Draft:
    """One request's guesses: `token_ids`, and `probs` [len, V], the distribution q each was drawn from
    (None: a point mass on the token, as for n-gram proposals and greedy drafts)."""

    token_ids: list[int]
    probs: Tensor | None = None


# ---- proposers ----

def ngram_lookup(token_ids: Sequence[int], k: int, n_min: int, n_max: int) -> list[int]:
    """Prompt lookup: the up-to-k tokens that followed the latest earlier occurrence of the context's last
    n-gram, with n as large as possible in [n_min, n_max]; [] when no n-gram of n_min tokens recurs."""
    last = len(token_ids) - 1
    best_len, best_end = 0, -1
    for end in range(last - 1, -1, -1):  # the most recent occurrence first
        length = 0
        while length < n_max and length <= end and token_ids[end - length] == token_ids[last - length]:
            length += 1
        if length > best_len:
            best_len, best_end = length, end
            if length == n_max:
                break
    if best_len < n_min:
        return []
    return list(token_ids[best_end + 1: best_end + 1 + k])


class NgramProposer:
    """Drafts by prompt lookup (`ngram_lookup`); no model, no state."""

    def __init__(self, prompt_lookup_min: int, prompt_lookup_max: int) -> None:
        self.n_min, self.n_max = prompt_lookup_min, prompt_lookup_max

    def propose(self, requests: Sequence[Request], max_drafts: Sequence[int],
                generators: Sequence[torch.Generator | None]) -> list[Draft]:
        return [Draft(ngram_lookup(r.token_ids(0, r.num_tokens), k, self.n_min, self.n_max))
                for r, k in zip(requests, max_drafts, strict=True)]

    def free(self, request_id: str) -> None:
        """Nothing to free: the proposer keeps no per-request state."""


class EarlyExitDraft(nn.Module):
    """The target's first `num_layers` decoder layers, then its final norm and lm_head: a draft model that
    shares every weight with the target (`speculative_model="self:L"`)."""

    def __init__(self, target: nn.Module, num_layers: int) -> None:
        super().__init__()
        self.target = target
        self.num_layers = num_layers

    def forward(self, input_ids: Tensor, positions: Tensor, kv_caches: list[Tensor], attn_metadata: object) -> Tensor:
        return self.target(input_ids, positions, kv_caches, attn_metadata, num_layers=self.num_layers)

    def compute_logits(self, hidden: Tensor) -> Tensor:
        return self.target.compute_logits(hidden)


class DraftModelProposer:
    """Drafts with a small model, k autoregressive steps per engine step, over its own paged KV cache.

    The draft keeps, per request, the token ids whose K/V its cache holds. Each `propose` first catches up
    from the longest prefix of those that still matches the request (rejected drafts drop out here; the
    whole prompt on the first call), which yields the first draft token, then runs one token at a time.
    Its blocks come from its own pool; a request it cannot fit simply gets no draft this step.
    """

    def __init__(self, model: nn.Module, arch: ArchConfig, sampler: Sampler, *, num_kv_blocks: int,
                 block_size: int, dtype: torch.dtype, device: torch.device) -> None:
        self.runner = ModelRunner(model, arch, num_kv_blocks=num_kv_blocks, num_swap_blocks=0,
                                  block_size=block_size, dtype=dtype, device=device)
        self.block_pool = BlockPool(num_kv_blocks)
        self.block_size = block_size
        self.sampler = sampler
        self.block_tables: dict[str, list[int]] = {}
        self.cached_token_ids: dict[str, list[int]] = {}  # tokens whose K/V the draft's cache holds

    def propose(self, requests: Sequence[Request], max_drafts: Sequence[int],
                generators: Sequence[torch.Generator | None]) -> list[Draft]:
        drafts = [Draft([]) for _ in requests]
        q_rows: list[list[Tensor]] = [[] for _ in requests]
        # row state: (index in requests, drafts wanted, tokens to run now, their first position)
        rows = []
        for i, (request, k) in enumerate(zip(requests, max_drafts, strict=True)):
            tokens = request.token_ids(0, request.num_tokens)
            cached = self.cached_token_ids.get(request.request_id, [])
            start = min(_common_prefix_len(cached, tokens), len(tokens) - 1)
            if self._reserve(request.request_id, len(tokens) + k - 1):
                self.cached_token_ids[request.request_id] = tokens
                rows.append((i, k, tokens[start:], start))
        for step in range(max((k for _, k, _, _ in rows), default=0)):
            rows = [row for row in rows if row[1] > step]
            scheduled = [ScheduledRequest(requests[i].request_id, chunk, start,
                                          self.block_tables[requests[i].request_id], needs_logits=True)
                         for i, _, chunk, start in rows]
            logits = self.runner.execute_model(SchedulerOutput(step_id=step, scheduled=scheduled)).logits
            next_rows = []
            for (i, k, chunk, start), row_logits in zip(rows, logits):
                params = requests[i].sampling_params
                if params.is_greedy:
                    token = int(row_logits.argmax())
                else:
                    q = softmax_probs(row_logits, params)
                    token = self.sampler.draw(q, generators[i])
                    q_rows[i].append(q)
                drafts[i].token_ids.append(token)
                if step + 1 < k:  # the next step computes this token's K/V
                    self.cached_token_ids[requests[i].request_id].append(token)
                next_rows.append((i, k, [token], start + len(chunk)))
            rows = next_rows
        for draft, q in zip(drafts, q_rows):
            draft.probs = torch.stack(q) if q else None
        return drafts

    def free(self, request_id: str) -> None:
        """Give back the request's draft blocks (it finished or was aborted)."""
        self.block_pool.free_blocks(self.block_tables.pop(request_id, []))
        self.cached_token_ids.pop(request_id, None)

    def _reserve(self, request_id: str, num_tokens: int) -> bool:
        table = self.block_tables.setdefault(request_id, [])
        missing = cdiv(num_tokens, self.block_size) - len(table)
        if missing > self.block_pool.num_free_blocks:
            return False
        if missing > 0:
            table.extend(self.block_pool.get_new_blocks(missing))
        return True


def _common_prefix_len(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    return next(i for i in range(n) if a[i] != b[i])


Proposer = NgramProposer | DraftModelProposer


@dataclass
class DraftModel:
    """The draft of `speculative_method="draft_model"`, loaded before the KV pools are sized: its pool
    shares the target's block ids, so the sizing counts its blocks and weights (`footprint`)."""

    model: nn.Module
    arch: ArchConfig
    weight_bytes: int  # its own weights on the device; 0 for "self:L", which reuses the target's

    def footprint(self, block_size: int, dtype: torch.dtype) -> DraftFootprint:
        """What it adds to a pool of blocks of `block_size` tokens kept in `dtype` (core/kv_sizing.py)."""
        return DraftFootprint(self.arch.kv_bytes_per_block(block_size, dtype.itemsize), self.weight_bytes)


def load_draft_model(config: EngineConfig, target: LoadedModel, *, dtype: torch.dtype,
                     device: torch.device) -> DraftModel | None:
    """The draft model `config.speculative_model` names, or None unless `speculative_method="draft_model"`.
    A draft model from a path must share the target's vocabulary; "self:L" must leave out at least one of
    the target's layers."""
    if config.speculative_method != "draft_model":
        return None
    num_layers = config.draft_num_layers
    if num_layers is not None:
        if num_layers >= target.arch.num_layers:
            raise ValueError(f"speculative_model={config.speculative_model!r}: the target has "
                             f"{target.arch.num_layers} layers, so a self draft takes 1 to {target.arch.num_layers - 1}")
        return DraftModel(EarlyExitDraft(target.model, num_layers), replace(target.arch, num_layers=num_layers), 0)
    draft = load_model(config.speculative_model, dtype=dtype, device=device)
    if draft.arch.vocab_size != target.arch.vocab_size:
        raise ValueError(f"draft model {config.speculative_model!r} has a vocabulary of "
                         f"{draft.arch.vocab_size} tokens, the target {target.arch.vocab_size}: "
                         "a draft must share the target's tokenizer")
    return DraftModel(draft.model, draft.arch, parameter_bytes(draft.model))


def make_proposer(config: EngineConfig, draft: DraftModel | None, sampler: Sampler, *, num_kv_blocks: int,
                  dtype: torch.dtype, device: torch.device) -> Proposer | None:
    """The proposer `config.speculative_method` names, or None when speculation is off; "draft_model" runs
    `draft` (`load_draft_model`) over a pool of `num_kv_blocks`, the target's count."""
    if config.speculative_method is None:
        return None
    if config.speculative_method == "ngram":
        return NgramProposer(config.prompt_lookup_min, config.prompt_lookup_max)
    return DraftModelProposer(draft.model, draft.arch, sampler, num_kv_blocks=num_kv_blocks,
                              block_size=config.block_size, dtype=dtype, device=device)


# ---- verification ----

def verify_greedy(draft: Sequence[int], target_argmax: Sequence[int]) -> list[int]:
    """Accept drafts while they equal the target's argmax; then the target's argmax at that position
    (a correction, or the bonus token after the last draft). `target_argmax` has len(draft) + 1 entries."""
    accepted = 0
    while accepted < len(draft) and draft[accepted] == target_argmax[accepted]:
        accepted += 1
    return list(draft[:accepted]) + [target_argmax[accepted]]


class RejectionSampler:
    """Verifies a step's drafts against the target's logits; greedy and sampled rows as in the module
    docstring. Holds the `Sampler` whose draws (and random stream, for requests without a seed) it shares."""

    def __init__(self, sampler: Sampler) -> None:
        self.sampler = sampler

    def __call__(self, logits: Tensor, meta: SamplingMetadata, drafts: Sequence[Draft]
                 ) -> tuple[list[list[int]], SamplerOutput]:
        """Verify each request's draft. `logits` has len(draft) + 1 rows per request, in order, and `meta`
        one row per logits row (a request's rows share its params and generator; row j is its output
        position num_output_tokens + j, for min_tokens bans).

        Returns the emitted tokens per request (accepted drafts, then the target's token), and a
        `SamplerOutput` whose row r is the token emitted from logits row r (with its raw logprobs; rows past
        a request's emitted tokens hold 0 and are to be ignored)."""
        logits = logits.float()
        raw_logprobs = logits.log_softmax(dim=-1) if meta.max_num_logprobs is not None else None
        logits = apply_token_bans(logits, meta.banned_token_ids)
        target_argmax = logits.argmax(dim=-1).tolist()
        probs = None if meta.all_greedy else process_logits(
            logits, meta.temperature, meta.top_k, meta.top_p, meta.min_p).softmax(-1)
        emitted: list[list[int]] = []
        row_tokens = [0] * logits.shape[0]
        row = 0
        for draft in drafts:
            n = len(draft.token_ids) + 1
            if meta.greedy[row]:
                tokens = verify_greedy(draft.token_ids, target_argmax[row: row + n])
            else:
                tokens = self.verify_sampled(draft, probs[row: row + n], meta.generators[row])
            row_tokens[row: row + len(tokens)] = tokens
            emitted.append(tokens)
            row += n
        sampled = torch.tensor(row_tokens, dtype=torch.long, device=logits.device)
        return emitted, with_logprobs(sampled, raw_logprobs, meta.max_num_logprobs)

    def verify_sampled(self, draft: Draft, p: Tensor, generator: torch.Generator | None) -> list[int]:
        """Rejection sampling of one request's draft against the target's distributions `p` [len + 1, V]."""
        generator = generator if generator is not None else self.sampler.generator
        for i, x in enumerate(draft.token_ids):
            q_x = 1.0 if draft.probs is None else float(draft.probs[i, x])
            u = float(torch.rand((), generator=generator, device=p.device))
            if u * q_x < float(p[i, x]):  # accept with probability min(1, p(x) / q(x))
                continue
            q = draft.probs[i] if draft.probs is not None else torch.zeros_like(p[i]).index_fill_(0, torch.tensor(
                [x], device=p.device), 1.0)
            residual = (p[i] - q).clamp_(min=0)  # unnormalized: the draw's argmax(p / noise) ignores scale
            if not bool(residual.sum() > 0):  # p == q up to rounding, so p itself is the residual
                residual = p[i]
            return list(draft.token_ids[:i]) + [self.sampler.draw(residual, generator)]
        return list(draft.token_ids) + [self.sampler.draw(p[len(draft.token_ids)], generator)]
