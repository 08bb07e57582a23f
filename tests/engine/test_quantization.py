"""`quantization="int8"`: int8 weight-only with bfloat16 activations (ref_engine/model/quantization.py), and
what int8 and int4 share.

- one layer: `Int8Linear` reproduces the float product within the quantization error the test derives;
- batched equals solo for both quantized paths: a row's (a request's) numbers never depend on its batch;
- bad values name the knob and its choices;
- a quantized copy equals a quantized load and leaves the float model alone.
The batched regimes and the quality bounds of every fast path are in tests/engine/test_fast_paths.py.
"""

from __future__ import annotations

import pytest
import torch

from ref_engine import LLM, SamplingParams
from ref_engine.model.int4 import Int4Linear, Int4Weight, has_int4_kernel
from ref_engine.model.loader import load_model, quantized
from ref_engine.model.quantization import Int8Linear, check_quantization

needs_int4_kernel = pytest.mark.skipif(not has_int4_kernel(torch.device("cpu")),
                                       reason="this torch has no CPU int4 kernel (aten._weight_int4pack_mm_for_cpu)")
QUANTIZED_PATHS = ["int8", pytest.param("int4", marks=needs_int4_kernel)]
# The quantized engines run on torch's CPU int8 and int4 kernels: `check_quantization` refuses any other device.
cpu_kernels = pytest.mark.cpu_only(reason="int8 and int4 run on torch's CPU kernels (check_quantization refuses CUDA)")


@pytest.mark.parametrize("rows", [1, 16, 64])
def test_int8_linear_reproduces_the_float_product_within_the_rounding_error(rows):
    """Rounding each weight to its channel's step (max |w| / 127) errs by at most half a step, uniformly
    spread: about 1 / (2 * 127 * sqrt(3)) = 0.23% of the channel's largest weight, so with Gaussian weights
    (largest ~3-4x the typical) about 1% of the product; bfloat16 activations, scales and output add at most
    2^-8 = 0.4% each. Bound: 3%. A transposed or mis-scaled weight is off by ~100%."""
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(1536, 576, generator=generator) * 0.02  # [out, in], as nn.Linear
    bias = torch.randn(1536, generator=generator) * 0.01
    x = torch.randn(rows, 576, generator=generator)
    expected = x @ weight.T + bias
    error = (Int8Linear(weight, bias)(x) - expected).norm() / expected.norm()
    assert error < 0.03, f"relative error {error:.4f}"


@pytest.mark.parametrize("quantization", QUANTIZED_PATHS)
def test_a_quantized_projection_is_batch_invariant(quantization):
    """Both are weight-only: no number is taken from the batch, so each row's output is the same bits alone
    or among 40 rows."""
    generator = torch.Generator().manual_seed(2)
    weight, bias = torch.randn(960, 576, generator=generator), torch.randn(960, generator=generator)
    linear = Int8Linear(weight, bias) if quantization == "int8" else Int4Linear(Int4Weight.quantize(weight, 32), bias)
    x = torch.randn(40, 576, generator=generator)
    x[7, 3] = 500.0  # an outlier in one row moves no other row's numbers
    together = linear(x)
    assert all(torch.equal(together[i:i + 1], linear(x[i:i + 1])) for i in range(len(x)))
    assert torch.equal(together[5:37], linear(x[5:37]))


@cpu_kernels
@pytest.mark.parametrize("quantization", QUANTIZED_PATHS)
def test_a_quantized_engine_gives_each_request_the_same_tokens_alone_and_in_a_batch(make_tiny_hf_model,
                                                                                     quantization):
    loaded = load_model(make_tiny_hf_model("llama", name="quantized-llama"), device="cpu", quantization=quantization)
    assert loaded.model_id.endswith(f"+{quantization}") and loaded.quantization == quantization
    prompts = [[1 + (i * 7 + j) % 250 for j in range(5 + 3 * i)] for i in range(6)]
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    batch = [o.outputs[0].token_ids for o in LLM(loaded).generate(prompts, params, use_tqdm=False)]
    alone = [LLM(loaded).generate([p], params, use_tqdm=False)[0].outputs[0].token_ids for p in prompts]
    assert batch == alone


@pytest.mark.parametrize("kwargs, message", [
    (dict(quantization="int3"), "quantization='int3' is not a method this engine has; choices: None"),
    (dict(quantization="int8", dtype=torch.bfloat16), "computes in float32 around its quantized products"),
    (dict(quantization="int4", dtype=torch.float16), "got dtype='float16' (use dtype='float32')"),
    (dict(quantization="int8", device=torch.device("cuda")), "runs on torch's CPU int8 weight-only kernel"),
])
def test_bad_values_name_the_knob_and_the_choices(kwargs, message):
    args = {"quantization": None, "dtype": torch.float32, "device": torch.device("cpu"), **kwargs}
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_quantization(args["quantization"], args["dtype"], args["device"])


@pytest.fixture(scope="module")
def tiny_int8(make_tiny_hf_model):
    return load_model(make_tiny_hf_model("llama", name="int8-llama"), device="cpu", quantization="int8")


@cpu_kernels
def test_a_quantized_copy_equals_a_quantized_load_and_leaves_the_float_model(make_tiny_hf_model):
    folder = make_tiny_hf_model("llama", name="int8-copy")
    float32, int8 = load_model(folder, device="cpu"), load_model(folder, device="cpu", quantization="int8")
    copied = quantized(float32, "int8")
    assert (copied.quantization, copied.model_id) == (int8.quantization, int8.model_id)
    assert float32.quantization is None and not float32.model_id.endswith("+int8")
    prompts = [[1 + (i * 5 + j) % 200 for j in range(12)] for i in range(3)]
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)

    def tokens(loaded):
        return [o.outputs[0].token_ids for o in LLM(loaded).generate(prompts, params, use_tqdm=False)]

    assert tokens(copied) == tokens(int8)
    assert tokens(load_model(folder, device="cpu")) == tokens(float32)  # the float model is untouched
    with pytest.raises(ValueError, match="already quantized"):
        quantized(copied, "int8")


def test_an_engine_refuses_a_model_loaded_with_another_quantization(make_tiny_hf_model, device):
    loaded = load_model(make_tiny_hf_model("llama", name="int8-llama"), device=device)
    with pytest.raises(ValueError, match="loaded with quantization=None"):
        LLM(loaded, quantization="int8")
