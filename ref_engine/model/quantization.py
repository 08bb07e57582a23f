"""Weight quantization: `quantization="int8"` or `"int4"`, both weight-only (int4's 4-bit codes in groups:
ref_engine/model/int4.py); this module checks the knob and swaps the projections.

int8, what it does. Every projection of every layer (q|k|v, o, gate|up, down) keeps its weight in int8, one
scale per output channel (symmetric: scale = max |w| / 127, stored in bfloat16). Activations are not
quantized: they go into torch's CPU weight-only kernel (`aten._weight_int8pack_mm`) in bfloat16, which
widens each weight in its tiles and returns bfloat16, cast back to float32. Embeddings, norms, rotary,
attention and the KV cache stay float32. The LM head, under int8 and int4 alike, is read in 8 bits through a
screen that keeps its argmax exact (ref_engine/model/lm_head.py).

Why weight-only (SmolLM2 on the eval set and the course machine's kind, 2 cores, AVX-512;
benchmarks/RESULTS.md, "Numerics: float32, int8, int4"):
- quality: the engine's first int8 was W8A8 with one activation scale per call (torch's deprecated quantized
  ops). LLM activations have outlier channels (SmolLM2's down_proj inputs peak at up to 17,000x their mean),
  so one scale gave the many small values few levels: greedy agreement with float32 0.18-0.36, KL 0.47-0.60
  nats/token. Per-token scales (`torch._int_mm`) reached 0.60 / 0.03, and 0.76-0.88 / 0.024-0.027 with
  down_proj left in float32. Weight-only keeps the activations whole: KL 0.003-0.004, agreement 0.75-0.83;
- speed: with bfloat16 activations the weight-only kernel ran SmolLM2's 30 layers of projections 2.9-3.3x
  faster than float32 at one row, 2.0-2.4x at 8 and 1.4x at 32 (two runs; per-token W8A8: 2.3x, 3.0x, 2.9x;
  the engine: 1.7x float32's tokens/s single stream, 2.0x at batch 8, 1.3x at 32; with float32
  activations the same weight-only kernel is 1.6-20x *slower* than float32: never feed it float32);
- batch invariance: nothing is computed from the batch, so a request's numbers do not depend on what it is
  batched with (tested, tests/engine/test_quantization.py).
torchao 0.18 (which torch points its deprecated quantized ops to) installs beside torch 2.13 and runs on
CPU, but its int8 weight-only path ran 1.4-2.5x slower than calling this kernel directly and its dynamic
per-token int8 was slower than float32 at 1 and 8 rows, so the engine calls torch's kernel itself.

The float32 path (`quantization=None`) stays the reference that the parity tests hold token-exact.

Lesson: lessons/01-continuous-batching.md (the cost of a step: what a decode step streams from memory);
lessons/07-tuning-knobs.md#numerics.
"""

from __future__ import annotations

import torch
from torch import nn

from core.config import INT4_GROUP_SIZE, INT4_GROUP_SIZES, QUANTIZATION_METHODS
from ref_engine.model.int4 import (
    Int4Linear,
    Int4Weight,
    has_int4_kernel,
)
from ref_engine.model.linear import TransposedLinear
from ref_engine.model.llama import STACKED_PARAMS, LlamaForCausalLM
from ref_engine.model.lm_head import ScreenedLMHead

# The kernel each numeric path runs, as a calibrated profile records it: a profile measured on another kernel
# prices the wrong thing (the engine's int8 was W8A8 on torch's quantized ops before it became weight-only).
KERNELS: dict[str | None, str] = {
    None: "float matmul",
    "int8": "int8 weight-only, aten._weight_int8pack_mm, bfloat16 activations, int8-screened LM head",
    "int4": "int4 weight-only, aten._weight_int4pack_mm_for_cpu, bfloat16 activations, int8-screened LM head",
}

class Int8Linear(nn.Module):
    """`y = x @ W.T + b` with `W` ([out, in]) in int8, one scale per output channel, on torch's CPU
    weight-only kernel with bfloat16 activations; float32 in and out, like the rest of the model."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        weight = weight.detach().float()
        scales = (weight.abs().amax(dim=1) / 127).clamp_min(torch.finfo(torch.bfloat16).tiny).to(torch.bfloat16)
        self.out_features, self.in_features = weight.shape
        qweight = torch.round(weight / scales.float()[:, None]).clamp(-127, 127).to(torch.int8).contiguous()
        self.qweight = nn.Parameter(qweight, requires_grad=False)  # [out, in]
        self.scales = nn.Parameter(scales, requires_grad=False)  # [out], bfloat16
        self.bias = None if bias is None else nn.Parameter(bias.detach().float(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.aten._weight_int8pack_mm(x.to(torch.bfloat16), self.qweight, self.scales).float()
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 weight-only"


def check_quantization(quantization: str | None, dtype: torch.dtype, device: torch.device,
                       group_size: int = INT4_GROUP_SIZE) -> None:
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
        if group_size not in INT4_GROUP_SIZES:
            raise ValueError(f"quantization_group_size={group_size!r} is not one the int4 kernel takes; choices: "
                             f"{', '.join(map(str, INT4_GROUP_SIZES))}")
        if not has_int4_kernel(device):
            where = "this torch build lacks it" if device.type == "cpu" else f"this engine is on {device.type}"
            raise ValueError(f"quantization='int4' runs on torch's int4 CPU kernel "
                             f"(aten._weight_int4pack_mm_for_cpu); {where}")
    elif device.type != "cpu":
        raise ValueError(f"quantization={quantization!r} runs on torch's CPU int8 weight-only kernel "
                         f"(aten._weight_int8pack_mm); this engine is on {device.type}")


# our fused projection -> the Hugging Face projections that are its shards, in order
FUSED_SHARDS = {fused: [proj for proj, (f, _) in STACKED_PARAMS.items() if f == fused]
                for fused, _ in STACKED_PARAMS.values()}


@torch.no_grad()
def quantize_model(model: LlamaForCausalLM, quantization: str, group_size: int = INT4_GROUP_SIZE,
                   int4_weights: dict[str, Int4Weight] | None = None) -> None:
    """Replace, in place, every projection of a loaded float32 `model` by its `quantization` form.

    "int8": `Int8Linear`. "int4": `Int4Linear` with groups of `group_size`
    inputs, each shard from `int4_weights` (Hugging Face name -> a checkpoint's own 4-bit codes, a GGUF's
    Q4_1) where given, else quantized from its float weight. The embedding stays float32; the LM head is read
    through an int8 screen that keeps its greedy choice exact (`ScreenedLMHead`)."""
    int4_weights = int4_weights or {}
    model.screened_lm_head = ScreenedLMHead(model.lm_head.weight)
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
                         f"{name!r}; choose one of {', '.join(map(str, INT4_GROUP_SIZES))} that does")
    return Int4Weight.quantize(weight, group_size)
