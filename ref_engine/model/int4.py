"""int4 weight-only projections on torch's CPU int4 kernel (`quantization="int4"`).

The kernel. `aten._weight_int4pack_mm_for_cpu(x, packed, group_size, scales_and_zeros)` computes
`y = x @ W.T` for `x` `[M, K]` in bfloat16, with `W` `[N, K]` held as 4-bit codes `q` in 0..15 (packed two
to a byte by `aten._convert_weight_to_int4pack_for_cpu`) and one scale and one zero per group of
`group_size` consecutive inputs of an output channel, in `scales_and_zeros` `[K / group_size, N, 2]`
(`[..., 0]` the scale, `[..., 1]` the zero), bfloat16:

    W[n, k] = (q[n, k] - 8) * scale[k // g, n] + zero[k // g, n]

The zero is an offset in weight units (a float), not an integer code. tests/engine/test_int4.py checks this
reading of the layout numerically: the kernel times an identity matrix returns `W` as written above.

Two sources of codes (`Int4Weight`):
- a GGUF's own Q4_1 blocks (`Int4Weight.from_q4_1`): 32 weights share an fp16 scale `d` and minimum `m`,
  `w = d * q + m = (q - 8) * d + (m + 8 d)`, so scale = d and zero = m + 8 d with the file's codes as they
  are: no requantization. The only rounding left is storing the scale and the zero in bfloat16 (8
  significant bits against fp16's 11): each moves by at most 2^-8 of itself, so a weight moves by at most
  2^-8 * (|q - 8| |d| + |m + 8 d|). The kernel's bfloat16 activations and output add 2^-8 relative each;
- float weights (a Hugging Face folder, or a GGUF tensor in another format) quantized at load
  (`Int4Weight.quantize`): each group's [min, max] cut into 15 steps, asymmetric like Q4_1.

Why weight-only and bfloat16 activations: a decode step streams every weight once; 4-bit codes plus a
bfloat16 scale and zero per 32 weights are 0.625 bytes a weight against float32's 4. The kernel dequantizes
inside its tiles, so the work grows with the rows of the batch while the bytes saved do not: it wins at
one row and loses at many (benchmarks/RESULTS.md, "Numerics: float32, int8, int4"). With float32
activations the same kernel ran 4-40x slower, so activations are cast to bfloat16 around it. No activation
is quantized, so a request's numbers do not depend on what it is batched with.

The embedding stays float32 (dequantized; a lookup reads only its rows). The LM head, SmolLM2's tied Q8_0 token
embedding, 113 MB in float32 and more than all the int4 projections together (about 66 MB), is read in 8 bits
through a screen that keeps the greedy choice exact (ref_engine/model/lm_head.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

Q4_1_GROUP_SIZE = 32  # weights per Q4_1 block
KERNEL_OUTPUT_MULTIPLE = 16  # the packing's tile: a projection's outputs come in multiples of it
_ZERO_CODE = 8  # the kernel subtracts it from every code


def has_int4_kernel(device: torch.device) -> bool:
    """Whether this torch runs the int4 weight-only kernel on `device` (only CPUs here)."""
    return device.type == "cpu" and hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu")


@dataclass(frozen=True)
class Int4Weight:
    """A weight `[out, in]` as 4-bit codes with a float scale and zero per group of inputs:
    `w[n, k] = (codes[n, k] - 8) * scales[n, k // g] + zeros[n, k // g]`, `g = in / scales.shape[1]`."""

    codes: torch.Tensor  # int32 [out, in], 0..15
    scales: torch.Tensor  # float32 [out, in / g]
    zeros: torch.Tensor  # float32 [out, in / g]

    @property
    def group_size(self) -> int:
        return self.codes.shape[1] // self.scales.shape[1]

    @classmethod
    def from_q4_1(cls, codes: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> Int4Weight:
        """Q4_1's `w = d * q + m` (codes `[out, in]`, `d` and `m` `[out, in / 32]`) in the kernel's form,
        exactly: the same codes, scale `d`, zero `m + 8 d`."""
        d, m = d.float(), m.float()
        return cls(codes.to(torch.int32), d, m + _ZERO_CODE * d)

    @classmethod
    def quantize(cls, weight: torch.Tensor, group_size: int) -> Int4Weight:
        """Group-wise asymmetric quantization of a float `weight` `[out, in]`: each group of `group_size`
        inputs spans its own [min, max] in 15 steps, so every weight is within half a step of its value."""
        out_features, in_features = weight.shape
        groups = weight.detach().float().reshape(out_features, in_features // group_size, group_size)
        low, high = groups.amin(dim=2), groups.amax(dim=2)
        scales = ((high - low) / 15).clamp_min(torch.finfo(torch.float32).tiny)
        codes = torch.round((groups - low[..., None]) / scales[..., None]).clamp(0, 15)
        return cls(codes.reshape(out_features, in_features).to(torch.int32), scales, low + _ZERO_CODE * scales)

    @classmethod
    def cat(cls, parts: list[Int4Weight]) -> Int4Weight:
        """The shards of a fused projection (q | k | v, gate | up) stacked along the outputs."""
        return cls(*(torch.cat([getattr(p, f) for p in parts]) for f in ("codes", "scales", "zeros")))

    def dequantize(self) -> torch.Tensor:
        """The float32 weight `[out, in]` these codes stand for."""
        g = self.group_size
        return ((self.codes - _ZERO_CODE).float() * self.scales.repeat_interleave(g, dim=1)
                + self.zeros.repeat_interleave(g, dim=1))


class Int4Linear(nn.Module):
    """`y = x @ W.T + b` with `W` an `Int4Weight`, on the int4 kernel with bfloat16 activations; float32 in
    and out, like the rest of the model. The packed codes and the scales are parameters, so the engine's
    weight bytes (`parameter_bytes`) count them."""

    def __init__(self, weight: Int4Weight, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.codes.shape
        if self.out_features % KERNEL_OUTPUT_MULTIPLE:
            raise ValueError(f"quantization='int4' packs outputs in tiles of {KERNEL_OUTPUT_MULTIPLE}; a projection "
                             f"with {self.out_features} outputs does not fit")
        self.group_size = weight.group_size
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(weight.codes.contiguous(), 1)
        scales_and_zeros = torch.stack([weight.scales.t(), weight.zeros.t()], dim=-1).to(torch.bfloat16)
        self.packed = nn.Parameter(packed, requires_grad=False)  # uint8 [out, in / 2]
        self.scales_and_zeros = nn.Parameter(scales_and_zeros.contiguous(), requires_grad=False)  # [in/g, out, 2]
        self.bias = None if bias is None else nn.Parameter(bias.detach().float(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x.to(torch.bfloat16), self.packed, self.group_size,
                                                       self.scales_and_zeros).float()
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"int4 weight-only, group_size={self.group_size}")
