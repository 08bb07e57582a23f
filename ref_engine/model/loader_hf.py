"""Read a Hugging Face model folder: `config.json`, safetensors weights, tokenizer, generation config.

This module owns the translation from the Hugging Face on-disk format to what `loader.py` assembles:
an `ArchConfig`, a stream of `(hugging_face_name, tensor)` pairs, a `Tokenizer` and the ids that end a
generation. It builds no model itself.

Weights come from `model.safetensors`, or from the shards listed in `model.safetensors.index.json`.
Tensors are streamed one at a time, so peak memory stays near the size of the model, not twice that.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from core.arch_config import ArchConfig
from ref_engine.model.tokenizer import Tokenizer

SINGLE_FILE = "model.safetensors"
SHARD_INDEX = "model.safetensors.index.json"


class HFCheckpoint:
    """A Hugging Face model folder, opened lazily: weights are read when `weights()` is iterated."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        config_path = self.folder / "config.json"
        if not config_path.is_file():
            raise FileNotFoundError(f"no config.json in {self.folder}")
        self.config: dict[str, Any] = json.loads(config_path.read_text(encoding="utf-8"))
        try:
            self.arch = ArchConfig.from_hf_config(self.config, name=self.folder.name)
        except ValueError as err:
            raise ValueError(f"{config_path}: {err}") from None
        self.model_id = self.folder.name
        self.weight_files = _safetensors_files(self.folder)
        self.content_files = [config_path, *self.weight_files]  # what the model's numbers depend on

    def weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """`(name, tensor)` for every tensor of every safetensors file, in file order."""
        for path in self.weight_files:
            with safe_open(str(path), framework="pt") as f:
                for name in f.keys():
                    yield name, f.get_tensor(name)

    def tokenizer(self) -> Tokenizer:
        return Tokenizer.from_hf_folder(self.folder)

    def eos_token_ids(self, tokenizer: Tokenizer) -> set[int]:
        """The tokenizer's EOS plus those of `generation_config.json` (or, lacking it, `config.json`).

        Chat models often stop on several ids (Llama 3: <|end_of_text|>, <|eot_id|>, <|eom_id|>).
        """
        generation_path = self.folder / "generation_config.json"
        source = self.config
        if generation_path.is_file():
            source = json.loads(generation_path.read_text(encoding="utf-8"))
        eos = source.get("eos_token_id")
        ids = set(eos) if isinstance(eos, list) else ({eos} if eos is not None else set())
        return ids | tokenizer.eos_token_ids


def _safetensors_files(folder: Path) -> list[Path]:
    if (folder / SINGLE_FILE).is_file():
        return [folder / SINGLE_FILE]
    index_path = folder / SHARD_INDEX
    if index_path.is_file():
        weight_map: dict[str, str] = json.loads(index_path.read_text(encoding="utf-8"))["weight_map"]
        return [folder / name for name in sorted(set(weight_map.values()))]
    raise ValueError(f"{folder} has a config.json but no {SINGLE_FILE} or {SHARD_INDEX} "
                     "(only safetensors weights are supported)")
