"""Weight quantization: `quantization="int8"` (W8A8 on x86 CPUs, below) or `"int4"` (weight-only, 4-bit
codes in groups: ref_engine/model/int4.py); this module checks the knob and swaps the projections.

What it does. Every projection of every layer (q|k|v, o, gate|up, down) and the LM head keep their
weights in int8, one scale per output channel (symmetric: scale = max |w| / 127). Activations are
quantized to 8 bits as they arrive, with one scale and zero point per call computed from that call's
values (dynamic quantization); the product runs in integers on torch's x86 quantized engine
(fbgemm / oneDNN, VNNI where the CPU has it) and comes back in float32. Embeddings, norms, rotary,
attention and the KV cache stay float32.

Why W8A8 and not weight-only int8: a decode step on a CPU is bound by its matmuls, which stream every
weight from DRAM once per step. int8 weights are a quarter of float32's bytes, and on a machine of the
course machine's kind (2 cores, AVX-512 VNNI) torch's weight-only int8 kernel (`_weight_int8pack_mm`) ran 4-38x *slower*
than float32 while the dynamic W8A8 kernel ran 1.3x faster at one row and 2.7-3.6x faster at 8-32 rows,
for SmolLM2's 30 layers of projections (benchmarks/RESULTS.md, "Engine speed": `engine_speed.py --kernels`).

What it trades:
- accuracy: each weight is rounded to 1 of 255 levels of its channel, each activation to 1 of 256 levels
  of its call (128 without VNNI, `REDUCE_RANGE`). A call's scale is set by its largest value, and LLM
  activations have outlier channels (SmolLM2's down_proj inputs peak at up to 17,000x their mean), so the
  many small values get few levels. The eval set measures what that does to the model's outputs (greedy
  agreement and KL divergence against float32, serving_lab/eval_set.py): on a 135M model, a lot.
  SmoothQuant (Xiao et al., ICML 2023) moves the outliers into the weights, per channel; tried here with a
  tiny calibration text, it helped one projection and hurt the whole model, so it is not in;
- batch invariance: the activation scale is one per call, taken from the whole flat batch, so a request's
  numbers depend slightly on what it is batched with. The float32 path does not have this (its greedy
  outputs equal transformers' alone or in any batch); vLLM's per-tensor dynamic FP8 has it too.

The float32 path (`quantization=None`) stays the reference that the parity tests hold token-exact.

Kernels: torch's own quantized ops (`quantized::linear_prepack` / `linear_dynamic`), which torch 2.13
marks deprecated in favour of torchao. torchao's CPU int8 path was not measured here; when these ops go,
`Int8Linear` is the one class to port.

Lesson: lessons/01-continuous-batching.md (the cost of a step: what a decode step streams from memory).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from torch import nn

from ref_engine.core.config import QUANTIZATION_METHODS
from ref_engine.model.int4 import (
    DEFAULT_GROUP_SIZE,
    KERNEL_GROUP_SIZES,
    Int4Linear,
    Int4Weight,
    has_int4_kernel,
)
from ref_engine.model.llama import STACKED_PARAMS, LlamaForCausalLM, TransposedLinear

X86_ENGINES = ("x86", "fbgemm", "onednn")


def has_vnni() -> bool:
    """Whether this CPU multiplies 8-bit integers into 32-bit sums in one instruction (AVX-512 VNNI or
    AVX-VNNI). Without it, the kernel's 8 x 8-bit products are summed in pairs into 16 bits, which can
    saturate, so activations must keep one bit less (torch's dynamic linear module always does)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_vnni" in flags or "avx_vnni" in flags


# 7-bit activations where the CPU lacks VNNI (see `has_vnni`); with VNNI, 8 bits halved the per-layer error
# (2-7% instead of 5-13% relative, SmolLM2's projections on real activations; benchmarks/RESULTS.md).
REDUCE_RANGE = not has_vnni()


class Int8Linear(nn.Module):
    """`y = x @ W.T + b` with `W` ([out, in]) in int8, one scale per output channel, and `x` quantized
    per call (dynamic W8A8) on torch's x86 quantized engine."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        weight = weight.detach().float()
        scales = (weight.abs().amax(dim=1) / 127).clamp_min(torch.finfo(torch.float32).tiny)
        zero_points = torch.zeros(weight.shape[0], dtype=torch.long)
        with warnings.catch_warnings():  # torch deprecates its quantized tensors for torchao; see the module docstring
            warnings.simplefilter("ignore", UserWarning)
            qweight = torch.quantize_per_channel(weight, scales.double(), zero_points, 0, torch.qint8)
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        self.packed = torch.ops.quantized.linear_prepack(qweight, None if bias is None else bias.detach().float())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.quantized.linear_dynamic(x, self.packed, REDUCE_RANGE)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 W8A8"


def check_quantization(quantization: str | None, dtype: torch.dtype, device: torch.device,
                       group_size: int = DEFAULT_GROUP_SIZE) -> None:
    """A ValueError naming the knob and its choices for a method this engine does not have, or one it
    cannot run with this dtype, group size or on this device."""
    if quantization is None:
        return
    if quantization not in QUANTIZATION_METHODS:
        raise ValueError(f"quantization={quantization!r} is not a method this engine has; choices: None (the "
                         f"float reference), {', '.join(repr(m) for m in QUANTIZATION_METHODS)}")
    if dtype != torch.float32:
        raise ValueError(f"quantization={quantization!r} computes in float32 around its quantized products; "
                         f"got dtype={str(dtype).removeprefix('torch.')!r} (use dtype='float32')")
    if quantization == "int4":
        if group_size not in KERNEL_GROUP_SIZES:
            raise ValueError(f"quantization_group_size={group_size!r} is not one the int4 kernel takes; choices: "
                             f"{', '.join(map(str, KERNEL_GROUP_SIZES))}")
        if not has_int4_kernel(device):
            where = "this torch build lacks it" if device.type == "cpu" else f"this engine is on {device.type}"
            raise ValueError(f"quantization='int4' runs on torch's int4 CPU kernel "
                             f"(aten._weight_int4pack_mm_for_cpu); {where}")
    elif device.type != "cpu" or torch.backends.quantized.engine not in X86_ENGINES:
        raise ValueError(f"quantization={quantization!r} runs on torch's x86 quantized CPU kernels; this engine "
                         f"is on {device.type} with quantized engine {torch.backends.quantized.engine!r} "
                         f"(supported here: {', '.join(torch.backends.quantized.supported_engines)})")


# our fused projection -> the Hugging Face projections that are its shards, in order
FUSED_SHARDS = {fused: [proj for proj, (f, _) in STACKED_PARAMS.items() if f == fused]
                for fused, _ in STACKED_PARAMS.values()}


@torch.no_grad()
def quantize_model(model: LlamaForCausalLM, quantization: str, group_size: int = DEFAULT_GROUP_SIZE,
                   int4_weights: dict[str, Int4Weight] | None = None) -> None:
    """Replace, in place, every projection of a loaded float32 `model` by its `quantization` form.

    "int8": `Int8Linear`, the LM head too. "int4": `Int4Linear` with groups of `group_size` inputs, each
    shard from `int4_weights` (Hugging Face name -> a checkpoint's own 4-bit codes, a GGUF's Q4_1) where
    given, else quantized from its float weight; the LM head stays float32. The tied input embedding stays
    float32 either way."""
    int4_weights = int4_weights or {}
    for name, child in list(model.named_modules()):
        if not isinstance(child, TransposedLinear):
            continue
        parent, _, attr = name.rpartition(".")
        if quantization == "int8":
            replacement: nn.Module = Int8Linear(child.weight.t(), child.bias)
        else:
            shards = [f"{parent}.{proj}.weight" for proj in FUSED_SHARDS.get(attr, [attr])]
            weight = Int4Weight.cat([_int4_shard(child, i, shard, group_size, int4_weights)
                                     for i, shard in enumerate(shards)])
            replacement = Int4Linear(weight, child.bias)
        setattr(model.get_submodule(parent), attr, replacement)
    if quantization == "int8":
        model.quantized_lm_head = Int8Linear(model.lm_head.weight, None)


def _int4_shard(linear: TransposedLinear, shard: int, name: str, group_size: int,
                int4_weights: dict[str, Int4Weight]) -> Int4Weight:
    """One shard of a projection in int4: the checkpoint's own codes for `name` if it has them, else its float
    weight quantized in groups of `group_size`."""
    if name in int4_weights:
        given = int4_weights[name]
        if given.group_size != group_size:
            raise ValueError(f"quantization_group_size={group_size}, but the checkpoint stores {name!r} in 4-bit "
                             f"groups of {given.group_size}, which int4 uses as they are (requantizing them would "
                             f"round twice); use quantization_group_size={given.group_size}")
        return given
    weight = linear.weight[:, linear.shard_offsets[shard]:linear.shard_offsets[shard + 1]].t()
    if weight.shape[1] % group_size:
        raise ValueError(f"quantization_group_size={group_size} does not divide the {weight.shape[1]} inputs of "
                         f"{name!r}; choose one of {', '.join(map(str, KERNEL_GROUP_SIZES))} that does")
    return Int4Weight.quantize(weight, group_size)
