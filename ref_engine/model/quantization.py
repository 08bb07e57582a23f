"""Weight quantization: `quantization="int8"` (W8A8 with per-token activation scales, below) or `"int4"`
(weight-only, 4-bit codes in groups: ref_engine/model/int4.py); this module checks the knob and swaps the
projections.

int8, what it does. Every projection of every layer but `down_proj` (q|k|v, o, gate|up) keeps its weight
in int8, one scale per output channel (symmetric: scale = max |w| / 127). Each row of activations (each
token) is quantized to int8 as it arrives with its own scale (max |x| / 127 of that row: dynamic, per
token); the product runs in exact int32 arithmetic (`torch._int_mm`) and is scaled back to float32.
Embeddings, the LM head, norms, rotary, attention, the KV cache and `down_proj` stay float32.

Why these choices (SmolLM2 on the eval set, 16 prompts x 16 tokens, benchmarks/RESULTS.md "Numerics: float32,
int8, int4"):
- per-token scales, not one per call: the engine's first int8 took one scale for the whole flat batch, so
  one outlier token coarsened every other token's levels, and a request's numbers depended on its batch.
  It agreed with float32 on 0.18-0.36 of greedy tokens (KL 0.47-0.60 nats/token). Per token: 0.60, KL
  0.03, and a row's result does not depend on the rows beside it (integer sums are exact);
- `down_proj` in float32: its inputs carry outlier channels (SmolLM2's peak at up to 17,000x their mean),
  and a per-token scale cannot spread them; keeping it (a third of the layer's weights) in float32 lifts
  agreement to 0.76-0.88 at KL 0.024-0.027. (SmoothQuant, Xiao et al. 2023, moves such outliers into the
  weights per channel; tried earlier with a tiny calibration text, it hurt the whole model.)
- speed: on the course machine's kind (2 cores, AVX-512 VNNI) the projections ran 1.4x faster than float32
  at one row and 1.6-1.8x at 8-32 rows; the per-call W8A8 kernel of torch's deprecated quantized ops was
  faster (4-6x) but changed the answers; int8 weight-only (`_weight_int8pack_mm`, what torchao 0.18 runs on
  CPU) kept them best (KL 0.004) but ran no faster than float32 at 8-32 rows, and 1.5x slower at every
  row count through torchao's dynamic per-token int8.

The float32 path (`quantization=None`) stays the reference that the parity tests hold token-exact.

Lesson: lessons/01-continuous-batching.md (the cost of a step: what a decode step streams from memory).
"""

from __future__ import annotations

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

# Projections int8 keeps in float32: their inputs have outlier channels that 8 bits per token cannot hold.
INT8_FLOAT_PROJECTIONS = ("down_proj",)
_TINY = torch.finfo(torch.float32).tiny


class Int8Linear(nn.Module):
    """`y = x @ W.T + b` with `W` ([out, in]) in int8, one scale per output channel, and each row of `x`
    quantized to int8 with its own scale (dynamic, per token); the product in exact int32."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        weight = weight.detach().float()
        scales = (weight.abs().amax(dim=1) / 127).clamp_min(_TINY)
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        qweight = torch.round(weight / scales[:, None]).to(torch.int8).t().contiguous()  # [in, out]
        self.qweight = nn.Parameter(qweight, requires_grad=False)
        self.weight_scales = nn.Parameter(scales, requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias.detach().float(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_scales = (x.abs().amax(dim=-1, keepdim=True) / 127).clamp_min(_TINY)
        qx = torch.round(x / x_scales).clamp(-127, 127).to(torch.int8)
        y = torch._int_mm(qx, self.qweight).float() * (x_scales * self.weight_scales)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 W8A8 per token"


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
    elif device.type != "cpu":
        raise ValueError(f"quantization={quantization!r} runs on torch's CPU int8 matmul (torch._int_mm); this "
                         f"engine is on {device.type}")


# our fused projection -> the Hugging Face projections that are its shards, in order
FUSED_SHARDS = {fused: [proj for proj, (f, _) in STACKED_PARAMS.items() if f == fused]
                for fused, _ in STACKED_PARAMS.values()}


@torch.no_grad()
def quantize_model(model: LlamaForCausalLM, quantization: str, group_size: int = DEFAULT_GROUP_SIZE,
                   int4_weights: dict[str, Int4Weight] | None = None) -> None:
    """Replace, in place, every projection of a loaded float32 `model` by its `quantization` form.

    "int8": `Int8Linear`, except `INT8_FLOAT_PROJECTIONS`. "int4": `Int4Linear` with groups of `group_size`
    inputs, each shard from `int4_weights` (Hugging Face name -> a checkpoint's own 4-bit codes, a GGUF's
    Q4_1) where given, else quantized from its float weight. The embedding and the LM head stay float32."""
    int4_weights = int4_weights or {}
    for name, child in list(model.named_modules()):
        if not isinstance(child, TransposedLinear):
            continue
        parent, _, attr = name.rpartition(".")
        if quantization == "int8":
            if attr in INT8_FLOAT_PROJECTIONS:
                continue
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
                         f"{name!r}; choose one of {', '.join(map(str, KERNEL_GROUP_SIZES))} that does")
    return Int4Weight.quantize(weight, group_size)
