"""Decode attention's gathered K/V (ref_engine/attention.py): one buffer a step, refilled by every layer.

- each layer's output equals attention computed per request from its own blocks, in the cache's dtype and
  with a narrower cache under a float32 model;
- a step's layers share the buffer (one per dtype, the same storage), and reusing it changes no number: a
  layer run on a fresh step's metadata gives the same bits.
"""

from __future__ import annotations

import random

import pytest
import torch

from core.math_utils import cdiv
from ref_engine.attention import AttentionMetadata, paged_attention

BLOCK_SIZE, NUM_BLOCKS, KV_HEADS, GROUP, HEAD_DIM, LAYERS = 4, 64, 2, 3, 8, 3


def decode_step(seq_lens: list[int], rng: random.Random) -> AttentionMetadata:
    """A pure decode step: each request's blocks drawn without repeats from the pool."""
    free = list(range(1, NUM_BLOCKS))
    rng.shuffle(free)
    tables = [[free.pop() for _ in range(cdiv(n, BLOCK_SIZE))] for n in seq_lens]
    return AttentionMetadata.build([1] * len(seq_lens), seq_lens, tables, BLOCK_SIZE)


def reference(q: torch.Tensor, cache: torch.Tensor, meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """Softmax attention one request at a time over its own keys, read block by block, in float64."""
    rows = []
    for r, seq_len in enumerate(meta.seq_lens_list):
        blocks = meta.block_tables[r, : cdiv(seq_len, BLOCK_SIZE)]
        k, v = (cache[i][blocks].flatten(0, 1)[:seq_len].double() for i in (0, 1))  # [seq_len, Hkv, D]
        qr = q[r].double().view(KV_HEADS, GROUP, HEAD_DIM)
        weights = torch.softmax(torch.einsum("hgd,shd->hgs", qr, k) * scale, dim=-1)
        rows.append(torch.einsum("hgs,shd->hgd", weights, v).reshape(KV_HEADS * GROUP, HEAD_DIM))
    return torch.stack(rows)


@pytest.mark.parametrize(("model_dtype", "cache_dtype", "tolerance"), [
    (torch.float32, torch.float32, 1e-5), (torch.float32, torch.bfloat16, 1e-5), (torch.bfloat16, torch.bfloat16, 2e-2)])
def test_every_layer_of_a_step_attends_correctly_through_one_buffer(model_dtype, cache_dtype, tolerance):
    rng = random.Random(0)
    torch.manual_seed(0)
    seq_lens = [5, 17, 1, 30, 9]
    meta = decode_step(seq_lens, rng)
    scale = HEAD_DIM**-0.5
    buffers = None
    for _ in range(LAYERS):
        cache = torch.randn(2, NUM_BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_DIM).to(cache_dtype)
        q = torch.randn(len(seq_lens), KV_HEADS * GROUP, HEAD_DIM, dtype=model_dtype)
        k = torch.randn(len(seq_lens), KV_HEADS, HEAD_DIM, dtype=model_dtype)
        v = torch.randn(len(seq_lens), KV_HEADS, HEAD_DIM, dtype=model_dtype)
        out = paged_attention(q, k, v, cache, meta, scale)  # writes k, v into the cache first
        torch.testing.assert_close(out.double(), reference(q, cache.to(model_dtype), meta, scale),
                                   atol=tolerance, rtol=tolerance)
        fresh = paged_attention(q, k, v, cache, decode_step(seq_lens, random.Random(0)), scale)
        assert torch.equal(out, fresh)  # the reused buffer holds nothing a later layer reads
        pointers = {dtype: t.data_ptr() for dtype, t in meta.decode_kv.items()}
        assert buffers in (None, pointers)
        buffers = pointers
    assert set(buffers) == {cache_dtype, model_dtype}
