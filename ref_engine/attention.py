"""Paged attention: the KV cache as a pool of fixed-size blocks, and attention that reads through it.

This module owns three things:

* the **KV cache layout**: per layer one tensor `[2, num_blocks, block_size, num_kv_heads, head_dim]`
  (index 0 holds K, index 1 holds V). A block id means the same slots in every layer, so the block pool
  in `core/` hands out ids without knowing how many layers there are;
* `AttentionMetadata`, the description of one flat token batch that the runner builds once per step and
  passes *explicitly* into `model.forward` (there is no global "forward context");
* `paged_attention`, a pure-torch reference that runs on CPU and CUDA.

The cache may be stored in a narrower dtype than the model computes in (`kv_cache_dtype`, vLLM's knob:
"bfloat16" or "float16" under a float32 model halves the bytes per cached token, so the same memory holds twice the
blocks). K/V are rounded once, when written; attention reads them back in the model's dtype.

How a token finds its K/V: token `i` of request `r` sits at position `p` of that request. Its K/V live in
block `block_tables[r][p // block_size]`, at offset `p % block_size`, i.e. at the flat *slot*
`block_id * block_size + offset`. `slot_mapping` lists that slot for every new token of the step.

Invariants: `query_lens[r] <= seq_lens_list[r]`; the new tokens of request `r` are its positions
`seq_len - query_len .. seq_len - 1`; every block a request touches is listed in its block-table row
(unused entries are padded with 0 and never read unmasked).

Lesson: lessons/02-paged-attention.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import accumulate

import torch
import torch.nn.functional as F

from core.arch_config import ArchConfig
from core.config import KV_CACHE_DTYPES
from core.math_utils import cdiv


@dataclass
class AttentionMetadata:
    """One step's flat batch, as attention needs it. Tensors live on the model's device.

    The batch is the concatenation of every scheduled request's new tokens: request `r` owns the rows
    `query_start_loc[r] : query_start_loc[r + 1]`. A decode step (1 token), a prefill chunk (n tokens)
    and a speculative verification (1 + k tokens) are all just a query length.
    """

    query_start_loc: torch.Tensor  # int64 [num_reqs + 1], cumulative query lengths
    seq_lens: torch.Tensor  # int64 [num_reqs], context length after this step (cached + new)
    slot_mapping: torch.Tensor  # int64 [num_tokens], flat cache slot of each new token's K/V
    block_tables: torch.Tensor  # int64 [num_reqs, max_blocks_per_req], padded with 0
    query_lens: list[int]  # CPU copies, so the reference needs no device sync
    seq_lens_list: list[int]
    block_size: int

    # Derived once per step in __post_init__ and shared by all layers (see `paged_attention`), unless given
    # (`fixed_decode`: a CUDA graph's batch, whose shapes cannot follow the step's data).
    decode_token_indices: torch.Tensor | None = field(default=None, repr=False)  # rows with query_len == 1
    decode_block_tables: torch.Tensor | None = field(default=None, repr=False)  # [num_decodes, blocks needed]
    decode_key_mask: torch.Tensor | None = field(default=None, repr=False)  # [num_decodes, 1, 1, max_ctx]
    prefill_reqs: list[tuple[int, int]] = field(default_factory=list, repr=False)  # (request, first row), query_len > 1
    # The decode rows' gathered K/V by dtype, made by the step's first layer and refilled by every later one (each
    # layer is done with it before the next starts). A fresh tensor per layer costs more than the copy once it
    # passes glibc's 32 MB mmap threshold: mapped, page-faulted and unmapped again in every layer
    # (benchmarks/RESULTS.md, "decode-gather-buffer").
    decode_kv: dict[torch.dtype, torch.Tensor] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.decode_key_mask is not None:  # given whole by `fixed_decode`
            return
        device = self.block_tables.device
        decode_reqs = [r for r, n in enumerate(self.query_lens) if n == 1]
        first_rows = [0, *accumulate(self.query_lens)]
        self.prefill_reqs = [(r, first_rows[r]) for r, n in enumerate(self.query_lens) if n > 1]
        max_ctx = max((self.seq_lens_list[r] for r in decode_reqs), default=0)
        num_blocks = cdiv(max_ctx, self.block_size)
        reqs = torch.tensor(decode_reqs, dtype=torch.int64, device=device)
        self.decode_token_indices = self.query_start_loc[reqs]
        self.decode_block_tables = self.block_tables[reqs, :num_blocks]
        key_positions = torch.arange(num_blocks * self.block_size, device=device)
        self.decode_key_mask = (key_positions < self.seq_lens[reqs, None])[:, None, None, :]

    @classmethod
    def build(
        cls,
        query_lens: list[int],
        seq_lens: list[int],
        block_tables: list[list[int]],
        block_size: int,
        device: torch.device | str | None = None,
    ) -> AttentionMetadata:
        """Metadata for requests with these query lengths, context lengths and block tables.

        The new tokens of request `r` occupy its positions `seq_lens[r] - query_lens[r] .. seq_lens[r] - 1`;
        their slots are looked up in the request's block table.
        """
        if not len(query_lens) == len(seq_lens) == len(block_tables):
            raise ValueError("query_lens, seq_lens and block_tables must have one entry per request")
        slots: list[int] = []
        for query_len, seq_len, table in zip(query_lens, seq_lens, block_tables):
            if not 1 <= query_len <= seq_len:
                raise ValueError(f"need 1 <= query_len <= seq_len, got {query_len} and {seq_len}")
            if len(table) * block_size < seq_len:
                raise ValueError(f"{len(table)} blocks of {block_size} slots cannot hold {seq_len} tokens")
            for pos in range(seq_len - query_len, seq_len):
                slots.append(table[pos // block_size] * block_size + pos % block_size)
        width = max((len(t) for t in block_tables), default=0)
        padded = [t + [0] * (width - len(t)) for t in block_tables]

        def as_tensor(values: list) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int64, device=device)

        return cls(
            query_start_loc=as_tensor([0, *accumulate(query_lens)]),
            seq_lens=as_tensor(seq_lens),
            slot_mapping=as_tensor(slots),
            block_tables=as_tensor(padded).view(len(block_tables), width),
            query_lens=list(query_lens),
            seq_lens_list=list(seq_lens),
            block_size=block_size,
        )


    @classmethod
    def fixed_decode(cls, slot_mapping: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor,
                     block_size: int) -> AttentionMetadata:
        """A pure-decode batch at a fixed shape, from device tensors only: one query per row, `block_tables`
        `[rows, width]` read whole, keys past each row's `seq_lens` masked. What a CUDA graph captures
        (ref_engine/cuda_graphs.py): no Python list is read and nothing is copied from the host, so the same
        kernels serve every step whose data the graph's input buffers hold. `query_lens` and `seq_lens_list`
        give the shape only (`width * block_size`, the longest context a row may have)."""
        num_rows, width = block_tables.shape
        rows = torch.arange(num_rows + 1, device=block_tables.device)
        key_positions = torch.arange(width * block_size, device=block_tables.device)
        return cls(query_start_loc=rows, seq_lens=seq_lens, slot_mapping=slot_mapping, block_tables=block_tables,
                   query_lens=[1] * num_rows, seq_lens_list=[width * block_size] * num_rows, block_size=block_size,
                   decode_token_indices=rows[:-1], decode_block_tables=block_tables,
                   decode_key_mask=(key_positions < seq_lens[:, None])[:, None, None, :])


def check_kv_cache_dtype(kv_cache_dtype: str) -> None:
    """A ValueError naming the knob and its choices for a KV-cache dtype this engine does not have."""
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype={kv_cache_dtype!r} is not a KV-cache dtype this engine has; choices: "
                         f"{', '.join(repr(d) for d in KV_CACHE_DTYPES)}")


def kv_cache_torch_dtype(kv_cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """The torch dtype of a `kv_cache_dtype` choice ("auto": the model's)."""
    check_kv_cache_dtype(kv_cache_dtype)
    return model_dtype if kv_cache_dtype == "auto" else getattr(torch, kv_cache_dtype)


def allocate_kv_cache(
    arch: ArchConfig, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device | str | None = None,
    tensor_parallel_size: int = 1, zeroed: bool = True, pin_memory: bool = False,
) -> list[torch.Tensor]:
    """One `[2, num_blocks, block_size, num_kv_heads, head_dim]` tensor per layer, `num_kv_heads` being
    one tensor-parallel rank's share (`ArchConfig.num_kv_heads_per_device`).

    Zeroed for attention to read: padded key positions are masked, but a NaN left in uninitialised memory
    would still turn `0 * NaN` into NaN in the probability-weighted sum of values. `zeroed=False` is for the
    host's swap pool, which only ever holds whole blocks copied from the device's: left uninitialised, its
    pages cost nothing until a swap writes them (the default 4 GiB took 2-5 s to zero on a 2-core CPU).
    `pin_memory=True` (a host pool beside a CUDA device) page-locks it, so that copies to and from the device
    run asynchronously.
    """
    shape = (2, num_blocks, block_size, arch.num_kv_heads_per_device(tensor_parallel_size), arch.head_dim)
    make = torch.zeros if zeroed else torch.empty
    return [make(shape, dtype=dtype, device=device, pin_memory=pin_memory) for _ in range(arch.num_layers)]


def write_kv_cache(k: torch.Tensor, v: torch.Tensor, kv_cache_layer: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Store the new tokens' K/V `[T, Hkv, D]` at their slots, rounded to the cache's dtype."""
    flat = kv_cache_layer.flatten(1, 2)  # [2, num_blocks * block_size, Hkv, D], a view
    flat[0].index_copy_(0, slot_mapping, k.to(flat.dtype))
    flat[1].index_copy_(0, slot_mapping, v.to(flat.dtype))


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_cache_layer: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """Causal attention of a flat batch through the paged KV cache; returns `[T, Hq, D]`.

    `q` is `[T, Hq, D]`, `k`/`v` are `[T, Hkv, D]` for the new tokens. They are first written into the
    cache; then every query at position `p` of its request attends to that request's keys `0 .. p`, read
    back from the cache through its block table. With grouped-query attention (GQA) each group of
    `Hq / Hkv` query heads shares one KV head.

    The rows are split in two, because their shapes differ:

    * **decode rows** (query length 1) are most of a serving step, often dozens of requests. They all go
      through ONE batched call: gather each request's blocks into `[B, max_ctx, Hkv, D]`, mask the key
      positions past each request's length, and run one `scaled_dot_product_attention`. A Python loop
      over them would cost a kernel launch per request per layer. The gather copies every request's
      whole context each layer: decode attention is bound by memory traffic, not by FLOPs.
    * **prefill rows** (a prompt, a chunk of one, or a speculative verification) are few per step and
      have different query lengths, so they run one request at a time with a causal mask that is offset
      by the tokens already cached.

    SDPA accumulates in float32 internally, so float32, bfloat16 and float16 models all work. A cache stored in
    another dtype than `q` (`kv_cache_dtype`) is read back in `q`'s dtype after the gather.
    """
    write_kv_cache(k, v, kv_cache_layer, meta.slot_mapping)
    if not meta.prefill_reqs:  # a pure decode step (the common one): every row is its request's one query
        return _decode_attention(q, kv_cache_layer, meta, scale)
    out = torch.empty_like(q)
    if meta.decode_token_indices.numel():
        out.index_copy_(0, meta.decode_token_indices,
                        _decode_attention(q[meta.decode_token_indices], kv_cache_layer, meta, scale))

    for r, start in meta.prefill_reqs:
        query_len, seq_len = meta.query_lens[r], meta.seq_lens_list[r]
        num_blocks = cdiv(seq_len, meta.block_size)
        kv = kv_cache_layer.index_select(1, meta.block_tables[r, :num_blocks]).to(q.dtype)
        kv = kv.flatten(1, 2)[:, :seq_len].transpose(1, 2).unsqueeze(1)  # [2, 1, Hkv, seq_len, D]
        q_req = q[start : start + query_len].transpose(0, 1).unsqueeze(0)  # [1, Hq, query_len, D]
        if query_len == seq_len:  # nothing cached before: the plain causal triangle
            mask, causal = None, True
        else:  # query i sits at position seq_len - query_len + i and sees keys up to there
            query_pos = torch.arange(seq_len - query_len, seq_len, device=q.device)
            mask, causal = torch.arange(seq_len, device=q.device)[None, :] <= query_pos[:, None], False
        o = F.scaled_dot_product_attention(q_req, kv[0], kv[1], attn_mask=mask, is_causal=causal, scale=scale,
                                           enable_gqa=True)
        out[start : start + query_len] = o[0].transpose(0, 1)
    return out


def _decode_attention(q: torch.Tensor, kv_cache_layer: torch.Tensor, meta: AttentionMetadata,
                      scale: float) -> torch.Tensor:
    """Attention of the decode rows `q` `[B, Hq, D]` (one per decode request, in order) in one batched call."""
    num_decodes, num_blocks = meta.decode_block_tables.shape
    num_kv_heads, head_dim = kv_cache_layer.shape[3:]
    kv = _gather_decode_kv(kv_cache_layer, meta, q.dtype)
    kv = kv.view(2, num_decodes, num_blocks * meta.block_size, num_kv_heads, head_dim).transpose(2, 3)
    # GQA without copying K/V per query head: the G query heads sharing a KV head become G query rows.
    q = q.view(num_decodes, num_kv_heads, -1, head_dim)  # [B, Hkv, G, D]
    o = F.scaled_dot_product_attention(q, kv[0], kv[1], attn_mask=meta.decode_key_mask, scale=scale)
    return o.reshape(num_decodes, -1, head_dim)


def _gather_decode_kv(kv_cache_layer: torch.Tensor, meta: AttentionMetadata, dtype: torch.dtype) -> torch.Tensor:
    """Every decode request's blocks of this layer, `[2, rows * blocks, block_size, Hkv, D]` in `dtype`, written
    into the step's buffers (`AttentionMetadata.decode_kv`): one in the cache's dtype, and one in `dtype` when
    the cache is stored narrower (`kv_cache_dtype`)."""
    blocks = meta.decode_block_tables.flatten()
    shape = (2, blocks.numel(), *kv_cache_layer.shape[2:])

    def buffer(of: torch.dtype) -> torch.Tensor:
        if of not in meta.decode_kv:
            meta.decode_kv[of] = kv_cache_layer.new_empty(shape, dtype=of)
        return meta.decode_kv[of]

    gathered = torch.index_select(kv_cache_layer, 1, blocks, out=buffer(kv_cache_layer.dtype))
    return gathered if dtype == kv_cache_layer.dtype else buffer(dtype).copy_(gathered)
