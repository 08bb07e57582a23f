"""`quantization="int4"`: 4-bit weights on torch's CPU int4 kernel (ref_engine/model/int4.py).

- the kernel's layout as int4.py reads it: a GGUF's Q4_1 blocks come back through the kernel exactly as
  their scale and zero rounded to bfloat16 make them, within the bound that rounding allows of the file's
  own dequantization, on real SmolLM2 layers;
- each int4 projection reproduces the float32 product within a bound derived from bfloat16 rounding;
- float weights quantized at load land within half a step of their value;
- bad values name the knob and the choices.
Batch invariance is tested with int8's in tests/engine/test_quantization.py; the batched regimes and the
eval-set quality bounds in tests/engine/test_fast_paths.py.
"""

from __future__ import annotations

import pytest
import torch

from ref_engine import LLM, SamplingParams
from ref_engine.model.int4 import Int4Linear, Int4Weight, has_int4_kernel
from ref_engine.model.loader import load_model, quantized
from ref_engine.model.loader_gguf import GGUFCheckpoint, dequantize, q4_1_parts
from ref_engine.model.quantization import check_quantization

needs_int4_kernel = pytest.mark.skipif(not has_int4_kernel(torch.device("cpu")),
                                       reason="this torch has no CPU int4 kernel (aten._weight_int4pack_mm_for_cpu)")
BF16_ROUNDING = 2.0**-8  # largest relative error of rounding to bfloat16 (8 significant bits)
# SmolLM2 projections of several shapes; attn_q's rows are also reordered for rotary (loader_gguf.py)
REAL_LAYERS = ["blk.0.attn_q.weight", "blk.7.attn_k.weight", "blk.12.ffn_down.weight", "blk.29.ffn_gate.weight"]


def q4_1_weight(checkpoint: GGUFCheckpoint, name: str) -> tuple[Int4Weight, torch.Tensor]:
    """A Q4_1 tensor as int4.py takes it, and the file's own float32 dequantization (Hugging Face rows)."""
    tensor = checkpoint.tensors[name]
    parts = (checkpoint.hf_rows(name, part) for part in q4_1_parts(tensor))
    return Int4Weight.from_q4_1(*parts), checkpoint.hf_rows(name, torch.tensor(dequantize(tensor)))


def weight_error_bound(weight: Int4Weight) -> torch.Tensor:
    """|error| per weight once the scale and zero are stored in bfloat16: each moves by at most
    BF16_ROUNDING of itself, and the weight is `(q - 8) * scale + zero`."""
    g = weight.group_size
    return BF16_ROUNDING * ((weight.codes - 8).abs().float() * weight.scales.abs().repeat_interleave(g, 1)
                            + weight.zeros.abs().repeat_interleave(g, 1))


@pytest.fixture(scope="module")
def checkpoint(smollm2_path):
    return GGUFCheckpoint(smollm2_path)


@pytest.mark.slow
@needs_int4_kernel
@pytest.mark.parametrize("name", REAL_LAYERS)
def test_q4_1_blocks_go_through_the_kernel_without_requantizing(checkpoint, name):
    """Through the kernel, an identity matrix returns the weight. It equals, bit for bit, `(q - 8) * scale +
    zero` with scale = d and zero = m + 8 d rounded to bfloat16 and the result rounded to bfloat16 (the
    kernel's output dtype): the layout reading of int4.py. And it is within the file's dequantization by
    the only rounding left, the scale's and zero's (weight_error_bound), plus the output's."""
    weight, expected = q4_1_weight(checkpoint, name)
    assert torch.allclose(weight.dequantize(), expected, rtol=1e-6, atol=1e-7)  # the mapping itself is exact
    out_features, in_features = expected.shape
    got = Int4Linear(weight, None)(torch.eye(in_features)).t()  # [out, in]
    g = weight.group_size
    scale = weight.scales.to(torch.bfloat16).float().repeat_interleave(g, 1)
    zero = weight.zeros.to(torch.bfloat16).float().repeat_interleave(g, 1)
    assert torch.equal(got, ((weight.codes - 8).float() * scale + zero).to(torch.bfloat16).float())
    bound = weight_error_bound(weight) + BF16_ROUNDING * got.abs()
    assert ((got - expected).abs() <= bound).all()


@pytest.mark.slow
@needs_int4_kernel
@pytest.mark.parametrize("name", REAL_LAYERS)
def test_an_int4_projection_reproduces_the_float_product_within_bfloat16_rounding(checkpoint, name):
    """y = x @ W.T against the float32 product with the file's dequantized W. Worst case per output, each
    error at most BF16_ROUNDING relative: the activations rounded (|x| . |W|), the scale and zero rounded
    (|x| . weight_error_bound) and the output rounded (|y|), with 1% for float32 accumulation.
    A transposed or mis-scaled weight is off by ~100%."""
    weight, expected_weight = q4_1_weight(checkpoint, name)
    x = torch.randn(8, expected_weight.shape[1], generator=torch.Generator().manual_seed(0))
    expected = (x.double() @ expected_weight.double().t()).float()
    bound = 1.01 * (BF16_ROUNDING * (x.abs() @ expected_weight.abs().t() + expected.abs())
                    + x.abs() @ weight_error_bound(weight).t())
    assert ((Int4Linear(weight, None)(x) - expected).abs() <= bound).all()


def test_float_weights_quantized_at_load_land_within_half_a_step():
    weight = torch.randn(48, 128, generator=torch.Generator().manual_seed(1))
    for group_size in (32, 64):
        quantized_weight = Int4Weight.quantize(weight, group_size)
        step = quantized_weight.scales.repeat_interleave(group_size, 1)
        assert quantized_weight.group_size == group_size and quantized_weight.codes.min() >= 0
        assert quantized_weight.codes.max() <= 15
        assert ((quantized_weight.dequantize() - weight).abs() <= step / 2 * (1 + 1e-5)).all()


@pytest.mark.parametrize("kwargs, message", [
    (dict(quantization="int3"), "quantization='int3' is not a method this engine has; choices: None (the float "
                                "reference), 'int8', 'int4'"),
    (dict(quantization="int4", group_size=16), "quantization_group_size=16 is not one the int4 kernel takes; "
                                               "choices: 32, 64, 128, 256"),
    (dict(quantization="int4", dtype=torch.bfloat16), "computes in float32 around its quantized products"),
    (dict(quantization="int4", device=torch.device("cuda")), "runs on torch's int4 CPU kernel"),
])
def test_bad_values_name_the_knob_and_the_choices(kwargs, message):
    args = {"dtype": torch.float32, "device": torch.device("cpu"), "group_size": 32, **kwargs}
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_quantization(args["quantization"], args["dtype"], args["device"], args["group_size"])


@needs_int4_kernel
def test_a_group_size_that_does_not_divide_a_layer_names_the_layer(make_tiny_hf_model):
    folder = make_tiny_hf_model("llama", name="int4-llama")
    with pytest.raises(ValueError, match=r"quantization_group_size=128 does not divide the 64 inputs of "
                                         r"'model.layers.0.self_attn.q_proj.weight'"):
        load_model(folder, device="cpu", quantization="int4", quantization_group_size=128)
    model_id = load_model(folder, device="cpu", quantization="int4", quantization_group_size=64).model_id
    assert model_id.endswith("+int4-g64")


@needs_int4_kernel
@pytest.mark.cpu_only(reason="int8 and int4 run on torch's CPU kernels (check_quantization refuses CUDA)")
def test_the_engine_takes_the_group_size_as_a_knob(make_tiny_hf_model):
    """`LLM(quantization="int4", quantization_group_size=64)` quantizes in groups of 64 (the model's label
    says so, as the simulator's dtype name "int4-g64" does); the knob without int4 is refused."""
    folder = make_tiny_hf_model("llama", name="int4-llama")
    with LLM(folder, device="cpu", quantization="int4", quantization_group_size=64, num_kv_blocks=8) as llm:
        assert llm.llm_engine.model_id.endswith("+int4-g64")
        assert llm.generate(["ab"], SamplingParams(max_tokens=2), use_tqdm=False)[0].outputs[0].token_ids
    with pytest.raises(ValueError, match="quantization_group_size=64 sizes int4's groups; it needs "
                                         "quantization='int4', got quantization='int8'"):
        LLM(folder, device="cpu", quantization="int8", quantization_group_size=64)


@pytest.mark.slow
@needs_int4_kernel
@pytest.mark.cpu_only(reason="quantizes the session's SmolLM2 for torch's CPU int4 kernel (check_quantization "
                             "refuses CUDA)")
def test_a_gguf_s_q4_1_blocks_are_not_requantized_to_another_group_size(smollm2):
    with pytest.raises(ValueError, match="stores 'model.layers.0.self_attn.q_proj.weight' in 4-bit groups of 32"):
        quantized(smollm2, "int4", group_size=64)
