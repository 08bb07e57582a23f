"""The cost model: how long one engine step takes, from the shape of the batch.

This module owns the simulator's only notion of time. The simulated executor asks `CostModel.step_time`
how long the batch the shared scheduler just picked would take, and advances the SimPy clock by that.
It also sizes a device's KV-cache pool from the model's dims (`kv_cache_num_blocks`, by the engine's own
rule in core/kv_sizing.py) and prices shipping KV between machines
(`CostModel.kv_transfer_time`). It never sees a scheduler class: a batch is a `BatchShape`, one
`(num_new_tokens, num_context_tokens)` pair per scheduled request, where `num_context_tokens` are the
tokens already in the KV cache before this step. A prefill chunk, a decode token and a 1 + k speculative
verification are all just pairs (q, c).

Notation (per step): L layers, H hidden size, nh attention heads, d head_dim, V vocabulary,
P = L * params_per_layer (weights of the decoder layers), b bytes per weight element of the linear layers,
a bytes per activation element (b, except 2 when the linear layers are 8-bit: FP8 checkpoints quantize only
the linear layers' weights and inputs and keep embeddings, lm_head, norms and activations in 16 bits,
per NVIDIA's ModelOpt FP8 model cards), h bytes per LM head weight (a, but 1 on this engine's int8 and int4
paths, which read the head through an int8 screen: `lm_head_dtype`), b_kv bytes per KV
element, kv = ArchConfig.kv_bytes_per_token(b_kv) = 2 * L * n_kv_heads * d * b_kv bytes, requests
i = 1..N with q_i new tokens and c_i context tokens, T = sum q_i tokens, R rows that need logits
(default N: one per request; a speculative verify needs k + 1), tp = tensor-parallel degree.

FLOPs (multiply-add = 2 FLOPs)
    linear_flops    = 2 * P * T  +  2 * V * H * R
                      every token goes through every layer's matmuls; the lm_head runs only for the R rows
                      that need logits (a mid-prompt prefill chunk needs none): 2 * (P + V * H) * T
                      when every token needs logits. RMSNorm weights are counted as matmul weights (a
                      0.01% overcount) to keep one parameter count.
    attention_flops = sum_i 4 * L * nh * d * q_i * (c_i + (q_i + 1) / 2)
                      QK^T and PV are 2 * d FLOPs per (query, key) pair per head each; query j of the chunk
                      (j = 1..q) sees the c cached keys plus j keys of its own chunk (causal), so the chunk
                      has q * c + q * (q + 1) / 2 pairs.

Bytes moved through memory (read once per step; caches and fusion are ignored)
    weight_bytes     = P * b + H * a  +  V * H * h  [if R > 0]  +  T * H * a
                       + weight_packing_passes * (P * b [if T >= 2]  +  V * H * h [if R >= 2])
                       all layer weights and the final norm, the whole lm_head matrix when any row needs
                       logits, and of the embedding table ONLY the T gathered rows (a lookup is not a
                       matmul; reading the whole table would wrongly price a 1 GB read into every step).
                       The last line is a CPU's: a matrix product of one row (GEMV) streams the weights
                       once, but one of two or more rows (GEMM) first copies them into cache-sized panels
                       ("packing"), extra passes over every weight. On the course machine one decode row
                       cost 18 ms of matmuls and two rows 42 ms, then nearly flat to 16 rows. Calibration
                       fits the passes (about 1.5); datasheet profiles have 0 (a GPU GEMM reads its
                       weights from HBM once).
    kv_read_bytes    = kv * sum_i (c_i + q_i)      attention reads the whole context, new tokens included
    kv_write_bytes   = kv * T                      the new tokens' K and V are written once
    activation_bytes = L * T * (4H + 2*nh*d + 2*n_kv_heads*d + 3*I) * a  +  R * V * a
                       each linear layer reads its input rows and writes its output rows once (qkv, o,
                       gate_up, down); elementwise ops are assumed fused. Small on a GPU at decode, large
                       on a CPU at big batches.

Time (seconds)
    compute_s  = linear_flops / (peak_flops[dtype] * matmul_efficiency[dtype] * r)   (dtype: the activations'
                 for a weight-only format the profile has no rate for, `compute_dtype`)
                 + attention_flops / (peak_flops[attention dtype] * attention_efficiency * r)
                 the attention dtype is the activations' (bf16 under FP8 weights: FP8 halves the linear
                 layers' time, not attention's); attention kernels rarely run at matmul speed (masks,
                 softmax, gathers); the efficiencies are fitted (sim/hardware.py)
    memory_s   = (weight + kv_read + kv_write + activation bytes) / (memory_bandwidth * bandwidth_efficiency * r)
                 r = HardwareProfile.tensor_parallel_rate(tp): tp on GPUs (a device per rank); on a CPU the
                 ranks share its cores: each has 1/tp of the work on t = max(1, cores // tp) threads, and where
                 they do not all fit the cores the OS shares the cores out, s = tp / (cores // t) ranks a core
                 (`tensor_parallel_sharing`), so r = tp * t / (threads * s) for tp > 1, 1 for tp = 1.
                 The LM head's share of FLOPs and bytes (2 * V * H * R, V * H * h (+ packing), R * V * a) runs at
                 r_head = HardwareProfile.lm_head_rate(tp) instead: r on GPUs (vLLM's vocabulary-parallel head),
                 on a CPU max(1, cores // tp) / threads (ref_engine runs the head on rank 0 alone, after the layers)
    overhead_s = s * f * (step_overhead_s + per_seq_overhead_s * N + per_token_overhead_s * T
                 + per_block_overhead_s * blocks),    blocks = sum_i ceil((c_i + q_i) / block_size)
                 (or BatchShape.num_blocks_touched when the caller knows it); s = f = 1 but on a CPU whose cores
                 cannot hold all tp ranks at once: each rank runs the whole forward's Python (on the course VM
                 the engine's own process took 0.4-4 ms of a 56-376 ms step, the rest was the forward), so the
                 ranks share the cores for s times its length.
    turns f    on such a CPU the ranks run in lockstep, an all-reduce after every attention and every MLP: 2 L
                 stretches a step, one rank's own stretch being w = (combine(compute_s, memory_s) / s + overhead
                 of one rank) / (2 L). A stretch shorter than the OS's time slice
                 (`HardwareProfile.scheduler_slice_s`, measured) runs whole, so the ranks take turns, n =
                 `tensor_parallel_rounds(tp)` of them, where fair sharing would take s: f = n / s (3 one-thread
                 ranks on 2 cores: 2 / 1.5), applied to compute_s, memory_s and overhead_s. A longer stretch is
                 cut into slices and shared fairly: f = 1. A profile with no slice measured (0) takes turns.
    comm_s     = 0 if tp == 1, else 2 * L all-reduces (after attention and after the MLP) of T * H * a bytes,
                 each costing latency + 2 * (tp - 1) / tp * (T * H * a) / bus bandwidth
                 (a ring all-reduce sends and receives 2 (tp - 1) / tp of the buffer per device), where
                 (latency, bus bandwidth) = HardwareProfile.allreduce_terms(tp): measured among tp processes
                 where the profile has that (a calibrated CPU's gloo), else (interconnect_latency_s,
                 interconnect_bandwidth * interconnect_efficiency)
    total_s    = combine(compute_s, memory_s) + comm_s + overhead_s

`combine="max"` (the default of datasheet profiles; `HardwareProfile.combine` sets it) is the roofline: a GPU overlaps arithmetic with memory traffic, so the slower
of the two bounds the step, and `bound` says which. `combine="sum"` adds them: on a CPU the same cores do
both and overlap is poor, and a sum is linear in the unknowns 1/FLOPs, 1/bandwidth and the overheads, so
a calibrator can fit it by least squares (see `CostModel.roofline_features`; calibrated profiles keep every
efficiency at 1.0).

`combine="kernels"` puts each group of kernels on a roofline of its own, and runs the groups in turn, as a
GPU does: a step's matmuls cannot hide its attention's memory traffic, nor the other way round, because the
two are different kernels, launched one after the other. compute_s and memory_s split by group,
    linear_compute_s    = the linear_flops term of compute_s (the LM head's included)
    attention_compute_s = the attention_flops term of compute_s
    attention_memory_s  = (kv_read + kv_write bytes) / (memory_bandwidth * bandwidth_efficiency * r)
    linear_memory_s     = memory_s - attention_memory_s    (weights, packing passes, activations, logits)
    combine    = max(linear_compute_s, linear_memory_s) + max(attention_compute_s, attention_memory_s)
compute_s and memory_s are still the step's totals (their sum is the "sum" form's core, their max the "max"
form's, and the kernels' core lies between the two). `bound` is the limit that most of the kernel time ran
under: "compute" when the compute-bound groups' time is at least the memory-bound groups' (a large batch's
matmuls against its decode attention, say). On a CPU whose tp ranks take turns, each group's layer part is
stretched by f and the LM head's part is added at its own rate before the group's max, as for the whole step.
Every other term (overheads, comm_s, the turns, the LM head's rate) is the same in the three forms.

Pipeline parallelism is sim/pipeline.py, on top of this model.

Tensor parallelism divides FLOPs and bytes evenly among the tp ranks (weights, heads and KV are sharded), which
run at r times one device's rates together. Caveats, kept out for simplicity: activations of width H are
replicated rather than split, KV heads are replicated when tp > n_kv_heads, and the vocabulary-parallel
lm_head's gather is not priced.

Lesson: lessons/01-continuous-batching.md (the cost of a step); KV pool size in lessons/02-paged-attention.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from core.arch_config import ArchConfig
from core.config import QUANTIZATION_METHODS, EngineConfig
from core.kv_sizing import num_kv_blocks
from core.metrics import StepRecord
from sim.hardware import COMBINE_MODES, WEIGHT_ONLY_DTYPES, HardwareProfile, dtype_bytes, weight_format

Combine = Literal["max", "sum", "kernels"]  # sim.hardware.COMBINE_MODES


# ---- the batch -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class BatchShape:
    """What the cost model needs to know about one step: per request, new tokens and cached tokens.

    query_lens[i]      tokens request i computes this step (prefill chunk length, 1 for decode, 1 + k to verify)
    context_lens[i]    tokens of request i already in the KV cache before this step
    num_blocks_touched KV blocks the attention reads; None = sum of ceil((c + q) / block_size)
    num_logit_rows     rows that need logits; None = one per request
    """

    query_lens: tuple[int, ...]
    context_lens: tuple[int, ...]
    num_blocks_touched: int | None = None
    num_logit_rows: int | None = None

    @property
    def logit_rows(self) -> int:
        """Rows the LM head computes: `num_logit_rows`, else one per request."""
        return self.num_seqs if self.num_logit_rows is None else self.num_logit_rows

    def __post_init__(self) -> None:
        # Accept lists too, but store tuples so the shape stays hashable and immutable.
        if not isinstance(self.query_lens, tuple):
            object.__setattr__(self, "query_lens", tuple(self.query_lens))
        if not isinstance(self.context_lens, tuple):
            object.__setattr__(self, "context_lens", tuple(self.context_lens))
        if not self.query_lens:
            raise ValueError("a step schedules at least one request; got an empty batch")
        if len(self.query_lens) != len(self.context_lens):
            raise ValueError(f"query_lens has {len(self.query_lens)} entries but context_lens has "
                             f"{len(self.context_lens)}; need one of each per request")
        if min(self.query_lens) < 1:
            raise ValueError(f"every scheduled request computes >= 1 token; got query_lens={self.query_lens}")
        if min(self.context_lens) < 0:
            raise ValueError(f"context lengths must be >= 0; got context_lens={self.context_lens}")
        if self.num_blocks_touched is not None and self.num_blocks_touched < 0:
            raise ValueError(f"num_blocks_touched must be >= 0, got {self.num_blocks_touched}")
        if self.num_logit_rows is not None and self.num_logit_rows < 0:
            raise ValueError(f"num_logit_rows must be >= 0, got {self.num_logit_rows}")

    @classmethod
    def from_lists(cls, query_lens: Sequence[int], context_lens: Sequence[int],
                   num_blocks_touched: int | None = None, num_logit_rows: int | None = None) -> BatchShape:
        return cls(tuple(query_lens), tuple(context_lens), num_blocks_touched, num_logit_rows)

    @classmethod
    def from_pairs(cls, pairs: Iterable[tuple[int, int]], num_blocks_touched: int | None = None,
                   num_logit_rows: int | None = None) -> BatchShape:
        """From `[(num_new_tokens, num_context_tokens), ...]`, one pair per scheduled request."""
        pairs = list(pairs)
        return cls(tuple(q for q, _ in pairs), tuple(c for _, c in pairs), num_blocks_touched,
                   num_logit_rows)

    @classmethod
    def from_step(cls, step: StepRecord) -> BatchShape:
        """The shape of one executed step (the engine's or the simulator's), logit rows included."""
        return cls(step.query_lens, step.context_lens, num_logit_rows=step.num_logit_rows)

    @classmethod
    def decode(cls, batch_size: int, context_len: int) -> BatchShape:
        """`batch_size` requests each decoding one token after `context_len` cached tokens."""
        return cls((1,) * batch_size, (context_len,) * batch_size)

    @classmethod
    def verify(cls, batch_size: int, context_len: int, k: int) -> BatchShape:
        """`batch_size` requests each verifying k drafts after `context_len` cached tokens: 1 + k tokens, with
        logits on every one of them (each draft is scored)."""
        return cls((1 + k,) * batch_size, (context_len,) * batch_size, num_logit_rows=(1 + k) * batch_size)

    @classmethod
    def prefill(cls, prompt_len: int, num_prompts: int = 1) -> BatchShape:
        """`num_prompts` whole prompts of `prompt_len` tokens, nothing cached."""
        return cls((prompt_len,) * num_prompts, (0,) * num_prompts)

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)

    @property
    def num_tokens(self) -> int:
        return sum(self.query_lens)


# ---- the result ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class StepCost:
    """Every term of one step's time. FLOPs and bytes are totals over all tp devices; times are wall time.

    compute_s and memory_s are the step's totals in every `combine` form (all FLOPs at their rates, all bytes at
    the bandwidth); total_s - comm_s - overhead_s is how the form combined them. `bound` is the larger of the two
    under "max" and "sum", and under "kernels" the limit most of the kernel time ran under (module docstring).
    """

    num_seqs: int
    num_tokens: int
    num_blocks: int
    linear_flops: float
    attention_flops: float
    weight_bytes: float
    kv_read_bytes: float
    kv_write_bytes: float
    activation_bytes: float
    compute_s: float
    memory_s: float
    comm_s: float
    overhead_s: float
    total_s: float
    bound: Literal["compute", "memory"]
    tp_turns: float = 1.0  # `CostModel.turn_factor`: > 1 where a CPU's tp ranks took turns on its cores

    @property
    def flops(self) -> float:
        return self.linear_flops + self.attention_flops

    @property
    def bytes(self) -> float:
        return self.weight_bytes + self.kv_read_bytes + self.kv_write_bytes + self.activation_bytes

    @property
    def arithmetic_intensity(self) -> float:
        """FLOPs per byte moved; compare with peak_flops / memory_bandwidth (the ridge point)."""
        return self.flops / self.bytes


# ---- the roofline model ----------------------------------------------------------------------------

# Unknowns of the "sum" form, in the order of `CostModel.roofline_features`:
# total_s - comm_s = features . (step_overhead_s, per_seq_overhead_s, per_token_overhead_s,
#                                per_block_overhead_s, 1 / peak_flops, 1 / (peak_flops * attention_efficiency),
#                                weight_packing_passes / memory_bandwidth, 1 / memory_bandwidth)
ROOFLINE_FEATURE_NAMES = ("steps", "seqs", "tokens", "blocks", "linear_flops_per_device",
                          "attention_flops_per_device", "packed_weight_bytes_per_device", "bytes_per_device")
ROOFLINE_UNKNOWNS = ("step_overhead_s", "per_seq_overhead_s", "per_token_overhead_s", "per_block_overhead_s",
                     "seconds_per_flop", "seconds_per_attention_flop", "seconds_per_packed_byte", "seconds_per_byte")


def activation_dtype(dtype: str, hardware: HardwareProfile) -> str:
    """The dtype of activations, embeddings, lm_head and attention when the linear layers run in `dtype`:
    `dtype` itself, except under weights of fewer than 2 bytes: the profile's bfloat16, else float16, else
    the dtype a calibrated profile's engine ran in around its quantized projections (provenance "dtype",
    e.g. float32 for `serving-lab calibrate --quantization int4`), when the profile has a rate for it."""
    if dtype_bytes(dtype) >= 2:
        return dtype
    candidates = ("bfloat16", "float16", hardware.provenance.get("dtype"))
    return next((d for d in candidates if d in hardware.peak_flops), weight_format(dtype))


def lm_head_dtype(dtype: str, hardware: HardwareProfile) -> str:
    """The dtype the LM head's weights are read in: the activations' (`activation_dtype`), except on a profile
    calibrated on this engine's int8 or int4 path (provenance "quantization"), whose head an int8 copy
    screens (ref_engine/model/lm_head.py): 1 byte a weight. (A GPU engine such as vLLM keeps a quantized
    model's head in 16 bits, so a datasheet profile does.)"""
    if hardware.provenance.get("quantization") in QUANTIZATION_METHODS:
        return "int8"
    return activation_dtype(dtype, hardware)


def compute_dtype(dtype: str, hardware: HardwareProfile) -> str:
    """The dtype whose FLOP/s the linear layers run at under `dtype` weights: `dtype` itself (the format it
    is rated under: "int4-g128" is "int4"), except a weight-only format (`WEIGHT_ONLY_DTYPES`) that `hardware`
    has no rate for, which computes in the activation dtype."""
    rated = weight_format(dtype)
    if rated in WEIGHT_ONLY_DTYPES and rated not in hardware.peak_flops:
        return activation_dtype(dtype, hardware)
    return rated


def default_kv_cache_dtype(dtype: str, hardware: HardwareProfile) -> str:
    """The KV cache's dtype when none is given: the model's `dtype`, or for a weight-only format, and for
    the quantization a calibrated engine ran (provenance "quantization"), the activations'."""
    rated = weight_format(dtype)
    weight_only = rated in WEIGHT_ONLY_DTYPES or hardware.provenance.get("quantization") == rated
    return activation_dtype(dtype, hardware) if weight_only else dtype


def model_weight_bytes(arch: ArchConfig, dtype: str, hardware: HardwareProfile) -> int:
    """Bytes of all weights: the decoder layers' in `dtype`, embeddings, lm_head and norms in the activation
    dtype (`activation_dtype`): an FP8 checkpoint keeps those in 16 bits."""
    b, a = dtype_bytes(dtype), dtype_bytes(activation_dtype(dtype, hardware))
    high_precision = arch.num_params - arch.num_layers * arch.params_per_layer
    return arch.num_layers * arch.params_per_layer * b + high_precision * a


class CostModel:
    """Step time of `arch` on `hardware` (see the module docstring for every formula).

    Constants that depend only on the model and the profile are computed once here, so `step_time`,
    which the simulator calls for every step, is one pass over the batch and a few multiplications.
    """

    def __init__(self, arch: ArchConfig, hardware: HardwareProfile, dtype: str = "bfloat16",
                 tensor_parallel_size: int = 1, block_size: int = EngineConfig.block_size,
                 combine: Combine | None = None, kv_cache_dtype: str | None = None) -> None:
        if tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {tensor_parallel_size}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        combine = combine or hardware.combine  # type: ignore[assignment]
        if combine not in COMBINE_MODES:
            raise ValueError(f"combine must be one of {', '.join(map(repr, COMBINE_MODES))}, got {combine!r}")
        self.arch = arch
        self.hardware = hardware
        self.dtype = dtype
        self.kv_cache_dtype = kv_cache_dtype or default_kv_cache_dtype(dtype, hardware)
        self.tensor_parallel_size = tensor_parallel_size
        self.block_size = block_size
        self.combine = combine

        b = dtype_bytes(dtype)
        self.activation_dtype = activation_dtype(dtype, hardware)
        a = dtype_bytes(self.activation_dtype)
        H, V, L = arch.hidden_size, arch.vocab_size, arch.num_layers
        layer_params = L * arch.params_per_layer
        tp = tensor_parallel_size
        # FLOPs
        self._flops_per_token = 2 * layer_params
        self._flops_per_logit_row = 2 * V * H
        self._attn_flops_per_pair = 4 * L * arch.num_attention_heads * arch.head_dim
        # bytes
        self._layer_weight_bytes = layer_params * b + H * a  # decoder layers + final norm
        self._lm_head_bytes = V * H * dtype_bytes(lm_head_dtype(dtype, hardware))
        self._packing_passes = hardware.weight_packing_passes
        self._embedding_bytes_per_token = H * a
        self._kv_bytes_per_token = arch.kv_bytes_per_token(dtype_bytes(self.kv_cache_dtype))
        self._activation_bytes_per_token = L * (4 * H + 2 * arch.q_size + 2 * arch.kv_size
                                                + 3 * arch.intermediate_size) * a
        self._activation_bytes_per_logit_row = V * a
        # rates, per step (already divided among the tp ranks)
        self._parallel_rate = rate = hardware.tensor_parallel_rate(tp)
        self._sharing = hardware.tensor_parallel_sharing(tp)
        self._rounds = hardware.tensor_parallel_rounds(tp)
        self._stretches = 2 * L  # all-reduces a step: lockstep points between which a rank runs alone
        self._lm_head_extra_weight = rate / hardware.lm_head_rate(tp) - 1
        self._seconds_per_flop = 1.0 / (hardware.matmul_flops(compute_dtype(dtype, hardware)) * rate)
        self._seconds_per_attention_flop = 1.0 / (hardware.flops_for(self.activation_dtype)
                                                  * hardware.attention_efficiency * rate)
        self._seconds_per_byte = 1.0 / (hardware.effective_bandwidth * rate)
        # tensor parallelism: 2 all-reduces per layer of T * H * a bytes each
        if tp > 1:
            latency_s, bus_bandwidth = hardware.allreduce_terms(tp)
            self._comm_fixed_s = 2 * L * latency_s
            self._comm_s_per_token = (2 * L * 2 * (tp - 1) / tp * H * a) / bus_bandwidth
        else:
            self._comm_fixed_s = 0.0
            self._comm_s_per_token = 0.0

    # -- the hot path --

    def _batch_sums(self, shape: BatchShape) -> tuple[int, int, int, int]:
        """One pass over the batch: tokens, attention (query, key) pairs, context read, blocks touched."""
        bs = self.block_size
        tokens = sum(shape.query_lens)
        ctx_read = sum(shape.context_lens) + tokens  # every row reads its context and its new tokens
        pairs2 = blocks = 0
        for q, c in zip(shape.query_lens, shape.context_lens, strict=True):
            pairs2 += q * (2 * c + q + 1)  # 2 * q * (c + (q + 1) / 2), an exact integer
            blocks += (c + q + bs - 1) // bs  # cdiv(c + q, bs), inlined: this runs per request per step
        if shape.num_blocks_touched is not None:
            blocks = shape.num_blocks_touched
        return tokens, pairs2 // 2, ctx_read, blocks

    def _flops_and_bytes(self, shape: BatchShape, tokens: int, pairs: int, ctx_read: int
                         ) -> tuple[float, float, float, float, float, float, float]:
        rows = shape.logit_rows
        linear = self._flops_per_token * tokens + self._flops_per_logit_row * rows
        attention = self._attn_flops_per_pair * pairs
        packed = ((self._layer_weight_bytes if tokens > 1 else 0)  # weights a multi-row GEMM packs
                  + (self._lm_head_bytes if rows > 1 else 0))
        weights = (self._layer_weight_bytes + (self._lm_head_bytes if rows else 0)
                   + self._embedding_bytes_per_token * tokens)
        kv_read = self._kv_bytes_per_token * ctx_read
        kv_write = self._kv_bytes_per_token * tokens
        activations = self._activation_bytes_per_token * tokens + self._activation_bytes_per_logit_row * rows
        return linear, attention, weights, kv_read, kv_write, activations, packed

    def _core(self, compute_s: float, memory_s: float, attention_compute_s: float, attention_memory_s: float
              ) -> tuple[float, Literal["compute", "memory"]]:
        """A step's compute and memory times combined in the profile's form, and its bound (module docstring).
        `compute_s` and `memory_s` are the step's totals; the attention's shares of them matter only to
        "kernels", whose linear layers have the rest."""
        if self.combine == "kernels":
            return self._by_kernels(compute_s - attention_compute_s, memory_s - attention_memory_s,
                                    attention_compute_s, attention_memory_s)
        bound: Literal["compute", "memory"] = "compute" if compute_s >= memory_s else "memory"
        return (max(compute_s, memory_s) if self.combine == "max" else compute_s + memory_s), bound

    @staticmethod
    def _by_kernels(linear_compute_s: float, linear_memory_s: float, attention_compute_s: float,
                    attention_memory_s: float) -> tuple[float, Literal["compute", "memory"]]:
        """The "kernels" form's core of a step, and its bound: each group on its own roofline, in turn; the bound
        is the one under which most of that time ran."""
        linear_s = max(linear_compute_s, linear_memory_s)
        attention_s = max(attention_compute_s, attention_memory_s)
        compute_bound_s = ((linear_s if linear_compute_s >= linear_memory_s else 0.0)
                           + (attention_s if attention_compute_s >= attention_memory_s else 0.0))
        bound: Literal["compute", "memory"] = "compute" if 2 * compute_bound_s >= linear_s + attention_s else "memory"
        return linear_s + attention_s, bound

    def _lm_head_own(self, shape: BatchShape) -> tuple[float, float, float]:
        """(FLOPs, bytes, packed bytes) of the LM head in a step's totals: its matmul, its weights and logits."""
        rows = shape.logit_rows
        if not rows:
            return 0.0, 0.0, 0.0
        return (self._flops_per_logit_row * rows, self._lm_head_bytes + self._activation_bytes_per_logit_row * rows,
                self._lm_head_bytes if rows > 1 else 0.0)

    def _lm_head_extra(self, shape: BatchShape) -> tuple[float, float, float]:
        """(FLOPs, bytes, packed bytes) to add to a step's so that the LM head is priced at its own rate
        (`HardwareProfile.lm_head_rate`) rather than the decoder layers': its work (`_lm_head_own`) times
        (layers' rate / head's rate - 1). Zeros where both rates are one (GPUs, tp = 1)."""
        extra = self._lm_head_extra_weight
        if not extra:
            return 0.0, 0.0, 0.0
        flops, num_bytes, packed = self._lm_head_own(shape)
        return extra * flops, extra * num_bytes, extra * packed

    def _overhead_s(self, num_seqs: int, tokens: int, blocks: int) -> float:
        """One rank's step overhead (the whole step's on one device; each CPU rank runs it all)."""
        hw = self.hardware
        return (hw.step_overhead_s + hw.per_seq_overhead_s * num_seqs
                + hw.per_token_overhead_s * tokens + hw.per_block_overhead_s * blocks)

    def turn_factor(self, core_s: float, rank_overhead_s: float) -> float:
        """f of the module docstring: how much longer than fair sharing a step takes because the tp ranks take
        turns on a CPU's cores. 1 where the ranks fit (GPUs, tp = 1, enough cores) or where one rank's stretch
        between two all-reduces, (core_s / s + rank_overhead_s) / (2 L), is at least a time slice; else
        rounds / s. `core_s`: combine(compute_s, memory_s) under fair sharing."""
        if self._sharing == 1.0:
            return 1.0
        slice_s = self.hardware.scheduler_slice_s
        stretch_s = (core_s / self._sharing + rank_overhead_s) / self._stretches
        if slice_s and stretch_s >= slice_s:
            return 1.0
        return self._rounds / self._sharing

    def step_time(self, shape: BatchShape) -> float:
        """Seconds for one engine step running `shape`."""
        return self.breakdown(shape).total_s

    def _comm_s(self, tokens: int) -> float:
        if self.tensor_parallel_size == 1:
            return 0.0
        return self._comm_fixed_s + self._comm_s_per_token * tokens

    # -- for people: every term --

    def breakdown(self, shape: BatchShape) -> StepCost:
        """Every FLOP, byte and second of one step (`step_time` is its `total_s`)."""
        tokens, pairs, ctx_read, blocks = self._batch_sums(shape)
        linear, attention, weights, kv_read, kv_write, activations, packed = self._flops_and_bytes(
            shape, tokens, pairs, ctx_read)
        weights += self._packing_passes * packed
        head_flops, head_bytes, head_packed = self._lm_head_extra(shape)
        pp = self._packing_passes
        comm_s = self._comm_s(tokens)
        overhead_s = self._overhead_s(shape.num_seqs, tokens, blocks)
        attention_compute_s = attention * self._seconds_per_attention_flop
        attention_memory_s = (kv_read + kv_write) * self._seconds_per_byte
        if self._sharing == 1.0:  # every rank on cores (or a device) of its own: no turns
            turns = 1.0
            compute_s = (linear + head_flops) * self._seconds_per_flop + attention_compute_s
            memory_s = (weights + kv_read + kv_write + activations + head_bytes + pp * head_packed
                        ) * self._seconds_per_byte
        else:  # the LM head at its own rate (`_lm_head_extra`) and outside the turns: rank 0 runs it alone
            own_flops, own_bytes, own_packed = self._lm_head_own(shape)
            head_compute_s = (own_flops + head_flops) * self._seconds_per_flop
            head_memory_s = (own_bytes + pp * own_packed + head_bytes + pp * head_packed) * self._seconds_per_byte
            layers_compute_s = (linear - own_flops) * self._seconds_per_flop + attention_compute_s
            layers_memory_s = (weights + kv_read + kv_write + activations - own_bytes - pp * own_packed
                               ) * self._seconds_per_byte
            layers_s, _ = self._core(layers_compute_s, layers_memory_s, attention_compute_s, attention_memory_s)
            turns = self.turn_factor(layers_s, overhead_s)
            compute_s = layers_compute_s * turns + head_compute_s
            memory_s = layers_memory_s * turns + head_memory_s
            attention_compute_s *= turns
            attention_memory_s *= turns
            overhead_s *= self._sharing * turns
        core, bound = self._core(compute_s, memory_s, attention_compute_s, attention_memory_s)
        return StepCost(
            num_seqs=shape.num_seqs, num_tokens=tokens, num_blocks=blocks,
            linear_flops=linear, attention_flops=attention, weight_bytes=weights, kv_read_bytes=kv_read,
            kv_write_bytes=kv_write, activation_bytes=activations, compute_s=compute_s, memory_s=memory_s,
            comm_s=comm_s, overhead_s=overhead_s, total_s=core + comm_s + overhead_s, bound=bound, tp_turns=turns,
        )

    def block_copy_time(self, num_swapped: int, num_copied: int) -> float:
        """Seconds to carry out a step's copy plan before its forward pass (ref_engine/runner.py does it the
        same way): `num_swapped` KV blocks moved between device and host memory (either way; preemption by
        swap), `num_copied` blocks copied within the device (copy-on-write of a fully cached prompt's last
        block).

            swap  = num_swapped * block_bytes / host_link_bandwidth       over PCIe, when the profile has one
            copy  = num_copied * block_bytes * 4 / effective bandwidth    the runner gathers the blocks into a
                                                                          temporary, then scatters them: each
                                                                          byte is read and written twice
        where block_bytes = kv_bytes_per_token * block_size / tp (each device moves its own shard). On a CPU
        (host_link_bandwidth 0) the host pool sits in the same DRAM, so a swap is priced as a copy. Fixed
        costs per copy call are left out; lesson 2's `SwapLink` prices them as a what-if."""
        block_bytes = self._kv_bytes_per_token * self.block_size
        host_link = self.hardware.host_link_bandwidth * self.tensor_parallel_size
        copied = num_copied if host_link else num_copied + num_swapped
        swap_s = num_swapped * block_bytes / host_link if host_link else 0.0
        return swap_s + copied * block_bytes * 4 * self._seconds_per_byte

    # -- for the calibrator --

    def roofline_features(self, shape: BatchShape) -> tuple[float, ...]:
        """Design-matrix row of the "sum" form, in the order of ROOFLINE_FEATURE_NAMES.

        With combine="sum", step_time(shape) - comm_s == dot(features, unknowns), the unknowns being
        ROOFLINE_UNKNOWNS (step, per-seq, per-token and per-block overheads, 1 / peak FLOP/s,
        1 / attention FLOP/s, packing passes / bandwidth, 1 / bandwidth).
        Beware collinearity when fitting one model: the weight bytes are nearly constant per step, so
        1/bandwidth trades off against step_overhead_s, and linear FLOPs are proportional to tokens, so
        1/FLOP/s trades off against per_token_overhead_s. serving_lab/calibrate.py measures the bandwidth
        with a micro-benchmark and leaves the per-token overhead out.
        """
        tokens, pairs, ctx_read, blocks = self._batch_sums(shape)
        linear, attention, weights, kv_read, kv_write, activations, packed = self._flops_and_bytes(
            shape, tokens, pairs, ctx_read)
        head_flops, head_bytes, head_packed = self._lm_head_extra(shape)
        if self._sharing == 1.0:  # no turns (GPUs, tp = 1, ranks that fit a CPU's cores)
            rate = self._parallel_rate
            return (1.0, float(shape.num_seqs), float(tokens), float(blocks), (linear + head_flops) / rate,
                    attention / rate, (packed + head_packed) / rate,
                    (weights + kv_read + kv_write + activations + head_bytes) / rate)
        # the regime (turns or fair sharing, `turn_factor`) is the one this model's own rates give
        f = self.breakdown(shape).tp_turns
        own_flops, own_bytes, own_packed = self._lm_head_own(shape)
        rate, n = self._parallel_rate, self._sharing * f
        return (float(n), float(n * shape.num_seqs), float(n * tokens), float(n * blocks),
                ((linear - own_flops) * f + own_flops + head_flops) / rate, attention * f / rate,
                ((packed - own_packed) * f + own_packed + head_packed) / rate,
                ((weights + kv_read + kv_write + activations - own_bytes) * f + own_bytes + head_bytes) / rate)

    # -- between machines --

    def kv_transfer_time(self, num_tokens: int, link: Literal["network", "interconnect"] = "network") -> float:
        """Seconds to move `num_tokens` tokens of KV cache to another instance (PD disaggregation).

        time = latency + kv_bytes_per_token * num_tokens / (bandwidth * tp): each of the tp devices sends
        its own shard over its own link, in parallel.
        """
        hw = self.hardware
        if link == "network":
            bandwidth, latency = hw.network_bandwidth, hw.network_latency_s
        elif link == "interconnect":
            bandwidth, latency = hw.interconnect_bandwidth, hw.interconnect_latency_s
        else:
            raise ValueError(f"link must be 'network' or 'interconnect', got {link!r}")
        if bandwidth <= 0:
            raise ValueError(f"profile {hw.name!r} has no {link} bandwidth")
        return latency + self._kv_bytes_per_token * num_tokens / (bandwidth * self.tensor_parallel_size)


# ---- the KV-cache pool -----------------------------------------------------------------------------

def estimate_activation_bytes(arch: ArchConfig, dtype: str = "bfloat16", max_num_batched_tokens: int = 8192,
                              max_num_seqs: int = 256) -> int:
    """Peak activation memory of the largest step, what vLLM's profiling run measures
    (`ArchConfig.peak_activation_bytes`, for a dtype name)."""
    return arch.peak_activation_bytes(max_num_batched_tokens, max_num_seqs, dtype_bytes(dtype))


def kv_cache_num_blocks(arch: ArchConfig, hardware: HardwareProfile, dtype: str = "bfloat16",
                        block_size: int = EngineConfig.block_size, gpu_memory_utilization: float = 0.9,
                        tp: int = 1, *, kv_cache_dtype: str | None = None, activation_reserve_bytes: int | None = None,
                        max_num_batched_tokens: int = 8192, max_num_seqs: int = 256) -> int:
    """Number of KV blocks that fit on each device of `hardware`, as vLLM sizes its pool after a profiling
    run (the rule of core/kv_sizing.py, which the engine applies too):

        blocks = floor((memory_bytes * gpu_memory_utilization - weight_bytes / tp - activations)
                       / (block_size * 2 * L * ceil(n_kv_heads / tp) * head_dim * b_kv))

    `activations` defaults to `estimate_activation_bytes(...)`. Raises ValueError when the weights (or
    weights plus activations) leave no room for even one block.
    """
    if tp < 1:
        raise ValueError(f"tp must be >= 1, got {tp}")
    if activation_reserve_bytes is None:
        activation_reserve_bytes = estimate_activation_bytes(arch, dtype, max_num_batched_tokens, max_num_seqs)
    config = EngineConfig(block_size=block_size, gpu_memory_utilization=gpu_memory_utilization)
    kv_dtype = kv_cache_dtype or default_kv_cache_dtype(dtype, hardware)
    per_block = arch.kv_bytes_per_block(block_size, dtype_bytes(kv_dtype), tp)
    return num_kv_blocks(config, per_block, device_memory=hardware.memory_bytes,
                         weight_bytes=model_weight_bytes(arch, dtype, hardware) / tp,
                         activation_bytes=activation_reserve_bytes, model=arch.name)
