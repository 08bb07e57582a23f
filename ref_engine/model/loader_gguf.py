"""Read a llama.cpp GGUF file: metadata, (de)quantized weights under Hugging Face names, tokenizer.

This module owns the translation from GGUF to what `loader.py` assembles: an `ArchConfig`, a stream of
`(hugging_face_name, float32 tensor)` pairs, a `Tokenizer` and the ids that end a generation.

Three things differ from a Hugging Face checkpoint:
1. **Quantization.** Weights are stored in llama.cpp block formats (Q4_1: 32 weights share a scale and
   a minimum, 4 bits each). We dequantize to float32 with `gguf.quants.dequantize` when loading; the
   engine then computes in float32 or bfloat16. (llama.cpp instead keeps the blocks and dequantizes
   inside its matmul kernels.) With `quantization="int4"` the Q4_1 tensors also come as their own 4-bit
   codes, scales and minima (`int4_weights`), which ref_engine/model/int4.py hands to torch's int4
   kernel without requantizing.
2. **Names.** `blk.3.attn_q.weight` is `model.layers.3.self_attn.q_proj.weight`, and so on (`_LAYER_NAMES`).
3. **Rotary layout.** llama.cpp's converter reorders the rows of q_proj and k_proj of "llama" models so
   that ggml can rotate *adjacent* pairs; Hugging Face checkpoints rotate pairs (i, i + head_dim/2).
   `unpermute_rope_rows` puts the rows back. Qwen2 files are not reordered.

A GGUF file with no `output.weight` ties the LM head to the token embedding.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
from gguf import GGMLQuantizationType as QType

from core.arch_config import ArchConfig
from ref_engine.model.gguf_header import GGUFTensor, read_header
from ref_engine.model.int4 import Int4Weight
from ref_engine.model.tokenizer import Tokenizer

# The formats of common llama.cpp files whose decoding tests/engine/test_loaders.py checks against a reference.
SUPPORTED_QUANT_TYPES = (QType.F32, QType.F16, QType.BF16, QType.Q8_0, QType.Q4_0, QType.Q4_1, QType.Q5_0,
                         QType.Q5_1, QType.Q4_K, QType.Q5_K, QType.Q6_K)

_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
# blk.N.<gguf> -> model.layers.N.<hugging face>
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


class GGUFCheckpoint:
    """One GGUF file, memory-mapped; weights are dequantized when `weights()` is iterated."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.content_files = [self.path]  # what the model's numbers depend on: weights and metadata
        header = read_header(self.path)
        self.metadata: dict[str, Any] = header.metadata
        self.tensors = {t.name: t for t in header.tensors}  # in the file's order
        for tensor in self.tensors.values():  # fail before any slow work
            self.hf_name(tensor.name)
            if tensor.tensor_type not in SUPPORTED_QUANT_TYPES:
                raise ValueError(
                    f"{self.path}: unsupported quantization type {tensor.tensor_type.name} for tensor "
                    f"{tensor.name!r}; supported: {', '.join(q.name for q in SUPPORTED_QUANT_TYPES)}")
        if "token_embd.weight" not in self.tensors:
            raise ValueError(f"{self.path}: GGUF file lacks the tensor 'token_embd.weight'")
        self.model_id = self.path.stem
        try:
            self.arch = ArchConfig.from_gguf_metadata(
                self.metadata, tie_word_embeddings="output.weight" not in self.tensors,
                vocab_size=int(self.tensors["token_embd.weight"].shape[1]), name=self.model_id)
        except ValueError as err:
            raise ValueError(f"{self.path}: {err}") from None

    def hf_name(self, gguf_name: str) -> str:
        """`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`."""
        base, _, kind = gguf_name.rpartition(".")
        if base in _GLOBAL_NAMES:
            return f"{_GLOBAL_NAMES[base]}.{kind}"
        parts = base.split(".")
        if len(parts) == 3 and parts[0] == "blk" and parts[2] in _LAYER_NAMES:
            return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{kind}"
        if base == "rope_freqs":
            raise ValueError(f"{self.path}: rope frequency factors stored as a tensor ('rope_freqs.weight', "
                             "used by Llama 3.x GGUF files) are not supported; load the Hugging Face folder")
        raise ValueError(f"{self.path}: unexpected GGUF tensor {gguf_name!r}")

    def weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """`(hugging_face_name, float32 tensor)` for every tensor in the file."""
        for tensor in self.tensors.values():
            yield self.hf_name(tensor.name), self.hf_rows(tensor.name, torch.tensor(dequantize(tensor)))

    def int4_weights(self) -> dict[str, Int4Weight]:
        """The file's Q4_1 tensors as `Int4Weight`s (the same codes, scales and minima), by Hugging Face name."""
        return {self.hf_name(t.name): Int4Weight.from_q4_1(*(self.hf_rows(t.name, part) for part in q4_1_parts(t)))
                for t in self.tensors.values() if t.tensor_type == QType.Q4_1}

    def hf_rows(self, gguf_name: str, values: torch.Tensor) -> torch.Tensor:
        """`values` (a tensor's weights, or anything with one row per output) in Hugging Face's row order."""
        layer_part = gguf_name.split(".")[-2]  # "attn_q" in "blk.0.attn_q.weight"
        if self.arch.architecture == "llama" and layer_part in ("attn_q", "attn_k"):
            heads = self.arch.num_attention_heads if layer_part == "attn_q" else self.arch.num_kv_heads
            return unpermute_rope_rows(values, heads)
        return values

    def tokenizer(self) -> Tokenizer:
        try:
            return Tokenizer.from_gguf_metadata(self.metadata)
        except ValueError as err:
            raise ValueError(f"{self.path}: {err}") from None

    def eos_token_ids(self, tokenizer: Tokenizer) -> set[int]:
        """The file's EOS and, when given, end-of-turn / end-of-message ids (Llama 3 has all three)."""
        keys = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")
        return {int(self.metadata[k]) for k in keys if k in self.metadata} | tokenizer.eos_token_ids


def dequantize(tensor: GGUFTensor) -> np.ndarray:
    """Float32 values of a GGUF tensor, shaped like the PyTorch tensor it came from.

    GGUF lists dimensions innermost first (`[in_features, out_features]` for a weight), the reverse of
    PyTorch's order.
    """
    if tensor.tensor_type not in SUPPORTED_QUANT_TYPES:
        raise ValueError(f"unsupported quantization type {tensor.tensor_type.name} for tensor {tensor.name!r}")
    values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    return values.reshape([int(d) for d in reversed(tensor.shape)]).astype(np.float32, copy=False)


def q4_1_parts(tensor: GGUFTensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A Q4_1 tensor's codes `[out, in]` (0..15), scales `d` and minima `m` `[out, in / 32]`: weight
    `k` of a block is `d * codes[k] + m`.

    A block is 20 bytes: `d` and `m` in fp16, then 16 bytes whose low nibbles are weights 0-15 and high
    nibbles weights 16-31.
    """
    rows = int(tensor.shape[1])
    blocks = np.asarray(tensor.data).reshape(rows, -1, 20)
    d, m = (torch.from_numpy(blocks[..., at:at + 2].copy().view(np.float16)[..., 0].astype(np.float32))
            for at in (0, 2))
    packed = blocks[..., 4:]
    codes = np.concatenate([packed & 0xF, packed >> 4], axis=-1).reshape(rows, -1)
    return torch.from_numpy(codes.astype(np.int32)), d, m


def unpermute_rope_rows(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's reordering of a q/k projection's output rows (weight `[rows, in]` or bias `[rows]`).

    Within each head of `d` rows, GGUF row `2i + j` holds Hugging Face row `j * d/2 + i`: the two halves
    rotated together are interleaved. Reshaping each head to `(d/2, 2)` and swapping the axes restores
    the halves.
    """
    rows, *rest = weight.shape
    head_dim = rows // num_heads
    return weight.reshape(num_heads, head_dim // 2, 2, *rest).transpose(1, 2).reshape(rows, *rest)
