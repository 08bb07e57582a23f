"""`ScreenedLMHead`: the LM head of a quantized engine, read in 8 bits, with exact float32 logits for every
token that could be the greedy choice.

Why. At one decode row SmolLM2's LM head (its tied token embedding, 49,152 x 576) is the biggest read of a
quantized step: 113 MB in float32, more than all the int4 projections together. Read in int8 (one scale per
vocabulary row, torch's CPU weight-only kernel `aten._weight_int8pack_mm`) it costs a quarter of the bytes, but
plain int8 logits flip near-ties: the engine's greedy agreement with float32 fell from 0.975 to 0.836 on the
eval set. Logits decide every token, so the head screens instead of replacing:

1. approximate logits `a` for the whole vocabulary from the int8 copy;
2. a bound `b_v` on each row's error `|y_v - a_v|` (below), from quantities known before the step;
3. the candidates: every v with `a_v + b_v >= max_u (a_u - b_u)`. The true argmax v* is always one of them,
   since `a_v* + b_v* >= y_v* >= y_u >= a_u - b_u` for every u;
4. exact float32 logits `x . w_v` for the candidates (a handful of rows: 2-22 at the median per row on an eval
   prompt's states), written over their approximations.

So the argmax of the returned logits is the float32 head's (to float32's summation order; step 3 puts every
non-candidate strictly below y_v*), and greedy decoding, the eval set's agreement and greedy speculation are
what they would be with the float32 head. The other entries keep the int8 head's error: sampling at a
temperature and logprobs see them (the eval set's KL measures it). Each row's logits depend only on that row,
so they do not depend on the batch.

The bound. For a row x (float32, H inputs) and vocabulary row w_v with int8 codes q_v and bfloat16 scale s_v,
the kernel rounds x to bfloat16, accumulates `sum_i x_i q_vi` in float32, scales and rounds to bfloat16. With
u = 2^-8 (bfloat16's unit roundoff), e_v = max_i |w_vi - s_v q_vi| and m_v = max_i |s_v q_vi|:

    |y_v - a_v| <= ||x||_1 e_v                       the weights' rounding to int8
                 + ||x||_1 m_v (u + (H + 1) 2^-24)    x rounded to bfloat16; float32 sums and the scale
                 + u / (1 - u) |a_v|                  the output rounded to bfloat16

Hoelder's inequality, term by term; e_v and m_v are computed once at load. The largest error measured is 0.11-0.12
of its bound (`benchmarks/engine_speed.py --kernels`); tests/engine/test_lm_head.py checks actual <= bound on
SmolLM2's real rows.

Speed (benchmarks/RESULTS.md, "The screened LM head"): the head is cheaper than float32's up to ~16-32 rows
(its kernel widens every weight for every row, the roofline again), which covers decode at the batches where
the head's bytes matter; at 64 rows it costs about 1.6x float32's head, under a tenth of such a step.

Lesson: lessons/07-tuning-knobs.md#numerics.
"""

from __future__ import annotations

import torch
from torch import nn

BFLOAT16_UNIT_ROUNDOFF = 2.0 ** -8
FLOAT32_UNIT_ROUNDOFF = 2.0 ** -24


class ScreenedLMHead(nn.Module):
    """Float32 logits `[R, vocab]` from `weight` (`[vocab, hidden]`, float32, kept as it is for the candidates'
    exact rows; a tied embedding stays shared), screened by an int8 copy made here (see the module docstring)."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = weight  # the float32 head (a tied model's embedding: shared, not copied)
        w = weight.detach().float()
        scales = (w.abs().amax(dim=1) / 127).clamp_min(torch.finfo(torch.bfloat16).tiny).to(torch.bfloat16)
        codes = torch.round(w / scales.float()[:, None]).clamp(-127, 127).to(torch.int8).contiguous()
        dequantized = codes.float() * scales.float()[:, None]
        self.register_buffer("codes", codes, persistent=False)  # int8 [vocab, hidden]
        self.register_buffer("scales", scales, persistent=False)  # bfloat16 [vocab]
        # per vocabulary row, the bound's two factors of ||x||_1 (module docstring): e_v + m_v (u + (H + 1) eps)
        rounding = BFLOAT16_UNIT_ROUNDOFF + (w.shape[1] + 1) * FLOAT32_UNIT_ROUNDOFF
        self.register_buffer("error_per_l1", (w - dequantized).abs().amax(dim=1)
                             + rounding * dequantized.abs().amax(dim=1), persistent=False)

    def approximate(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The int8 logits and each entry's error bound, both `[R, vocab]` float32."""
        logits = torch.ops.aten._weight_int8pack_mm(hidden.to(torch.bfloat16), self.codes, self.scales).float()
        l1 = hidden.abs().sum(dim=1, keepdim=True)
        output_rounding = BFLOAT16_UNIT_ROUNDOFF / (1 - BFLOAT16_UNIT_ROUNDOFF)
        return logits, l1 * self.error_per_l1 + output_rounding * logits.abs()

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        hidden = hidden.float()
        logits, bound = self.approximate(hidden)
        floor = (logits - bound).amax(dim=1, keepdim=True)  # the true maximum is at least this
        rows, cols = (logits + bound >= floor).nonzero(as_tuple=True)
        logits[rows, cols] = (hidden[rows] * self.weight[cols]).sum(dim=1)
        return logits

    def extra_repr(self) -> str:
        vocab, hidden = self.codes.shape
        return f"vocab={vocab}, hidden={hidden}, int8 screen, float32 candidates"
