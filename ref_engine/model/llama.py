"""The decoder every supported checkpoint shares: Llama (2 and 3), Mistral, Qwen2 and SmolLM2.

This module owns the math of one forward pass over a **flat token batch**: no batch dimension, no
padding. The runner concatenates the new tokens of every scheduled request into `input_ids [T]`, gives
each its position in its own request (`positions [T]`, used by rotary embeddings), and describes who is
who in an `AttentionMetadata`; attention reads and writes the paged KV cache through it.

The families differ only in small switches read from `ArchConfig`:
* Qwen2 has biases on the q/k/v projections (`attention_bias`);
* SmolLM2 and small Qwen2 models reuse the embedding matrix as the LM head (`tie_word_embeddings`);
* Llama 3.x stretches the rotary frequencies (`rope_scaling["rope_type"] == "llama3"`);
* Mistral is Llama's math. Its sliding window (4096 tokens in v0.1) is not applied: every token attends
  to its whole context, which matches Mistral exactly up to the window length.

As in vLLM, q/k/v are one fused projection (`qkv_proj`) and gate/up another (`gate_up_proj`): one matmul
instead of three (two). `load_weights` takes Hugging Face tensor names and slices each into its shard.

With `tp_size > 1` the model is one rank's share of a tensor-parallel model (ref_engine/model/linear.py):
its share of the heads and MLP columns, the embedding, norms and LM head whole on every rank. Why the LM head
is replicated rather than split over the vocabulary (vLLM's `ParallelLMHead`): the engine samples in its
own process from rank 0's logits (ref_engine/executor/), so the logits have to end up whole on one rank
anyway; a vocabulary split would trade 1/tp of the head's matmul for a gather of `[rows, vocab]` floats
every step, and on the course CPU's two cores the ranks have no spare compute to split. Only rank 0 runs it
(the runner's `compute_logits`). A tied embedding stays tied, and the embedding needs no all-reduce.

Lesson: lessons/06-architecture-map.md (the model runner's box).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from core.arch_config import ArchConfig
from ref_engine.attention import AttentionMetadata, paged_attention
from ref_engine.model.linear import (
    ColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
    TransposedLinear,
    empty_param,
)

# Hugging Face projection name -> (our fused projection, index of its shard).
STACKED_PARAMS = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}


class RMSNorm(nn.Module):
    """`x / rms(x) * weight`, computed in float32 and cast back, as the reference implementation does."""

    def __init__(self, hidden_size: int, eps: float, dtype: torch.dtype, device: torch.device | None) -> None:
        super().__init__()
        self.eps = eps
        self.weight = empty_param(hidden_size, dtype=dtype, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def rope_inv_freq(arch: ArchConfig) -> torch.Tensor:
    """Rotary frequencies `theta^(-2i/d)`, with Llama 3's long-context rescaling when configured.

    Llama 3 ("llama3" rope_type) leaves fast-rotating pairs alone (wavelength below
    `original_max_position_embeddings / high_freq_factor`), slows the slow ones (wavelength above
    `original / low_freq_factor`) by `factor`, and blends linearly in between.
    """
    dim = arch.head_dim
    inv_freq = 1.0 / (arch.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    scaling = arch.rope_scaling
    if scaling is None:
        return inv_freq
    if scaling.get("rope_type") != "llama3":
        raise ValueError(f"unsupported rope_scaling {scaling.get('rope_type')!r} for model {arch.name!r}; "
                         "supported: llama3")
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    original_context = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    smooth = (original_context / wavelen - low) / (high - low)  # 0 at the low edge, 1 at the high edge
    blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    scaled = torch.where(wavelen > original_context / low, inv_freq / factor, blended)
    return torch.where(wavelen < original_context / high, inv_freq, scaled)


class RotaryEmbedding(nn.Module):
    """Precomputed cos/sin for every position. `cos_sin` looks up a step's positions once, and every layer
    rotates its q and k with them (`apply_rotary`).

    Pairs are (x[i], x[i + d/2]) -- the "rotate half" convention of Hugging Face checkpoints.
    """

    def __init__(self, arch: ArchConfig, dtype: torch.dtype, device: torch.device | None) -> None:
        super().__init__()
        positions = torch.arange(arch.max_position_embeddings, dtype=torch.float32)
        freqs = torch.outer(positions, rope_inv_freq(arch))  # [max_pos, d/2], float32
        angles = torch.cat([freqs, freqs], dim=-1)
        self.register_buffer("cos", angles.cos().to(dtype=dtype, device=device), persistent=False)
        self.register_buffer("sin", angles.sin().to(dtype=dtype, device=device), persistent=False)

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin `[T, 1, D]` of each token's position, broadcast over heads."""
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)


def apply_rotary(x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """`x` `[T, heads, D]` rotated by its token's position (`rope`: `RotaryEmbedding.cos_sin`)."""
    cos, sin = rope
    return x * cos + _rotate_half(x) * sin


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


class LlamaAttention(nn.Module):
    """The attention block's weights and what runs before attention: `qkv` projects and rotates. The decoder
    layer calls `paged_attention` and `o_proj` itself, so that attention is a call of its own in the layer's
    forward, with only dense math on either side (ref_engine/model/compile.py compiles those two sides)."""

    def __init__(self, arch: ArchConfig, dtype: torch.dtype, device: torch.device | None, tp_rank: int = 0,
                 tp_size: int = 1) -> None:
        super().__init__()
        self.qkv_proj = QKVParallelLinear(arch.hidden_size, arch.head_dim, arch.num_attention_heads,
                                          arch.num_kv_heads, arch.attention_bias, dtype, device, tp_rank, tp_size)
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads  # this rank's
        self.head_dim = arch.head_dim
        self.q_size, self.kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.scale = self.head_dim**-0.5
        self.o_proj = RowParallelLinear(arch.q_size, arch.hidden_size, dtype, device, tp_rank, tp_size)

    def qkv(self, rope: tuple[torch.Tensor, torch.Tensor], x: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q `[T, Hq, D]` and k `[T, Hkv, D]` rotated to their positions, and v `[T, Hkv, D]`."""
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = apply_rotary(q.view(-1, self.num_heads, self.head_dim), rope)
        k = apply_rotary(k.view(-1, self.num_kv_heads, self.head_dim), rope)
        return q, k, v.view(-1, self.num_kv_heads, self.head_dim)


class LlamaMLP(nn.Module):
    """SwiGLU: `down(silu(gate(x)) * up(x))`, with gate and up fused into one matmul."""

    def __init__(self, arch: ArchConfig, dtype: torch.dtype, device: torch.device | None, tp_rank: int = 0,
                 tp_size: int = 1) -> None:
        super().__init__()
        self.gate_up_proj = ColumnParallelLinear(arch.hidden_size, [arch.intermediate_size] * 2, False, dtype,
                                                 device, tp_rank, tp_size)
        self.down_proj = RowParallelLinear(arch.intermediate_size, arch.hidden_size, dtype, device, tp_rank, tp_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, arch: ArchConfig, dtype: torch.dtype, device: torch.device | None, tp_rank: int = 0,
                 tp_size: int = 1) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps, dtype, device)
        self.self_attn = LlamaAttention(arch, dtype, device, tp_rank, tp_size)
        self.post_attention_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps, dtype, device)
        self.mlp = LlamaMLP(arch, dtype, device, tp_rank, tp_size)

    def forward(self, rope: tuple[torch.Tensor, torch.Tensor], x: torch.Tensor, kv_cache: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        attn = self.self_attn
        q, k, v = attn.qkv(rope, self.input_layernorm(x))
        x = x + attn.o_proj(paged_attention(q, k, v, kv_cache, meta, attn.scale).flatten(1))
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, arch: ArchConfig, dtype: torch.dtype, device: torch.device | None, tp_rank: int = 0,
                 tp_size: int = 1) -> None:
        super().__init__()
        self.embed_tokens = _empty_embedding(arch, dtype, device)
        self.rotary = RotaryEmbedding(arch, dtype, device)
        self.layers = nn.ModuleList(LlamaDecoderLayer(arch, dtype, device, tp_rank, tp_size)
                                    for _ in range(arch.num_layers))
        self.norm = RMSNorm(arch.hidden_size, arch.rms_norm_eps, dtype, device)


class LlamaForCausalLM(nn.Module):
    """A decoder-only LM over a flat token batch with a paged KV cache.

    Parameters are created empty (no random init): fill them with `load_weights`. `tp_rank` of `tp_size`:
    this rank's share of a tensor-parallel model (the module docstring).
    """

    def __init__(self, arch: ArchConfig, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None, tp_rank: int = 0, tp_size: int = 1) -> None:
        super().__init__()
        device = torch.device(device) if device is not None else None
        self.arch = arch
        self.tp_rank, self.tp_size = tp_rank, tp_size
        self.model = LlamaModel(arch, dtype, device, tp_rank, tp_size)
        # Like vLLM's ParallelLMHead, the LM head is an embedding-shaped [vocab, hidden] matrix; tied
        # checkpoints simply reuse the input embedding.
        self.lm_head = self.model.embed_tokens if arch.tie_word_embeddings else _empty_embedding(arch, dtype, device)
        # A quantized engine reads the head through an int8 screen (ref_engine/model/lm_head.py,
        # set by `quantize_model`); the float model multiplies by the head itself.
        self.screened_lm_head: nn.Module | None = None

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor],
                attn_metadata: AttentionMetadata, num_layers: int | None = None) -> torch.Tensor:
        """Hidden states `[T, hidden]` for the flat batch; writes each new token's K/V into `kv_caches`.
        `num_layers`: run only the first ones, then the final norm (an early-exit draft of this model)."""
        x = self.model.embed_tokens(input_ids)
        rope = self.model.rotary.cos_sin(positions)  # looked up once per step, shared by every layer
        for layer, kv_cache in zip(self.model.layers[:num_layers], kv_caches, strict=True):
            x = layer(rope, x, kv_cache, attn_metadata)
        return self.model.norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 logits `[R, vocab]` for the rows the sampler needs (usually each request's last)."""
        if self.screened_lm_head is not None:
            return self.screened_lm_head(hidden)
        return F.linear(hidden, self.lm_head.weight).float()

    # ---- weights ----

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Fill every parameter from `(hugging_face_name, tensor)` pairs.

        Raises ValueError naming the tensor for an unknown name, a wrong shape, or a tensor that never came.
        A tied checkpoint may still carry `lm_head.weight`; it is skipped, as is `rotary_emb.inv_freq`,
        which old checkpoints saved but we recompute.
        """
        expected = hf_weight_shapes(self.arch)
        loaded: set[str] = set()
        for name, tensor in weights:
            if name.endswith("rotary_emb.inv_freq") or (name == "lm_head.weight" and self.arch.tie_word_embeddings):
                continue
            if name not in expected:
                raise ValueError(f"unexpected tensor {name!r} for a {self.arch.architecture} model "
                                 f"({self.arch.name!r})")
            if tuple(tensor.shape) != expected[name]:
                raise ValueError(f"tensor {name!r} has shape {tuple(tensor.shape)}, expected {expected[name]} "
                                 f"for model {self.arch.name!r}")
            self._load_one(name, tensor)
            loaded.add(name)
        missing = sorted(set(expected) - loaded)
        if missing:
            more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
            raise ValueError(f"checkpoint for {self.arch.name!r} lacks tensor(s) {', '.join(missing[:3])}{more}")

    def _load_one(self, name: str, tensor: torch.Tensor) -> None:
        module_name, kind = name.rsplit(".", 1)
        parent, _, proj = module_name.rpartition(".")
        if proj in STACKED_PARAMS:
            fused, shard = STACKED_PARAMS[proj]
            self.get_submodule(f"{parent}.{fused}").load_hf_shard(kind, tensor, shard)
            return
        module = self.get_submodule(module_name)
        if isinstance(module, TransposedLinear):
            module.load_hf_shard(kind, tensor)
        else:
            getattr(module, kind).copy_(tensor)


def _empty_embedding(arch: ArchConfig, dtype: torch.dtype, device: torch.device | None) -> nn.Embedding:
    return nn.Embedding.from_pretrained(torch.empty(arch.vocab_size, arch.hidden_size, dtype=dtype, device=device))


def hf_weight_shapes(arch: ArchConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a Hugging Face checkpoint of this architecture holds, with its shape."""
    hidden, inter = arch.hidden_size, arch.intermediate_size
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (arch.vocab_size, hidden),
                                          "model.norm.weight": (hidden,)}
    if not arch.tie_word_embeddings:
        shapes["lm_head.weight"] = (arch.vocab_size, hidden)
    projections = {"self_attn.q_proj": (arch.q_size, hidden), "self_attn.k_proj": (arch.kv_size, hidden),
                   "self_attn.v_proj": (arch.kv_size, hidden), "self_attn.o_proj": (hidden, arch.q_size),
                   "mlp.gate_proj": (inter, hidden), "mlp.up_proj": (inter, hidden), "mlp.down_proj": (hidden, inter)}
    for i in range(arch.num_layers):
        prefix = f"model.layers.{i}"
        shapes[f"{prefix}.input_layernorm.weight"] = (hidden,)
        shapes[f"{prefix}.post_attention_layernorm.weight"] = (hidden,)
        for proj, shape in projections.items():
            shapes[f"{prefix}.{proj}.weight"] = shape
        if arch.attention_bias:
            for proj in ("q_proj", "k_proj", "v_proj"):
                shapes[f"{prefix}.self_attn.{proj}.bias"] = (projections[f"self_attn.{proj}"][0],)
    return shapes
