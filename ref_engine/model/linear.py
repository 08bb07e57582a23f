"""The decoder's projections, and how tensor parallelism splits them (Megatron-LM's scheme, vLLM's names).

`TransposedLinear` is one projection, its weight stored `[in_features, out_features]`. Tensor parallelism
(Shoeybi et al., "Megatron-LM", 2019) splits the two matmuls of each block so that a single all-reduce
joins them:

* **column-parallel** (`ColumnParallelLinear`): rank r keeps its share of the output features of every
  shard: q|k|v by whole heads (`QKVParallelLinear`), gate|up by columns (vLLM's
  `MergedColumnParallelLinear`: this class with two shards). Attention runs head by head and SiLU-and-mul
  column by column, so each rank goes on with its slice and no other rank's;
* **row-parallel** (`RowParallelLinear`): rank r keeps the matching input features of o_proj and down_proj,
  so its product is a partial sum of the whole output; `tensor_model_parallel_all_reduce` adds the ranks'
  partial sums, and every rank holds the full hidden state again for the residual and the norms.

So a layer costs two all-reduces of `[tokens, hidden_size]`. KV heads: with `tp <= num_kv_heads` each rank
keeps `num_kv_heads / tp` of them; with more ranks than KV heads (tp a multiple of them) each keeps one, which
`tp / num_kv_heads` ranks share (each computes and caches it: a copy, as in vLLM).

Every rank reads each full Hugging Face tensor and keeps its slice (`load_hf_shard`); at tp = 1 each
layer is the whole projection and nothing is reduced. The slices are views into the checkpoint's tensor,
copied once into the rank's own weight.

Lesson: lessons/07-tuning-knobs.md#parallelism
"""

from __future__ import annotations

from itertools import accumulate

import torch
from torch import nn

from ref_engine.distributed import tensor_model_parallel_all_reduce


class TransposedLinear(nn.Module):
    """`y = x @ W + b` with `W` stored `[in_features, out_features]`, the transpose of `nn.Linear`.

    Why: on the 2-core CPU the notebooks run on, one `x @ W` in this layout measured 1.4-2.6x faster than
    `F.linear` at 64+ rows in float32 (benchmarks/RESULTS.md, "The machine"). Across a whole SmolLM2 decode step on that
    shared machine the gain stayed within run-to-run noise, so it is a cheap, harmless choice rather than
    a big win. On CUDA both are the same GEMM. A fused projection is one weight whose columns are its
    shards, e.g. q | k | v.

    float16 on a CPU is the exception: a CPU without float16 arithmetic (no AVX512-FP16) ran `x @ W` in this
    layout 7-11x slower than in `nn.Linear`'s (a [576, 1536] projection at 1 and 8 rows, torch 2.13), so there
    `W` is the transposed view of an `[out_features, in_features]` tensor: the same parameter, read as
    `F.linear` reads it.
    """

    def __init__(self, in_features: int, shard_sizes: list[int], bias: bool, dtype: torch.dtype,
                 device: torch.device | None) -> None:
        super().__init__()
        self.shard_offsets = [0, *accumulate(shard_sizes)]
        out_features = self.shard_offsets[-1]
        if dtype == torch.float16 and (device is None or device.type == "cpu"):
            self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=dtype).t(), requires_grad=False)
        else:
            self.weight = empty_param(in_features, out_features, dtype=dtype, device=device)
        self.bias = empty_param(out_features, dtype=dtype, device=device) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.bias is None:
            return x @ self.weight
        return torch.addmm(self.bias, x, self.weight)

    def load_hf_shard(self, kind: str, tensor: torch.Tensor, shard: int = 0) -> None:
        """Copy a Hugging Face `weight` `[out, in]` (transposed here) or `bias` `[out]` into a shard."""
        lo, hi = self.shard_offsets[shard], self.shard_offsets[shard + 1]
        if kind == "weight":
            self.weight[:, lo:hi].copy_(tensor.T)
        else:
            self.bias[lo:hi].copy_(tensor)


class ColumnParallelLinear(TransposedLinear):
    """Rank `tp_rank` of `tp_size` keeps an equal share of each shard's output features (`output_sizes`:
    each shard's full size): its output is its slice of the activation."""

    def __init__(self, in_features: int, output_sizes: list[int], bias: bool, dtype: torch.dtype,
                 device: torch.device | None, tp_rank: int = 0, tp_size: int = 1) -> None:
        self.tp_rank, self.tp_size = tp_rank, tp_size
        self.rows_kept = self.rank_rows(output_sizes)  # per shard: (first row, rows) of the full tensor
        super().__init__(in_features, [rows for _, rows in self.rows_kept], bias, dtype, device)

    def rank_rows(self, output_sizes: list[int]) -> list[tuple[int, int]]:
        """(first row, rows) of each full shard that this rank keeps."""
        if any(size % self.tp_size for size in output_sizes):
            raise ValueError(f"tensor_parallel_size={self.tp_size} does not divide the output sizes {output_sizes}")
        return [(self.tp_rank * size // self.tp_size, size // self.tp_size) for size in output_sizes]

    def load_hf_shard(self, kind: str, tensor: torch.Tensor, shard: int = 0) -> None:
        first, rows = self.rows_kept[shard]
        super().load_hf_shard(kind, tensor.narrow(0, first, rows), shard)


class QKVParallelLinear(ColumnParallelLinear):
    """q|k|v split by whole heads: each rank keeps `num_heads / tp` query heads, and `num_kv_heads / tp`
    KV heads, or, with more ranks than KV heads, the one KV head its query heads attend with."""

    def __init__(self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int, bias: bool,
                 dtype: torch.dtype, device: torch.device | None, tp_rank: int = 0, tp_size: int = 1) -> None:
        if num_heads % tp_size or (num_kv_heads % tp_size and tp_size % num_kv_heads):
            raise ValueError(f"tensor_parallel_size={tp_size} does not split {num_heads} attention heads and "
                             f"{num_kv_heads} KV heads into whole heads per rank")
        self.head_dim = head_dim
        self.num_heads = num_heads // tp_size  # this rank's
        self.num_kv_heads = max(1, num_kv_heads // tp_size)
        self.kv_head_replicas = max(1, tp_size // num_kv_heads)  # ranks that hold the same KV head
        super().__init__(hidden_size, [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim],
                         bias, dtype, device, tp_rank, tp_size)

    def rank_rows(self, output_sizes: list[int]) -> list[tuple[int, int]]:
        q_rows = self.num_heads * self.head_dim
        kv_rows = self.num_kv_heads * self.head_dim
        kv_first = self.tp_rank // self.kv_head_replicas * kv_rows
        return [(self.tp_rank * q_rows, q_rows), (kv_first, kv_rows), (kv_first, kv_rows)]


class RowParallelLinear(TransposedLinear):
    """Rank `tp_rank` keeps an equal share of the input features (`input_size`: the full count); its product
    is a partial sum of the output, which `forward` all-reduces over the ranks. No bias (Llama's o_proj and
    down_proj have none; a bias would be added once, after the reduce)."""

    def __init__(self, input_size: int, output_size: int, dtype: torch.dtype, device: torch.device | None,
                 tp_rank: int = 0, tp_size: int = 1) -> None:
        if input_size % tp_size:
            raise ValueError(f"tensor_parallel_size={tp_size} does not divide the input size {input_size}")
        self.tp_rank, self.tp_size = tp_rank, tp_size
        super().__init__(input_size // tp_size, [output_size], False, dtype, device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(x)
        return tensor_model_parallel_all_reduce(y) if self.tp_size > 1 else y

    def load_hf_shard(self, kind: str, tensor: torch.Tensor, shard: int = 0) -> None:
        columns = self.weight.shape[0]
        super().load_hf_shard(kind, tensor.narrow(1, self.tp_rank * columns, columns), shard)


def empty_param(*shape: int, dtype: torch.dtype, device: torch.device | None) -> nn.Parameter:
    """An uninitialised, inference-only parameter (no autograd bookkeeping in forward)."""
    return nn.Parameter(torch.empty(*shape, dtype=dtype, device=device), requires_grad=False)
