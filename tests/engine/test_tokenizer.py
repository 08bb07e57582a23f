"""Our Tokenizer against transformers' on the SmolLM2 GGUF (ids, text, chat template), its Hugging Face
folder form, and the GGUF rebuild rules on a toy vocabulary."""

from __future__ import annotations

import jinja2
import pytest
import transformers

from ref_engine.model.tokenizer import CONTROL_TOKEN, Tokenizer

TEXTS = [
    "Hello world",
    "",
    "  leading spaces, and   several   gaps  ",
    "numbers 1234567, 3.14159 and -42; dates 2024-01-31",
    "unicode: héllo wörld — naïve café, 日本語のテキスト, emoji 🤖🚀, Ελληνικά",
    "code:\ndef f(x):\n\treturn x ** 2  # square\n\n\nprint(f(3))",
    "\n\n\t \r\n trailing whitespace \t",
    "<|im_start|>user\nHi there<|im_end|>\n<|endoftext|>",
    "don't, I'll, we've, THEY'RE",
]
CHATS = [
    [{"role": "user", "content": "What is 2 + 2?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a color."}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
     {"role": "user", "content": "Tell me a joke about ünïcode."}],
]


@pytest.fixture(scope="module")
def hf_tokenizer(smollm2_path):
    return transformers.AutoTokenizer.from_pretrained(smollm2_path.parent, gguf_file=smollm2_path.name)


@pytest.mark.slow
@pytest.mark.parametrize("add_special_tokens", [True, False])
def test_gguf_encode_matches_transformers(smollm2, hf_tokenizer, add_special_tokens):
    for text in TEXTS:
        expected = hf_tokenizer.encode(text, add_special_tokens=add_special_tokens)
        assert smollm2.tokenizer.encode(text, add_special_tokens=add_special_tokens) == expected, text


@pytest.mark.slow
@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_gguf_decode_matches_transformers(smollm2, hf_tokenizer, skip_special_tokens):
    for text in TEXTS:
        ids = hf_tokenizer.encode(text)
        expected = hf_tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
        assert smollm2.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens) == expected


@pytest.mark.slow
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_gguf_chat_template_matches_transformers(smollm2, hf_tokenizer, add_generation_prompt):
    for chat in CHATS:
        expected = hf_tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=add_generation_prompt)
        assert smollm2.tokenizer.apply_chat_template(chat, add_generation_prompt=add_generation_prompt) == expected


@pytest.mark.slow
def test_gguf_special_tokens(smollm2):
    tokenizer = smollm2.tokenizer
    assert (tokenizer.bos_token, tokenizer.bos_token_id) == ("<|im_start|>", 1)
    assert (tokenizer.eos_token, tokenizer.eos_token_id) == ("<|im_end|>", 2)
    assert smollm2.eos_token_ids == {2}
    assert tokenizer.vocab_size == smollm2.arch.vocab_size == 49152


@pytest.mark.slow
def test_hf_folder_tokenizer_matches_gguf_one(smollm2, hf_tokenizer, tmp_path):
    """The same tokenizer saved as a Hugging Face folder (tokenizer.json, chat template beside it)."""
    hf_tokenizer.save_pretrained(tmp_path)
    ours = Tokenizer.from_hf_folder(tmp_path)
    for text in TEXTS:
        assert ours.encode(text) == smollm2.tokenizer.encode(text)
    for chat in CHATS:
        assert ours.apply_chat_template(chat) == smollm2.tokenizer.apply_chat_template(chat)
    assert ours.eos_token_id == 2


# ---- GGUF rebuild rules on a toy vocabulary (no model needed) ----


def toy_gguf_metadata(**overrides):
    letters = ["h", "e", "l", "o", "Ġ", "1", "2", "he", "ll", "hell", "hello", "Ġhello", "12"]
    tokens = ["<bos>", "<eos>", *letters]
    meta = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [CONTROL_TOKEN, CONTROL_TOKEN] + [1] * len(letters),
        "tokenizer.ggml.merges": ["h e", "l l", "he ll", "hell o", "Ġ hello", "1 2"],
        "tokenizer.ggml.bos_token_id": 0,
        "tokenizer.ggml.eos_token_id": 1,
        "tokenizer.chat_template": "{% for m in messages %}{{ bos_token }}{{ m['content'] }}{% endfor %}",
    }
    return {**meta, **overrides}


def test_gguf_tokenizer_merges_and_bos():
    tokenizer = Tokenizer.from_gguf_metadata(toy_gguf_metadata(**{"tokenizer.ggml.add_bos_token": True}))
    assert tokenizer.encode("hello hello") == [0, 12, 13]  # <bos>, "hello", "Ġhello"
    assert tokenizer.encode("hello", add_special_tokens=False) == [12]
    assert tokenizer.decode([0, 12, 13, 1]) == "hello hello"
    assert tokenizer.decode([0, 12, 1], skip_special_tokens=False) == "<bos>hello<eos>"
    assert tokenizer.encode("<eos>", add_special_tokens=False) == [1]  # control tokens match whole


def test_gguf_smollm_pre_tokenizer_splits_digits():
    gpt2_style = Tokenizer.from_gguf_metadata(toy_gguf_metadata())
    smollm = Tokenizer.from_gguf_metadata(toy_gguf_metadata(**{"tokenizer.ggml.pre": "smollm"}))
    assert gpt2_style.encode("12") == [14]  # "12" merged
    assert smollm.encode("12") == [7, 8]  # one digit per piece, as SmolLM was trained


def test_gguf_tokenizer_refuses_what_it_cannot_rebuild():
    with pytest.raises(ValueError, match="pre-tokenizer 'mystery'"):
        Tokenizer.from_gguf_metadata(toy_gguf_metadata(**{"tokenizer.ggml.pre": "mystery"}))
    with pytest.raises(ValueError, match="tokenizer model 'llama'"):
        Tokenizer.from_gguf_metadata(toy_gguf_metadata(**{"tokenizer.ggml.model": "llama"}))


def test_chat_template_variables_and_raise_exception():
    tokenizer = Tokenizer.from_gguf_metadata(toy_gguf_metadata())
    assert tokenizer.apply_chat_template([{"role": "user", "content": "hi"}]) == "<bos>hi"
    tokenizer.chat_template = "{{ raise_exception('roles must alternate') }}"
    with pytest.raises(jinja2.exceptions.TemplateError, match="roles must alternate"):
        tokenizer.apply_chat_template([])
