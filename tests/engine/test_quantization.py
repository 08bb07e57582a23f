"""`quantization="int8"`: the W8A8 fast path (ref_engine/model/quantization.py) and the eval set that
measures its quality (serving_lab/eval_set.py).

- one layer: `Int8Linear` reproduces the float product within the quantization error the test derives;
- bad values name the knob and its choices;
- the engine runs every batched regime (chunked prefill, preemption by recompute and swap, prefix caching,
  speculation) on int8 weights, every request to its last token;
- quality on SmolLM2: the eval metrics are exact for the reference against itself, and int8 stays within
  bounds set from its measured cost (benchmarks/RESULTS.md, "Engine speed"), far from what a broken
  quantizer gives.
"""

from __future__ import annotations

import pytest
import torch

from ref_engine import LLM, SamplingParams
from ref_engine.model.loader import load_model, quantized
from ref_engine.model.quantization import REDUCE_RANGE, X86_ENGINES, Int8Linear, check_quantization
from serving_lab.eval_set import compare_quality, eval_prompts

needs_x86_kernels = pytest.mark.skipif(
    torch.backends.quantized.engine not in X86_ENGINES,
    reason=f"int8 runs on torch's x86 quantized kernels; this torch's engine is {torch.backends.quantized.engine!r}")


@needs_x86_kernels
@pytest.mark.parametrize("rows", [1, 16, 64])
def test_int8_linear_reproduces_the_float_product_within_the_rounding_error(rows):
    """Rounding each weight to its channel's step (max |w| / 127) and each activation to its call's step
    errs by at most half a step each, uniformly spread: about 1 / (2 * 127 * sqrt(3)) = 0.23% of the
    channel's largest weight per weight, and as much per activation (twice that with 7-bit activations),
    so with Gaussian values (largest ~3-4x the typical) the relative error of the product is around 1-2%.
    Bound: 3% (4% with 7-bit activations). A transposed or mis-scaled weight is off by ~100%."""
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(1536, 576, generator=generator) * 0.02  # [out, in], as nn.Linear
    bias = torch.randn(1536, generator=generator) * 0.01
    x = torch.randn(rows, 576, generator=generator)
    expected = x @ weight.T + bias
    error = (Int8Linear(weight, bias)(x) - expected).norm() / expected.norm()
    assert error < (0.04 if REDUCE_RANGE else 0.03), f"relative error {error:.4f}"


@pytest.mark.parametrize("kwargs, message", [
    (dict(quantization="int3"), "quantization='int3' is not a method this engine has; choices: None"),
    (dict(quantization="int8", dtype=torch.bfloat16), "computes in float32 around its int8 products"),
    (dict(quantization="int8", device=torch.device("cuda")), "runs on torch's x86 quantized CPU kernels"),
])
def test_bad_values_name_the_knob_and_the_choices(kwargs, message):
    args = {"quantization": None, "dtype": torch.float32, "device": torch.device("cpu"), **kwargs}
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_quantization(args["quantization"], args["dtype"], args["device"])


@pytest.fixture(scope="module")
def tiny_int8(make_tiny_hf_model):
    return load_model(make_tiny_hf_model("llama", name="int8-llama"), quantization="int8")


@needs_x86_kernels
def test_a_quantized_copy_equals_a_quantized_load_and_leaves_the_float_model(make_tiny_hf_model):
    folder = make_tiny_hf_model("llama", name="int8-copy")
    float32, int8 = load_model(folder), load_model(folder, quantization="int8")
    copied = quantized(float32, "int8")
    assert (copied.quantization, copied.model_id) == (int8.quantization, int8.model_id)
    assert float32.quantization is None and not float32.model_id.endswith("+int8")
    prompts = [[1 + (i * 5 + j) % 200 for j in range(12)] for i in range(3)]
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)

    def tokens(loaded):
        return [o.outputs[0].token_ids for o in LLM(loaded).generate(prompts, params, use_tqdm=False)]

    assert tokens(copied) == tokens(int8)
    assert tokens(load_model(folder)) == tokens(float32)  # the float model is untouched
    with pytest.raises(ValueError, match="already quantized"):
        quantized(copied, "int8")


def test_an_engine_refuses_a_model_loaded_with_another_quantization(make_tiny_hf_model):
    loaded = load_model(make_tiny_hf_model("llama", name="int8-llama"))
    with pytest.raises(ValueError, match="loaded with quantization=None"):
        LLM(loaded, quantization="int8")


@needs_x86_kernels
@pytest.mark.parametrize("knobs", [
    dict(max_num_batched_tokens=16),  # chunked prefill
    dict(num_kv_blocks=24, max_num_seqs=16, preemption_mode="recompute"),
    dict(num_kv_blocks=24, max_num_seqs=16, preemption_mode="swap", num_swap_blocks=64),
    dict(speculative_method="ngram", num_speculative_tokens=3),
], ids=["chunked-prefill", "preempt-recompute", "preempt-swap", "ngram-speculation"])
def test_int8_engine_runs_every_batched_regime_to_the_last_token(tiny_int8, knobs):
    prompts = [[1 + (i * 7 + j) % 200 for j in range(20 + 3 * i)] for i in range(12)]
    prompts += [prompts[0][:16] + [9, 9, 9, i] for i in range(4)]  # a shared 16-token prefix: cache hits
    llm = LLM(tiny_int8, **knobs)
    outputs = llm.generate(prompts, SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True), use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outputs] == [24] * len(prompts)
    engine = llm.llm_engine
    assert engine.scheduler.kv_cache_manager.block_pool.num_free_blocks == engine.num_kv_blocks
    if "num_kv_blocks" in knobs:
        assert engine.scheduler.num_preemptions > 0, "the pool was meant to be small enough to preempt"


@needs_x86_kernels
@pytest.mark.slow
def test_eval_metrics_are_exact_on_the_reference_and_bound_int8(smollm2, smollm2_path):
    """The reference against itself: agreement 1 and KL 0, exactly (same model, same batch). int8 on four
    eval prompts, 16 tokens: measured agreement 0.14 and KL 0.54 nats per token on eight prompts and 32
    tokens (bfloat16: 0.86 and 0.001), so the bounds are agreement >= 0.02 and KL <= 2 nats; weights
    quantized wrongly (say, transposed scales) give KL of several nats and agreement ~0."""
    [itself] = compare_quality(smollm2, [smollm2], eval_prompts(2), max_tokens=8)
    assert (itself.agreement, itself.mean_kl) == (1.0, 0.0)
    [int8] = compare_quality(smollm2, [load_model(smollm2_path, quantization="int8")], eval_prompts(4), max_tokens=16)
    print(int8)
    assert int8.agreement >= 0.02 and 0 < int8.mean_kl <= 2.0, int8
