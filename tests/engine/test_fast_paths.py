"""The engine's fast numeric paths beside the float32 reference: int8 weight-only
(ref_engine/model/quantization.py), int4 weight-only (ref_engine/model/int4.py),
bfloat16 and float16 weights, and a bfloat16 or float16 KV cache under float32 weights (`kv_cache_dtype`,
ref_engine/attention.py).

- each runs every batched regime (chunked prefill, preemption by recompute and swap, prefix-cache hits,
  speculation), every request to its last token and every block back to the pool;
- each stays within the quality bounds stated for it on SmolLM2's eval set (serving_lab/eval_set.py), bounds
  set from its measured cost (benchmarks/RESULTS.md, "Engine speed" and "Where a step's time goes") and far
  from what a broken path gives (KL of several nats, agreement near 0).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch
from batched_regimes import BATCHED_REGIMES, regime_prompts

from ref_engine import LLM, SamplingParams
from ref_engine.model.int4 import has_int4_kernel
from ref_engine.model.loader import load_model, quantized
from serving_lab.eval_set import compare_quality, eval_prompts


@dataclass(frozen=True)
class FastPath:
    load: dict = field(default_factory=dict)  # load_model's numerics
    kv_cache_dtype: str = "auto"  # the engine's
    min_agreement: float = 0.0  # greedy agreement with float32, 4 eval prompts x 16 tokens
    max_kl: float = 0.0  # mean KL(float32 || path), nats per token


PATHS = {
    # measured: agreement 0.75-0.83, KL 0.003-0.004 (4 and 16 prompts; W8A8 with one activation scale per
    # call had 0.14-0.36 and 0.47-0.60). Greedy texts part after near-ties, as bfloat16 weights' do
    "int8": FastPath(load={"quantization": "int8"}, min_agreement=0.5, max_kl=0.02),
    # measured: agreement 1.0, KL 0.0002-0.0004 (4, 8 and 16 prompts): the file's own 4-bit weights, so only bfloat16
    # activations and bfloat16 scales differ from the float32 reference (which dequantizes the same blocks)
    "int4": FastPath(load={"quantization": "int4"}, min_agreement=0.9, max_kl=0.02),
    # measured: agreement 0.71-0.98, KL 0.001
    "bfloat16-weights": FastPath(load={"dtype": "bfloat16"}, min_agreement=0.3, max_kl=0.05),
    # measured: agreement 0.97-1.0, KL 2.1e-5 to 2.8e-5 (this case: 1.0 and 2.1e-5)
    "bfloat16-kv-cache": FastPath(kv_cache_dtype="bfloat16", min_agreement=0.5, max_kl=0.01),
    # float16 keeps 11 significant bits to bfloat16's 8, and SmolLM2's activations stay within its range.
    # measured: agreement 1.0, KL 1.4e-5 (this case; 16 prompts: 1.0, 1.7e-5); bfloat16 weights here: 0.98, 9.5e-4
    "float16-weights": FastPath(load={"dtype": "float16"}, min_agreement=0.9, max_kl=0.001),
    # measured: agreement 1.0, KL 3.3e-7 (this case)
    "float16-kv-cache": FastPath(kv_cache_dtype="float16", min_agreement=0.9, max_kl=0.001),
}


def runnable(name: str) -> object:
    lacks_kernel = name == "int4" and not has_int4_kernel(torch.device("cpu"))
    marks = [pytest.mark.skipif(lacks_kernel, reason="int4 runs on torch's CPU int4 kernel "
                                                     "(aten._weight_int4pack_mm_for_cpu); this torch lacks it")]
    if "quantization" in PATHS[name].load:
        marks.append(pytest.mark.cpu_only(reason="int8 and int4 run on torch's CPU kernels (check_quantization "
                                                 "refuses CUDA)"))
    return pytest.param(name, marks=marks)


@pytest.fixture(scope="module")
def tiny_folder(make_tiny_hf_model):
    return make_tiny_hf_model("llama", name="fast-paths-llama")


@BATCHED_REGIMES
@pytest.mark.parametrize("name", [runnable(n) for n in PATHS])
def test_a_fast_path_runs_every_batched_regime_to_the_last_token(tiny_folder, name, knobs, device):
    path = PATHS[name]
    prompts = regime_prompts()
    llm = LLM(load_model(tiny_folder, device=device, **path.load), kv_cache_dtype=path.kv_cache_dtype, **knobs)
    outputs = llm.generate(prompts, SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True), use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outputs] == [24] * len(prompts)
    engine = llm.llm_engine
    assert engine.scheduler.kv_cache_manager.block_pool.num_free_blocks == engine.num_kv_blocks
    if "num_kv_blocks" in knobs:
        assert engine.scheduler.num_preemptions > 0, "the pool was meant to be small enough to preempt"


@pytest.mark.slow
def test_the_eval_metrics_are_exact_on_the_reference_against_itself(smollm2):
    [itself] = compare_quality(smollm2, [smollm2], eval_prompts(2), max_tokens=8)
    assert (itself.agreement, itself.mean_kl) == (1.0, 0.0)


@pytest.mark.slow
@pytest.mark.parametrize("name", [runnable(n) for n in PATHS])
def test_a_fast_path_stays_within_its_quality_bounds_on_smollm2(smollm2, smollm2_path, name, device):
    path = PATHS[name]
    if "quantization" in path.load:  # a quantized copy: no second dequantization of the GGUF
        candidate = quantized(smollm2, path.load["quantization"])
    else:
        candidate = load_model(smollm2_path, device=device, **path.load) if path.load else smollm2
    [quality] = compare_quality(smollm2, [candidate], eval_prompts(4), max_tokens=16,
                                kv_cache_dtype=path.kv_cache_dtype)
    print(name, quality)
    assert quality.agreement >= path.min_agreement and 0 < quality.mean_kl <= path.max_kl, quality
