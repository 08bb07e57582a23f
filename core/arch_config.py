"""The dimensions of a Llama-family decoder, with no torch in sight.

`ArchConfig` is what both halves of Serving Lab agree a model *is*: the engine builds layers from it, and
the simulator's cost model counts FLOPs and bytes from it, so a 70B model the learner cannot run is still a
model the simulator can price. It is read from a Hugging Face `config.json`, from GGUF metadata, or picked
by name from `KNOWN_MODELS` (real dims of well-known checkpoints, copied from their published configs).

Lesson: lessons/02-paged-attention.md (KV cache size arithmetic).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from core.math_utils import cdiv

SUPPORTED_ARCHITECTURES = ("llama", "mistral", "qwen2")

# Hugging Face `architectures[0]` -> our family name.
_HF_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
}


@dataclass(frozen=True)
class ArchConfig:
    """Hyper-parameters of one decoder-only transformer (Llama, Mistral, Qwen2, SmolLM2)."""

    name: str
    architecture: str  # "llama" | "mistral" | "qwen2"
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = field(default=None, hash=False, compare=True)
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # Qwen2 has biases on q, k and v
    max_position_embeddings: int = 4096

    def __post_init__(self) -> None:
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"unsupported architecture {self.architecture!r} for model {self.name!r}; "
                f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        for knob in ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "head_dim",
                     "intermediate_size", "vocab_size"):
            if getattr(self, knob) < 1:
                raise ValueError(f"{knob} must be >= 1, got {getattr(self, knob)} for model {self.name!r}")
        if self.num_attention_heads % self.num_kv_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_kv_heads ({self.num_kv_heads}) for model {self.name!r}"
            )

    # ---- derived sizes (the arithmetic lessons derive by hand) ----

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def params_per_layer(self) -> int:
        """Weights of one decoder layer: attention projections, gated MLP, two RMSNorms."""
        attn = self.hidden_size * (self.q_size + 2 * self.kv_size) + self.q_size * self.hidden_size
        if self.attention_bias:
            attn += self.q_size + 2 * self.kv_size
        mlp = 3 * self.hidden_size * self.intermediate_size
        return attn + mlp + 2 * self.hidden_size

    @property
    def num_params(self) -> int:
        """All weights, counting a tied embedding once."""
        embed = self.vocab_size * self.hidden_size
        lm_head = 0 if self.tie_word_embeddings else embed
        return embed + lm_head + self.num_layers * self.params_per_layer + self.hidden_size

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """K and V for one token across all layers: 2 * layers * kv_heads * head_dim * bytes."""
        return 2 * self.num_layers * self.kv_size * dtype_bytes

    def num_kv_heads_per_device(self, tensor_parallel_size: int = 1) -> int:
        """KV heads one device holds: tensor parallelism splits them; with fewer heads than devices, each
        device holds one (a head is copied to several)."""
        return cdiv(self.num_kv_heads, tensor_parallel_size)

    def kv_bytes_per_block(self, block_size: int, dtype_bytes: int = 2, tensor_parallel_size: int = 1) -> int:
        """One KV block on one device: block_size tokens of K and V in every layer, for this device's share
        of the KV heads (`num_kv_heads_per_device`)."""
        return (block_size * 2 * self.num_layers * self.num_kv_heads_per_device(tensor_parallel_size)
                * self.head_dim * dtype_bytes)

    def weight_bytes(self, dtype_bytes: int = 2) -> int:
        return self.num_params * dtype_bytes

    def peak_activation_bytes(self, max_num_batched_tokens: int, max_num_seqs: int, dtype_bytes: int = 2) -> int:
        """Activation memory of the largest step, the estimate that stands in for vLLM's profiling run.

        Layers run one after another, so one layer's live buffers at the widest point count:
        T * (2H [residual + normed] + q + 2kv [qkv] + q [attention out] + 3I [gate, up, act]) * b for
        T = max_num_batched_tokens, plus float32 logits for max_num_seqs rows: max_num_seqs * V * 4.
        Not divided among tensor-parallel devices (conservative)."""
        per_token = 2 * self.hidden_size + 2 * self.q_size + 2 * self.kv_size + 3 * self.intermediate_size
        return max_num_batched_tokens * per_token * dtype_bytes + max_num_seqs * self.vocab_size * 4

    # ---- constructors ----

    @classmethod
    def from_hf_config(cls, config: dict[str, Any], name: str | None = None) -> ArchConfig:
        """Read a Hugging Face `config.json` (already parsed).

        transformers >= 5 writes `rope_parameters: {rope_theta, rope_type, factor, ...}` where older
        configs had top-level `rope_theta` and `rope_scaling`; both spellings are read."""
        rope = config.get("rope_parameters")
        if isinstance(rope, dict) and "rope_theta" not in config:
            config = {**config, "rope_theta": rope.get("rope_theta", 10000.0),
                      "rope_scaling": {k: v for k, v in rope.items() if k != "rope_theta"}}
        archs = config.get("architectures") or []
        family = _HF_ARCHITECTURES.get(archs[0]) if archs else config.get("model_type")
        if family is None or family not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"unsupported architecture {archs or config.get('model_type')!r}; supported Hugging Face "
                f"architectures: {', '.join(_HF_ARCHITECTURES)}"
            )
        try:
            hidden = int(config["hidden_size"])
            heads = int(config["num_attention_heads"])
            return cls(
                name=name or config.get("_name_or_path") or family,
                architecture=family,
                num_layers=int(config["num_hidden_layers"]),
                hidden_size=hidden,
                num_attention_heads=heads,
                num_kv_heads=int(config.get("num_key_value_heads") or heads),
                head_dim=int(config.get("head_dim") or hidden // heads),
                intermediate_size=int(config["intermediate_size"]),
                vocab_size=int(config["vocab_size"]),
                rope_theta=float(config.get("rope_theta", 10000.0)),
                rope_scaling=_normalise_rope_scaling(config.get("rope_scaling")),
                rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
                tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
                attention_bias=bool(config.get("attention_bias", family == "qwen2")),
                max_position_embeddings=int(config.get("max_position_embeddings", 4096)),
            )
        except KeyError as missing:
            raise ValueError(f"config.json lacks the field {missing.args[0]!r}") from None

    @classmethod
    def from_gguf_metadata(
        cls, meta: dict[str, Any], *, tie_word_embeddings: bool, vocab_size: int | None = None,
        name: str | None = None,
    ) -> ArchConfig:
        """Read GGUF key/values (`general.architecture`, `<arch>.block_count`, ...).

        Tied embeddings are not a metadata key in GGUF: a file ties them by omitting `output.weight`, so the
        loader, which sees the tensor list, says so.
        """
        arch = meta.get("general.architecture")
        if arch not in ("llama", "qwen2"):
            raise ValueError(f"unsupported GGUF architecture {arch!r}; supported: llama, qwen2")

        def get(key: str, default: Any = None) -> Any:
            value = meta.get(f"{arch}.{key}", default)
            if value is None:
                raise ValueError(f"GGUF metadata lacks the key {arch}.{key!s}")
            return value

        hidden = int(get("embedding_length"))
        heads = int(get("attention.head_count"))
        scaling = None
        if meta.get(f"{arch}.rope.scaling.type") not in (None, "none"):
            scaling = {"rope_type": meta[f"{arch}.rope.scaling.type"],
                       "factor": float(meta.get(f"{arch}.rope.scaling.factor", 1.0))}
        n_vocab = vocab_size or meta.get(f"{arch}.vocab_size")
        if n_vocab is None:
            raise ValueError("GGUF metadata gives no vocabulary size (no <arch>.vocab_size, no token list)")
        return cls(
            name=name or str(meta.get("general.name", arch)),
            architecture=arch,
            num_layers=int(get("block_count")),
            hidden_size=hidden,
            num_attention_heads=heads,
            num_kv_heads=int(meta.get(f"{arch}.attention.head_count_kv", heads)),
            head_dim=int(meta.get(f"{arch}.attention.key_length", hidden // heads)),
            intermediate_size=int(get("feed_forward_length")),
            vocab_size=int(n_vocab),
            rope_theta=float(meta.get(f"{arch}.rope.freq_base", 10000.0)),
            rope_scaling=scaling,
            rms_norm_eps=float(get("attention.layer_norm_rms_epsilon")),
            tie_word_embeddings=tie_word_embeddings,
            attention_bias=arch == "qwen2",
            max_position_embeddings=int(meta.get(f"{arch}.context_length", 4096)),
        )

    @classmethod
    def named(cls, name: str) -> ArchConfig:
        """A well-known model by name (case-insensitive), e.g. "llama-3.1-8b"."""
        key = name.lower()
        if key not in KNOWN_MODELS:
            raise ValueError(f"unknown model name {name!r}; known: {', '.join(sorted(KNOWN_MODELS))}")
        return KNOWN_MODELS[key]


def _normalise_rope_scaling(scaling: dict[str, Any] | None) -> dict[str, Any] | None:
    """HF wrote `type` in old configs and `rope_type` in new ones; keep one spelling."""
    if not scaling:
        return None
    scaling = dict(scaling)
    if "rope_type" not in scaling and "type" in scaling:
        scaling["rope_type"] = scaling.pop("type")
    if scaling.get("rope_type") == "default":
        return None
    return scaling


_LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}

# Real dims from each checkpoint's published config.json.
KNOWN_MODELS: dict[str, ArchConfig] = {
    "smollm2-135m": ArchConfig(
        name="SmolLM2-135M", architecture="llama", num_layers=30, hidden_size=576, num_attention_heads=9,
        num_kv_heads=3, head_dim=64, intermediate_size=1536, vocab_size=49152, rope_theta=100000.0,
        rms_norm_eps=1e-5, tie_word_embeddings=True, max_position_embeddings=8192),
    "llama-2-7b": ArchConfig(
        name="Llama-2-7B", architecture="llama", num_layers=32, hidden_size=4096, num_attention_heads=32,
        num_kv_heads=32, head_dim=128, intermediate_size=11008, vocab_size=32000, rope_theta=10000.0,
        rms_norm_eps=1e-5, max_position_embeddings=4096),
    "llama-3.1-8b": ArchConfig(
        name="Llama-3.1-8B", architecture="llama", num_layers=32, hidden_size=4096, num_attention_heads=32,
        num_kv_heads=8, head_dim=128, intermediate_size=14336, vocab_size=128256, rope_theta=500000.0,
        rope_scaling=_LLAMA3_ROPE, rms_norm_eps=1e-5, max_position_embeddings=131072),
    "llama-3.1-70b": ArchConfig(
        name="Llama-3.1-70B", architecture="llama", num_layers=80, hidden_size=8192, num_attention_heads=64,
        num_kv_heads=8, head_dim=128, intermediate_size=28672, vocab_size=128256, rope_theta=500000.0,
        rope_scaling=_LLAMA3_ROPE, rms_norm_eps=1e-5, max_position_embeddings=131072),
    "qwen2.5-7b": ArchConfig(
        name="Qwen2.5-7B", architecture="qwen2", num_layers=28, hidden_size=3584, num_attention_heads=28,
        num_kv_heads=4, head_dim=128, intermediate_size=18944, vocab_size=152064, rope_theta=1000000.0,
        rms_norm_eps=1e-6, attention_bias=True, max_position_embeddings=32768),
    "mistral-7b": ArchConfig(
        name="Mistral-7B-v0.1", architecture="mistral", num_layers=32, hidden_size=4096,
        num_attention_heads=32, num_kv_heads=8, head_dim=128, intermediate_size=14336, vocab_size=32000,
        rope_theta=10000.0, rms_norm_eps=1e-5, max_position_embeddings=32768),
}

DEFAULT_MODEL_NAME = "smollm2-135m"
