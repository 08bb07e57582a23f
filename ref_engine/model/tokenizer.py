"""Text <-> token ids, and chat messages -> prompt text, for Hugging Face folders and GGUF files.

This module owns the `Tokenizer` the engine and the notebooks use. It wraps the `tokenizers` library
(the Rust tokenizer behind Hugging Face) and renders chat templates with jinja2 the way transformers
does, so a prompt built here is the prompt the model was trained on.

Two sources:
* a Hugging Face folder: `tokenizer.json` is the whole tokenizer; `tokenizer_config.json` (or
  `chat_template.jinja`) adds the chat template and the names of the BOS/EOS tokens;
* a GGUF file, which stores only the pieces: the token strings, their types (normal, control, ...),
  the BPE merges and the name of llama.cpp's pre-tokenizer (`tokenizer.ggml.pre`). We rebuild a
  byte-level BPE tokenizer (GPT-2 style) from them. The pre-tokenizer decides how text is cut before BPE
  runs; a wrong one silently changes the ids, so unknown names are refused rather than guessed.

Lesson: lessons/06-architecture-map.md (where a request's prompt tokens come from).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Regex, decoders, pre_tokenizers, processors
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers.models import BPE

# GGUF `tokenizer.ggml.token_type` values (llama.cpp's llama_token_type).
CONTROL_TOKEN = 3  # special tokens such as <|im_start|>: matched whole, dropped by decode
USER_DEFINED_TOKEN = 4  # added tokens such as <think>: matched whole, kept by decode

# Split regexes of the byte-level pre-tokenizers llama.cpp names in `tokenizer.ggml.pre`.
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_SPLIT_REGEX_BY_PRE = {"llama-bpe": _LLAMA3_SPLIT, "llama3": _LLAMA3_SPLIT, "qwen2": _QWEN2_SPLIT,
                       "deepseek-r1-qwen": _QWEN2_SPLIT}
_GPT2_STYLE_PRE = ("default", "gpt2", "smollm")


class Tokenizer:
    """Encode, decode and chat-template for one model."""

    def __init__(self, backend: BackendTokenizer, *, bos_token: str | None, eos_token: str | None,
                 chat_template: str | None) -> None:
        self.backend = backend
        self.bos_token, self.eos_token = bos_token, eos_token
        self.chat_template = chat_template

    # ---- sources ----

    @classmethod
    def from_hf_folder(cls, folder: str | Path) -> Tokenizer:
        """Read `tokenizer.json`, and `tokenizer_config.json` / `chat_template.jinja` when present."""
        folder = Path(folder)
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"no tokenizer.json in {folder}")
        config_path = folder / "tokenizer_config.json"
        config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
        template_path = folder / "chat_template.jinja"
        template = config.get("chat_template")
        if template_path.is_file():
            template = template_path.read_text(encoding="utf-8")
        if isinstance(template, list):  # a list of named templates: use the default one
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        return cls(BackendTokenizer.from_file(str(path)), bos_token=_token_content(config.get("bos_token")),
                   eos_token=_token_content(config.get("eos_token")), chat_template=template)

    @classmethod
    def from_gguf_metadata(cls, meta: Mapping[str, Any]) -> Tokenizer:
        """Rebuild a byte-level BPE tokenizer from GGUF `tokenizer.*` keys (values already decoded)."""
        model = meta.get("tokenizer.ggml.model")
        if model != "gpt2":
            raise ValueError(f"unsupported GGUF tokenizer model {model!r}; supported: 'gpt2' (byte-level BPE)")
        tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
        token_types: list[int] = list(meta.get("tokenizer.ggml.token_type") or [1] * len(tokens))
        merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
        backend = BackendTokenizer(BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False))
        backend.pre_tokenizer = _gguf_pre_tokenizer(meta.get("tokenizer.ggml.pre", "default"))
        backend.decoder = decoders.ByteLevel()
        # Control and user-defined tokens are matched whole in the input, never cut up by BPE.
        backend.add_special_tokens([AddedToken(t, normalized=False, special=True)
                                    for t, kind in zip(tokens, token_types) if kind == CONTROL_TOKEN])
        backend.add_tokens([AddedToken(t, normalized=False, special=False)
                            for t, kind in zip(tokens, token_types) if kind == USER_DEFINED_TOKEN])

        def token(key: str) -> str | None:
            token_id = meta.get(f"tokenizer.ggml.{key}_token_id")
            return tokens[token_id] if token_id is not None else None

        bos, eos = token("bos"), token("eos")
        add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", False)) and bos is not None
        add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False)) and eos is not None
        if add_bos or add_eos:  # what `encode(..., add_special_tokens=True)` wraps around the text
            single = [bos] * add_bos + ["$A"] + [eos] * add_eos
            backend.post_processor = processors.TemplateProcessing(
                single=single, special_tokens=[(t, backend.token_to_id(t)) for t in {bos, eos} if t in single])
        return cls(backend, bos_token=bos, eos_token=eos, chat_template=meta.get("tokenizer.chat_template"))

    @property
    def fingerprint(self) -> str:
        """A short digest of the whole tokenizer (vocabulary, merges, normalizer, specials): the engine puts
        it in the prefix-cache key beside the model's id, since the same ids mean other text under another
        tokenizer, so cached K/V must not be shared across tokenizers."""
        return hashlib.sha256(self.backend.to_str().encode()).hexdigest()[:16]

    # ---- ids ----

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    @property
    def bos_token_id(self) -> int | None:
        return self.backend.token_to_id(self.bos_token) if self.bos_token else None

    @property
    def eos_token_id(self) -> int | None:
        return self.backend.token_to_id(self.eos_token) if self.eos_token else None

    @property
    def eos_token_ids(self) -> set[int]:
        return {self.eos_token_id} if self.eos_token_id is not None else set()

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; `add_special_tokens` adds what the tokenizer wraps around text (e.g. BOS)."""
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    # ---- chat ----

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                            **template_vars: Any) -> str:
        """Render `messages` (`[{"role": ..., "content": ...}]`) into the prompt text the model expects.

        Rendered like transformers does: a sandboxed jinja2 environment with `trim_blocks` and
        `lstrip_blocks`, a `raise_exception` helper, and `bos_token`/`eos_token` as variables.
        """
        if self.chat_template is None:
            raise ValueError("this tokenizer has no chat template")
        template = _compile_template(self.chat_template)
        return template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                               bos_token=self.bos_token or "", eos_token=self.eos_token or "", **template_vars)


def _gguf_pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    """The pre-tokenizer llama.cpp's `tokenizer.ggml.pre` names.

    "smollm" is GPT-2's split with every digit on its own (as SmolLM's own tokenizer.json says).
    """
    gpt2_split = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre == "smollm":
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), gpt2_split])
    if pre in _GPT2_STYLE_PRE:
        return gpt2_split
    if pre in _SPLIT_REGEX_BY_PRE:
        return pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(_SPLIT_REGEX_BY_PRE[pre]), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    supported = sorted([*_GPT2_STYLE_PRE, *_SPLIT_REGEX_BY_PRE])
    raise ValueError(f"unsupported GGUF pre-tokenizer {pre!r}; supported: {', '.join(supported)}")


def _token_content(token: str | dict[str, Any] | None) -> str | None:
    """tokenizer_config.json writes a special token as a string or as {"content": ..., ...}."""
    return token.get("content") if isinstance(token, dict) else token


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


@lru_cache(maxsize=16)
def _compile_template(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson  # templates pass tool schemas through it; keep non-ASCII text as is
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)
