"""`EngineConfig`: every scheduling and memory knob, with vLLM's names, checked once on construction.

The same object configures the real engine and the simulator, so a sweep in a notebook changes one value
and both sides see it. Defaults suit a small machine; vLLM's own defaults are noted where they differ.
`ParallelConfig`, beside it, says how the engine splits its model over processes (tensor parallelism); the
simulator takes the same degree as its own keyword.

Lesson: lessons/07-tuning-knobs.md (what each knob trades); the prefill budgets and scheduling policies in
lessons/03-chunked-prefill-and-disaggregation.md#budget-knobs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

from core.arch_config import ArchConfig
from core.scheduler_registry import SCHEDULERS, SCHEDULING_POLICIES

PreemptionMode = Literal["recompute", "swap"]
KVAllocation = Literal["paged", "contiguous", "contiguous_exact"]
SpeculativeMethod = Literal["ngram", "draft_model"]
# How the engine may store its weights besides the float reference (ref_engine/model/quantization.py): a
# load-time choice, not a scheduler knob, listed here because the command lines offer it without torch.
QUANTIZATION_METHODS = ("int8", "int4")
# Weights per int4 scale and zero that torch's int4 kernel takes (ref_engine/model/int4.py), and the default, a
# Q4_1 block's; listed here for the command lines, and for the name both sides give an int4 model (`int4_name`).
INT4_GROUP_SIZES = (32, 64, 128, 256)
INT4_GROUP_SIZE = 32
INT4_GROUPED_PREFIX = "int4-g"
# What the engine computes in (vLLM's `dtype`, less its "auto": float32 is this engine's reference, whatever the
# checkpoint stores). Also a load-time choice (ref_engine/model/loader.py), listed here for the same reason.
DTYPES = ("float32", "bfloat16", "float16")
# What the KV cache may be stored in (vLLM's `kv_cache_dtype`): "auto" is the model's dtype. Also a load-time
# choice (ref_engine/attention.py).
KV_CACHE_DTYPES = ("auto", "float32", "bfloat16", "float16")
# How float32 matmuls may round on a GPU (torch's `set_float32_matmul_precision` names, as vLLM's
# VLLM_FLOAT32_MATMUL_PRECISION): "highest", full float32; "high", TF32 tensor cores (10-bit mantissa products).
FLOAT32_MATMUL_PRECISIONS = ("highest", "high")


def int4_name(group_size: int) -> str:
    """An int4 model's name for its numerics: "int4" in groups of `INT4_GROUP_SIZE`, else "int4-gN". The engine
    labels such a model with it (ref_engine/model/loader.py); the simulator prices the name by its bytes
    (sim/hardware.py)."""
    return "int4" if group_size == INT4_GROUP_SIZE else f"{INT4_GROUPED_PREFIX}{group_size}"


# Where an engine's tensor-parallel ranks run (vLLM's names): "uni", one worker in the engine's process; "mp",
# one worker process per rank (ref_engine/executor/).
DistributedExecutorBackend = Literal["uni", "mp"]
TenantTable = tuple[tuple[str, Any], ...]  # (tenant, value) pairs, sorted by tenant: hashable, unlike a dict


@dataclass(frozen=True)
class EngineConfig:
    """Knobs of one engine instance.

    `num_kv_blocks` fixes the pool size exactly (tests and lessons use it); else `kv_cache_memory` bytes
    are cut into blocks; else the pool is what `gpu_memory_utilization` of the device leaves after the
    weights and activations (a fixed pool on a CPU). Engine and simulator apply the same rule
    (core/kv_sizing.py).

    Prefill budgets (None = off) bound what one step of the continuous scheduler may hold, on top of
    `max_num_batched_tokens` and `max_num_seqs`. A row that computes more than its request's last known
    token is a *prefill* row (a prompt chunk, or the recompute of a preempted request); a row that computes
    only that token (and its drafts) is a *decode* row. How they map onto vLLM's knobs:
    - `long_prefill_token_threshold` is vLLM's: the most prefill tokens one request gets in a step (vLLM
      writes 0 for off; so may you);
    - `max_num_partial_prefills` is vLLM's name: the most prompts mid-prefill at once. vLLM's field defaults
      to 1, but V1 refuses any other value at start (`EngineArgs._check_feature_supported`) and its
      scheduler never reads it (V0's chunked-prefill scheduler did), so None (no limit) is what V1 does;
    - `prefill_budget_tokens` (a deployment manifest's name) caps a step's prefill tokens over all rows;
      vLLM has no such knob: V1 caps one request's chunk (`long_prefill_token_threshold`) and the step's
      total (`max_num_batched_tokens`), and nothing in between;
    - `decode_batch_max_tokens` (a deployment manifest's name) caps a step's decode tokens, as its name
      says: a decode row is one token, 1 + k with k drafts; vLLM bounds decodes only by `max_num_seqs`. The
      earliest admitted decodes go first; the row that meets the cap has its drafts cut to fit, and rows
      beyond it sit the step out and keep their blocks.
    The three prefill knobs cut or hold back prompt chunks, so they need `enable_chunked_prefill`.

    `scheduling` says how batches form ("continuous", "static", or a plug-in scheduler); within continuous
    batching, `scheduling_policy` (vLLM's knob) says who is admitted first and whom preemption picks:
    "fcfs" (arrival order), "priority" (`Request.priority`, lower first, as vLLM) or "fair" (per-tenant
    virtual token counters, core/fair.py), or a registered plug-in. `tenant_max_num_seqs` caps
    each tenant's running requests under every policy of continuous batching; `tenant_weights` configures
    "fair" only. A dict is accepted and kept as sorted (tenant, value) pairs so the config stays hashable.
    Requests without a tenant belong to the tenant "default".
    """

    block_size: int = 16
    max_num_seqs: int = 64  # vLLM v0.33.0: 256 or 1024 by GPU and usage context (lesson 1, token-budget)
    max_num_batched_tokens: int = 512  # the per-step token budget; vLLM v0.33.0: 2048-16384, likewise
    max_model_len: int | None = None  # None: the model's max_position_embeddings (vLLM's default)
    gpu_memory_utilization: float = 0.9  # share of the device memory for weights, activations and KV pool
    kv_cache_memory: int | None = None  # bytes for the KV pool; overrides gpu_memory_utilization
    num_kv_blocks: int | None = None  # exact pool size; overrides kv_cache_memory
    swap_space: float = 4  # GiB of host memory for preemption_mode="swap" (vLLM's knob and default)
    num_swap_blocks: int | None = None  # exact host pool in blocks; overrides swap_space (core/kv_sizing.py)
    enable_chunked_prefill: bool = True
    preemption_mode: PreemptionMode = "recompute"
    scheduling: str = "continuous"  # a policy registered in SCHEDULERS: "continuous", "static" or a plug-in
    scheduling_policy: str = "fcfs"  # within continuous batching: "fcfs", "priority", "fair" (SCHEDULING_POLICIES)
    long_prefill_token_threshold: int | None = None  # most prefill tokens per request and step (None, 0: off)
    max_num_partial_prefills: int | None = None  # most prompts mid-prefill at once (None: no limit, as vLLM V1)
    prefill_budget_tokens: int | None = None  # most prefill tokens in one step (None: max_num_batched_tokens)
    decode_batch_max_tokens: int | None = None  # most decode tokens (1 + drafts per row) in one step (None: off)
    tenant_weights: TenantTable | None = None  # "fair": tenant -> weight > 0 (missing tenants weigh 1)
    tenant_max_num_seqs: TenantTable | None = None  # tenant -> most running requests (missing: no cap)
    kv_allocation: KVAllocation = "paged"  # "contiguous*" reserve whole sequences up front (lesson 2)
    enable_prefix_caching: bool = True  # reuse computed KV blocks by content hash (vLLM's default: on)
    seed: int = 0
    # speculative decoding (lesson 5): a proposer drafts k tokens, the target verifies 1 + k in one step
    speculative_method: SpeculativeMethod | None = None  # None = off; "ngram" = prompt lookup
    num_speculative_tokens: int = 5  # k, the most draft tokens per request and step
    speculative_model: str | None = None  # "draft_model": a model path, or "self:L" (the target's first L layers)
    prompt_lookup_max: int = 4  # "ngram": the longest suffix n-gram looked up in the context
    prompt_lookup_min: int = 2  # "ngram": the shortest
    speculative_disable_by_batch_size: int | None = 4  # speculate only while at most this many requests run
    # (None: always); a big batch is compute-bound already, so verifying k more tokens each costs real time
    # CUDA graphs (ref_engine/cuda_graphs.py): the decode batch sizes captured under enforce_eager=False on a
    # GPU (vLLM's name). None: vLLM's list (1, 2, 4, multiples of 8, from 256 of 16) up to max_num_seqs; () none
    cudagraph_capture_sizes: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        positive = ("block_size", "max_num_seqs", "max_num_batched_tokens")
        for knob in positive:
            value = getattr(self, knob)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{knob} must be a positive integer, got {value!r}")
        for knob in ("enable_chunked_prefill", "enable_prefix_caching"):
            if not isinstance(getattr(self, knob), bool):
                raise ValueError(f"{knob} must be True or False, got {getattr(self, knob)!r}")
        for knob in ("max_model_len", "kv_cache_memory", "num_kv_blocks"):
            value = getattr(self, knob)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{knob} must be a positive integer or None, got {value!r}")
        utilization = self.gpu_memory_utilization
        if isinstance(utilization, bool) or not isinstance(utilization, (int, float)) or not 0 < utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {utilization!r}")
        if self.num_swap_blocks is not None and (not isinstance(self.num_swap_blocks, int)
                                                 or self.num_swap_blocks < 0):
            raise ValueError(f"num_swap_blocks must be a non-negative integer or None, got {self.num_swap_blocks!r}")
        if isinstance(self.swap_space, bool) or not isinstance(self.swap_space, (int, float)) or not (
                0 <= self.swap_space < math.inf):
            raise ValueError(f"swap_space must be a non-negative number of GiB, got {self.swap_space!r}")
        _check_choice("preemption_mode", self.preemption_mode, ("recompute", "swap"))
        _check_choice("scheduling", self.scheduling, tuple(SCHEDULERS))
        _check_choice("kv_allocation", self.kv_allocation, ("paged", "contiguous", "contiguous_exact"))
        self._check_speculative()
        self._check_cudagraph_capture_sizes()
        self._check_prefill_budgets()
        self._check_policy()
        if (not self.enable_chunked_prefill and self.max_model_len is not None
                and self.max_num_batched_tokens < self.max_model_len):
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= max_model_len "
                f"({self.max_model_len}) when enable_chunked_prefill=False, or a long prompt could never "
                "be scheduled")

    def _check_speculative(self) -> None:
        if self.speculative_method is not None:
            _check_choice("speculative_method", self.speculative_method, ("ngram", "draft_model"))
            if self.scheduling != "continuous":
                raise ValueError("speculative decoding needs scheduling='continuous' (a static batch reserves "
                                 "its slots up front and schedules no draft tokens)")
        for knob in ("num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min"):
            value = getattr(self, knob)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{knob} must be a positive integer, got {value!r}")
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(f"prompt_lookup_min ({self.prompt_lookup_min}) must be <= prompt_lookup_max "
                             f"({self.prompt_lookup_max})")
        limit = self.speculative_disable_by_batch_size
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
            raise ValueError(f"speculative_disable_by_batch_size must be a positive integer or None, got {limit!r}")
        if (self.speculative_method == "draft_model") != (self.speculative_model is not None):
            raise ValueError("speculative_model names the draft of speculative_method='draft_model', and that "
                             f"method needs one; got speculative_method={self.speculative_method!r}, "
                             f"speculative_model={self.speculative_model!r}")
        if self.speculative_model is not None and self.speculative_model.startswith("self:"):
            num_layers = self.speculative_model.removeprefix("self:")
            if not num_layers.isdigit() or int(num_layers) < 1:
                raise ValueError(f"speculative_model='self:L' needs L >= 1 layers, got {self.speculative_model!r}")

    def _check_cudagraph_capture_sizes(self) -> None:
        """Sizes kept sorted and unique, as a tuple (the config stays hashable); each a positive integer no larger
        than max_num_seqs, the most decode rows a step has."""
        sizes = self.cudagraph_capture_sizes
        if sizes is None:
            return
        try:
            sizes = sorted(set(sizes))
        except TypeError:
            raise ValueError(f"cudagraph_capture_sizes must be a list of positive integers or None (vLLM's "
                             f"default sizes), got {self.cudagraph_capture_sizes!r}") from None
        for size in sizes:
            if not isinstance(size, int) or isinstance(size, bool) or not 1 <= size <= self.max_num_seqs:
                raise ValueError(f"cudagraph_capture_sizes holds {size!r}; each size must be an integer from 1 to "
                                 f"max_num_seqs ({self.max_num_seqs}): a decode step has at most that many rows")
        object.__setattr__(self, "cudagraph_capture_sizes", tuple(sizes))

    def _check_prefill_budgets(self) -> None:
        threshold = self.long_prefill_token_threshold
        if threshold is not None and (not isinstance(threshold, int) or isinstance(threshold, bool)
                                      or threshold < 0):
            raise ValueError(f"long_prefill_token_threshold must be a non-negative integer or None (0, None: off), "
                             f"got {threshold!r}")
        for knob in ("max_num_partial_prefills", "prefill_budget_tokens", "decode_batch_max_tokens"):
            value = getattr(self, knob)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"{knob} must be a positive integer or None, got {value!r}")
        prefill_knobs = [k for k in ("long_prefill_token_threshold", "max_num_partial_prefills",
                                     "prefill_budget_tokens") if getattr(self, k)]
        if prefill_knobs and not self.enable_chunked_prefill:
            raise ValueError(f"{prefill_knobs[0]} cuts or holds back prompt chunks, so it needs "
                             "enable_chunked_prefill=True")
        if (prefill_knobs or self.decode_batch_max_tokens is not None) and self.scheduling == "static":
            knob = (prefill_knobs or ["decode_batch_max_tokens"])[0]
            raise ValueError(f"{knob} bounds the continuous scheduler's steps; a static batch runs every member "
                             "each step, so it needs scheduling='continuous' (or a plug-in on it)")
        budget = self.max_num_batched_tokens
        if self.prefill_budget_tokens is not None and self.prefill_budget_tokens > budget:
            raise ValueError(f"prefill_budget_tokens ({self.prefill_budget_tokens}) must be <= "
                             f"max_num_batched_tokens ({budget})")
        prefill_budget = self.prefill_budget_tokens or budget
        if threshold and threshold > prefill_budget:
            budget_knob = "prefill_budget_tokens" if self.prefill_budget_tokens else "max_num_batched_tokens"
            raise ValueError(f"long_prefill_token_threshold ({threshold}) must be <= {budget_knob} "
                             f"({prefill_budget}): one request's chunk cannot exceed the step's budget")

    def _check_policy(self) -> None:
        _check_choice("scheduling_policy", self.scheduling_policy, tuple(SCHEDULING_POLICIES))
        if self.scheduling_policy != "fcfs" and self.scheduling != "continuous":
            raise ValueError(f"scheduling_policy={self.scheduling_policy!r} orders continuous batching; "
                             f"scheduling={self.scheduling!r} keeps its own order, so it takes only 'fcfs'")
        _set_table(self, "tenant_weights", lambda w: not isinstance(w, bool) and isinstance(w, (int, float))
                   and 0 < w < math.inf, "a positive number")
        _set_table(self, "tenant_max_num_seqs", lambda n: not isinstance(n, bool) and isinstance(n, int) and n >= 1,
                   "a positive integer")
        if self.tenant_weights is not None and self.scheduling_policy != "fair":
            raise ValueError("tenant_weights configures scheduling_policy='fair', got "
                             f"scheduling_policy={self.scheduling_policy!r} (tenant_max_num_seqs works under "
                             "every policy)")
        if self.tenant_max_num_seqs is not None and self.scheduling != "continuous":
            raise ValueError("tenant_max_num_seqs caps admissions of continuous batching (any "
                             f"scheduling_policy); scheduling={self.scheduling!r} forms its own batches")

    @property
    def draft_num_layers(self) -> int | None:
        """L of speculative_model="self:L" (the target's first L layers as the draft), else None."""
        model = self.speculative_model
        return int(model.removeprefix("self:")) if model is not None and model.startswith("self:") else None

    def for_model(self, max_position_embeddings: int) -> EngineConfig:
        """This config with `max_model_len` settled for a model: the model's limit when unset, and an
        error when set beyond it. Engine and simulator both call this before building a scheduler."""
        if self.max_model_len is None:
            return self.replace(max_model_len=max_position_embeddings)
        if self.max_model_len > max_position_embeddings:
            raise ValueError(f"max_model_len ({self.max_model_len}) exceeds the model's "
                             f"max_position_embeddings ({max_position_embeddings})")
        return self

    def replace(self, **changes: Any) -> EngineConfig:
        """A copy with some knobs changed (validated again); unknown knob names are an error."""
        known = {f.name for f in fields(self)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise ValueError(f"unknown engine knob(s) {unknown}; known: {sorted(known)}")
        return EngineConfig(**{**asdict(self), **changes})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ParallelConfig:
    """How one engine splits its model over processes (vLLM's `ParallelConfig`, tensor parallelism only).

    `tensor_parallel_size` ranks each hold a share of every layer's attention heads and MLP columns, and
    all-reduce twice per layer (ref_engine/model/linear.py). `distributed_executor_backend` says where they run:
    "uni", one worker in the engine's process (degree 1 only), or "mp", one worker process per rank; None
    picks "mp" above degree 1, else "uni" (vLLM's default too). A CPU engine refuses more ranks than the
    machine has cores unless `allow_cpu_oversubscription` (ranks sharing a core take turns, and every
    all-reduce waits for the rank that is not running). Which degrees a model allows: `verify_with_model`.
    """

    tensor_parallel_size: int = 1
    distributed_executor_backend: DistributedExecutorBackend | None = None  # None: "mp" if tp > 1, else "uni"
    allow_cpu_oversubscription: bool = False  # let a CPU engine run more ranks than it has cores (warned)

    def __post_init__(self) -> None:
        tp = self.tensor_parallel_size
        if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
            raise ValueError(f"tensor_parallel_size must be a positive integer, got {tp!r}")
        if self.distributed_executor_backend is None:
            object.__setattr__(self, "distributed_executor_backend", "mp" if tp > 1 else "uni")
        _check_choice("distributed_executor_backend", self.distributed_executor_backend, ("uni", "mp"))
        if self.distributed_executor_backend == "uni" and tp > 1:
            raise ValueError(f"distributed_executor_backend='uni' runs one worker in the engine's process, so "
                             f"tensor_parallel_size must be 1, got {tp}; use 'mp' (one process per rank)")
        if not isinstance(self.allow_cpu_oversubscription, bool):
            raise ValueError(f"allow_cpu_oversubscription must be True or False, got "
                             f"{self.allow_cpu_oversubscription!r}")

    def verify_with_model(self, arch: ArchConfig) -> None:
        """A ValueError naming `tensor_parallel_size` and the degrees `arch` allows, if this is not one."""
        allowed = tensor_parallel_sizes(arch)
        if self.tensor_parallel_size not in allowed:
            raise ValueError(
                f"tensor_parallel_size={self.tensor_parallel_size} does not split {arch.name}: each rank holds "
                f"whole heads of its {arch.num_attention_heads} attention heads, an equal share of its "
                f"{arch.num_kv_heads} KV heads (or one copied to tp / {arch.num_kv_heads} ranks) and of its "
                f"intermediate_size {arch.intermediate_size}; allowed: {', '.join(map(str, allowed))}")


def tensor_parallel_sizes(arch: ArchConfig) -> list[int]:
    """The tensor-parallel degrees that split `arch` (Megatron's rule, as vLLM checks it): a divisor of the
    attention heads and of the MLP width, that divides the KV heads or is a multiple of them (then each KV
    head is copied to tp / num_kv_heads ranks)."""
    return [tp for tp in range(1, arch.num_attention_heads + 1)
            if not arch.num_attention_heads % tp and not arch.intermediate_size % tp
            and (not arch.num_kv_heads % tp or not tp % arch.num_kv_heads)]


def _set_table(config: EngineConfig, knob: str, valid: Callable[[Any], bool], what: str) -> None:
    """Check a per-tenant knob and store it as (tenant, value) pairs sorted by tenant: a frozen config
    stays hashable and two configs with the same table compare equal. A dict or pairs are accepted."""
    table = getattr(config, knob)
    if table is None:
        return
    try:
        pairs = list(table.items() if isinstance(table, Mapping) else table)
        tenants = [tenant for tenant, _ in pairs]
    except (TypeError, ValueError):
        raise ValueError(f"{knob} must map tenant names to values, got {table!r}") from None
    if len(set(tenants)) != len(tenants) or not all(isinstance(t, str) and t for t in tenants):
        raise ValueError(f"{knob} must map distinct non-empty tenant names to values, got {table!r}")
    for tenant, value in pairs:
        if not valid(value):
            raise ValueError(f"{knob}[{tenant!r}] must be {what}, got {value!r}")
    object.__setattr__(config, knob, tuple(sorted(pairs)))


def _check_choice(knob: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{knob} must be one of {choices}, got {value!r}")
