"""`load_model(path)`: one entry point for every model source the engine accepts.

This module owns the dispatch and the assembly. It decides what `path` is, lets the format module read
it (`loader_hf.HFCheckpoint` or `loader_gguf.GGUFCheckpoint`, which share one shape: `arch`,
`model_id`, `content_files`, `weights()`, `tokenizer()`, `eos_token_ids()`), then builds `LlamaForCausalLM`
on the device and streams the weights into it:

* `None`                           -> the default SmolLM2-135M-Instruct GGUF (`store.default_model_path`)
* a folder with `config.json`      -> Hugging Face safetensors checkpoint
* a file starting with b"GGUF"     -> llama.cpp GGUF file

Weights are computed in float32, bfloat16 or float16 (`core.config.DTYPES`), whatever the file stores, or with `quantization="int8"` in
int8 (ref_engine/model/quantization.py), or with `quantization="int4"` as 4-bit codes: a GGUF's own Q4_1
blocks as they are, any other weight quantized in groups of `quantization_group_size` (ref_engine/model/int4.py).

`LoadedModel.weights_digest` is a SHA-256 of the checkpoint's content files (weights, and a folder's
config.json): the name says which model, the digest says which numbers, so the engine's prefix cache never
serves K/V computed from other weights filed under the same name. Reading ~100 MB costs ~0.07 s; a file's
digest is remembered by path, size, inode and modification and change times (the change time moves on any
write, even one that restores the modification time), so a test session that builds many engines on one
file hashes it once.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from copy import deepcopy
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from core.arch_config import ArchConfig
from core.config import DTYPES, FLOAT32_MATMUL_PRECISIONS, INT4_GROUP_SIZE, int4_name
from ref_engine.model import store
from ref_engine.model.int4 import Int4Weight
from ref_engine.model.llama import LlamaForCausalLM
from ref_engine.model.loader_gguf import GGUFCheckpoint
from ref_engine.model.loader_hf import HFCheckpoint
from ref_engine.model.quantization import check_quantization, quantize_model
from ref_engine.model.tokenizer import Tokenizer

SUPPORTED_DTYPES = {name: getattr(torch, name) for name in DTYPES}
GGUF_MAGIC = b"GGUF"


@dataclass
class LoadedModel:
    """A model ready to run, with what the engine needs around it."""

    model: LlamaForCausalLM
    tokenizer: Tokenizer
    arch: ArchConfig
    eos_token_ids: set[int]
    model_id: str  # names the weights (file stem or folder name, "+int8" when quantized); prefix-cache hashes include it
    weights_digest: str  # which weights: `content_digest` of the checkpoint's files; prefix-cache hashes include it
    quantization: str | None = None  # None: the float reference; "int8", "int4": ref_engine/model/quantization.py
    path: Path | None = None  # the checkpoint it came from: int4 reads a GGUF's own 4-bit blocks from it


def load_model(path: str | Path | None = None, dtype: torch.dtype | str = "float32",
               device: torch.device | str | None = None, quantization: str | None = None,
               quantization_group_size: int = INT4_GROUP_SIZE, tp_rank: int = 0, tp_size: int = 1) -> LoadedModel:
    """Load a model from `path` (see the module docstring) onto `device` (default: CUDA if present), its
    projections quantized if `quantization` says so (`quantization.QUANTIZATION_METHODS`;
    `quantization_group_size`: inputs per scale and zero of int4). `tp_rank` of `tp_size`: keep only that
    tensor-parallel rank's share of the weights (ref_engine/model/linear.py); quantized projections are not
    split, so `quantization` needs `tp_size == 1`."""
    torch_dtype = resolve_dtype(dtype)
    device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    check_quantization(quantization, torch_dtype, device, quantization_group_size)
    check_tensor_parallel_quantization(quantization, tp_size)
    path = Path(path) if path is not None else store.default_model_path()
    checkpoint = _open_checkpoint(path)
    tokenizer = checkpoint.tokenizer()
    model = LlamaForCausalLM(checkpoint.arch, dtype=torch_dtype, device=device, tp_rank=tp_rank, tp_size=tp_size)
    try:
        model.load_weights(checkpoint.weights())
    except ValueError as err:  # a missing, unexpected or misshapen tensor: say which file
        raise ValueError(f"{path}: {err}") from None
    loaded = LoadedModel(model=model.eval(), tokenizer=tokenizer, arch=checkpoint.arch,
                         eos_token_ids=checkpoint.eos_token_ids(tokenizer), model_id=checkpoint.model_id,
                         weights_digest=content_digest(checkpoint.content_files), path=path)
    if quantization is None:
        return loaded
    return quantized(loaded, quantization, copy=False, group_size=quantization_group_size)


def quantized(loaded: LoadedModel, quantization: str, *, copy: bool = True,
              group_size: int = INT4_GROUP_SIZE) -> LoadedModel:
    """`loaded` (a float32 model) with its projections quantized, as `load_model(quantization=)` gives it;
    with `copy`, a quantized copy that leaves `loaded` as it was, without dequantizing the checkpoint again
    (which takes seconds; int4 reads only a GGUF's 4-bit blocks)."""
    device = next(loaded.model.parameters()).device
    check_quantization(quantization, next(loaded.model.parameters()).dtype, device, group_size)
    if loaded.quantization is not None:
        raise ValueError(f"the model is already quantized ({loaded.quantization!r}); quantize the float32 one")
    model = deepcopy(loaded.model) if copy else loaded.model
    try:
        quantize_model(model, quantization, group_size, _checkpoint_int4_weights(loaded, quantization))
    except ValueError as err:  # a group size that does not fit: say which model
        raise ValueError(f"{loaded.path or loaded.model_id}: {err}") from None
    # other numbers: neither its prefix cache nor its profile is the float one's
    label = int4_name(group_size) if quantization == "int4" else quantization
    return replace(loaded, model=model, model_id=f"{loaded.model_id}+{label}", quantization=quantization)


def check_tensor_parallel_quantization(quantization: str | None, tensor_parallel_size: int) -> None:
    """Quantized projections replace the tensor-parallel layers, all-reduce included: refused above degree 1."""
    if quantization is not None and tensor_parallel_size > 1:
        raise ValueError(f"quantization={quantization!r} runs on one rank only: its projections are not split "
                         f"over ranks; got tensor_parallel_size={tensor_parallel_size} (use 1, or quantization=None)")


def _checkpoint_int4_weights(loaded: LoadedModel, quantization: str) -> dict[str, Int4Weight]:
    """The 4-bit weights the checkpoint itself stores (a GGUF's Q4_1 tensors), for int4; none otherwise."""
    if quantization != "int4" or loaded.path is None or loaded.path.is_dir():
        return {}
    checkpoint = _open_checkpoint(loaded.path)
    return checkpoint.int4_weights() if isinstance(checkpoint, GGUFCheckpoint) else {}


def content_digest(files: Sequence[Path]) -> str:
    """SHA-256 over the files' contents, in order (hex, 32 characters)."""
    digest = hashlib.sha256()
    for path in files:
        stat = path.stat()
        digest.update(_file_digest(str(path.resolve()), (stat.st_size, stat.st_ino, stat.st_mtime_ns,
                                                         stat.st_ctime_ns)))
    return digest.hexdigest()[:32]


@functools.lru_cache(maxsize=32)  # the stat in the key: a file rewritten or replaced is read again
def _file_digest(path: str, stat: tuple[int, ...]) -> bytes:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").digest()


def read_arch(path: str | Path) -> ArchConfig:
    """A checkpoint's dimensions without its weights: what the simulator needs to price a model path."""
    return _open_checkpoint(Path(path)).arch


def load_tokenizer(path: str | Path | None = None) -> Tokenizer:
    """The tokenizer of the model at `path` (None: the default model), without its weights: what an API
    server process needs while the engine-core process holds the model."""
    return _open_checkpoint(Path(path) if path is not None else store.default_model_path()).tokenizer()


def resolve_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """`"bfloat16"` or `torch.bfloat16` -> `torch.bfloat16`; anything unsupported is a ValueError naming the
    knob and its choices."""
    name = str(dtype).removeprefix("torch.")
    if name not in SUPPORTED_DTYPES:
        raise ValueError(f"dtype={dtype!r} is not one this engine computes in; choices: "
                         f"{', '.join(repr(d) for d in SUPPORTED_DTYPES)}")
    return SUPPORTED_DTYPES[name]


def check_float32_matmul_precision(precision: str, dtype: torch.dtype | str, device: torch.device) -> None:
    """A ValueError naming the knob for a `float32_matmul_precision` this engine cannot honour: not one of its
    choices, or "high" (TF32, a mode of NVIDIA's tensor cores) on another device than CUDA or under a dtype that
    has no float32 matmuls to round."""
    if precision not in FLOAT32_MATMUL_PRECISIONS:
        raise ValueError(f"float32_matmul_precision={precision!r} is not one this engine has; choices: "
                         f"{', '.join(repr(p) for p in FLOAT32_MATMUL_PRECISIONS)}")
    if precision == "high" and device.type != "cuda":
        raise ValueError(f"float32_matmul_precision='high' lets CUDA tensor cores round float32 matmuls to TF32; "
                         f"this engine is on {device.type}, which has no TF32 (use 'highest')")
    if precision == "high" and resolve_dtype(dtype) != torch.float32:
        raise ValueError(f"float32_matmul_precision='high' changes float32 matmuls only; dtype="
                         f"{str(dtype).removeprefix('torch.')!r} has none (use 'highest', or dtype='float32')")


def set_float32_matmul_precision(precision: str, device: torch.device) -> None:
    """Apply `float32_matmul_precision` to this process's CUDA matmuls ("high": TF32, "highest": IEEE float32).
    Process-wide, as torch's setting is: the engine started last in a process sets it for all. A CPU keeps its
    own setting ("highest" is all it takes)."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.fp32_precision = "tf32" if precision == "high" else "ieee"


def _open_checkpoint(path: Path) -> HFCheckpoint | GGUFCheckpoint:
    if not path.exists():
        raise FileNotFoundError(f"model path {path} does not exist")
    if path.is_dir():
        if (path / "config.json").is_file():
            return HFCheckpoint(path)
        raise ValueError(f"{path} is a folder without config.json, not a Hugging Face model folder")
    with open(path, "rb") as f:
        magic = f.read(len(GGUF_MAGIC))
    if magic == GGUF_MAGIC:
        return GGUFCheckpoint(path)
    raise ValueError(f"{path} is neither a GGUF file (no GGUF magic) nor a Hugging Face model folder")
