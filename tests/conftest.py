"""Model fixtures shared by the engine tests: the real SmolLM2 GGUF, and tiny random Hugging Face models; the
device every engine test builds its engines on (`--device`, default cpu: `--device cuda` runs the same tests
on a GPU machine, as benchmarks/gpu_check.py does)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

TINY_VOCAB = 320  # 256 byte tokens + 2 specials fit, with unused rows left over
TINY_DIMS = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 intermediate_size=128, vocab_size=TINY_VOCAB, max_position_embeddings=256, rms_norm_eps=1e-5,
                 bos_token_id=256, eos_token_id=257)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--device", default="cpu", choices=("cpu", "cuda"),
                     help="the device the engine tests build their engines on (default cpu; cuda on a GPU machine)")


def pytest_configure(config: pytest.Config) -> None:
    """`--device cuda` where torch sees no GPU is a usage error, said at once rather than by every test."""
    if config.getoption("--device") == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise pytest.UsageError(f"--device cuda, but this torch ({torch.__version__}) sees no CUDA device")


@pytest.fixture(scope="session")
def device(request: pytest.FixtureRequest) -> str:
    """The device engine tests build their engines on: `--device` (default "cpu")."""
    return request.config.getoption("--device")


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """The default model's GGUF (pulled once into the cache folder by `store`)."""
    from ref_engine.model import store

    return store.default_model_path()


@pytest.fixture(scope="session")
def smollm2(smollm2_path: Path, device: str):
    """Our SmolLM2-135M-Instruct, float32 on the tests' `device`, loaded once per test session."""
    from ref_engine.model.loader import load_model

    return load_model(smollm2_path, dtype="float32", device=device)


@pytest.fixture(scope="session")
def make_tiny_hf_model(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """`make_tiny_hf_model(family, name=..., **config)`: a randomly initialised transformers model saved
    with `save_pretrained`, plus a byte-level `tokenizer.json`. Returns the folder.

    Norm weights and q/k/v biases are randomised too (transformers initialises them to 1 and 0, which
    would hide a norm or bias loaded into the wrong place), and the init scale is raised so greedy
    decoding does not collapse onto one token.
    """
    import torch
    import transformers

    config_classes = {"llama": transformers.LlamaConfig, "mistral": transformers.MistralConfig,
                      "qwen2": transformers.Qwen2Config}

    def make(family: str, name: str | None = None, seed: int = 0, **config: Any) -> Path:
        folder = tmp_path_factory.mktemp(name or family)
        torch.manual_seed(seed)
        hf_config = config_classes[family](**{**TINY_DIMS, "initializer_range": 0.2, **config})
        model = transformers.AutoModelForCausalLM.from_config(hf_config, attn_implementation="eager")
        with torch.no_grad():
            for param_name, param in model.named_parameters():
                if param_name.endswith("norm.weight"):
                    param.copy_(1 + 0.2 * torch.randn_like(param))
                elif param_name.endswith(".bias"):
                    param.copy_(0.5 * torch.randn_like(param))
        model.save_pretrained(folder)
        write_byte_tokenizer(folder)
        return folder

    return make


def write_byte_tokenizer(folder: Path) -> None:
    """A minimal byte-level BPE tokenizer (256 byte tokens, no merges, <s> and </s>) in HF folder format."""
    from tokenizers import AddedToken, Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import BPE

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {char: i for i, char in enumerate(sorted(alphabet))}
    tokenizer = Tokenizer(BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken("<s>", special=True), AddedToken("</s>", special=True)])
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `long` skip unless SERVING_LAB_LONG_TESTS is set: each is over 10 s on the course CPU and
    what it checks is also checked more cheaply by default, so CI's 30 minutes go to what only they cover.
    Tests marked `cpu_only` skip under `--device cuda`, with their marker's reason."""
    on_cuda = config.getoption("--device") == "cuda"
    long_skip = pytest.mark.skip(reason="a long test (over 10 s on the course CPU): set SERVING_LAB_LONG_TESTS=1")
    for item in items:
        if item.get_closest_marker("long") and not os.environ.get("SERVING_LAB_LONG_TESTS"):
            item.add_marker(long_skip)
        cpu_only = item.get_closest_marker("cpu_only")
        if cpu_only and on_cuda:
            item.add_marker(pytest.mark.skip(reason=f"CPU only: {cpu_only.kwargs['reason']}"))
