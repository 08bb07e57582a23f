"""`enforce_eager=False`: the decoder through torch.compile (ref_engine/model/compile.py).

- compiled float32 is token-exact with eager float32 through every batched regime (chunked prefill,
  preemption by recompute and swap, prefix-cache hits, n-gram speculation), every block back to the pool;
- a bad value and a compiler that fails give one clear error naming `enforce_eager`.

The tiny model compiles in a few seconds, once per test process: every engine shares the compiled graphs.
"""

from __future__ import annotations

import pytest
from batched_regimes import BATCHED_REGIMES, regime_prompts

from ref_engine import LLM, LLMEngine, SamplingParams
from ref_engine.model.compile import CompileError
from ref_engine.model.loader import load_model


@pytest.fixture(scope="module")
def tiny(make_tiny_hf_model, device):
    return load_model(make_tiny_hf_model("llama", name="compile-llama"), device=device)


@BATCHED_REGIMES
def test_compiled_float32_is_token_exact_in_every_batched_regime(tiny, knobs):
    prompts = regime_prompts()
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    eager, compiled = (LLM(tiny, enforce_eager=enforce_eager, **knobs) for enforce_eager in (True, False))
    expected = [o.outputs[0].token_ids for o in eager.generate(prompts, params, use_tqdm=False)]
    got = [o.outputs[0].token_ids for o in compiled.generate(prompts, params, use_tqdm=False)]
    assert got == expected
    engine = compiled.llm_engine
    assert engine.scheduler.kv_cache_manager.block_pool.num_free_blocks == engine.num_kv_blocks
    assert sum(o.num_cached_tokens for o in compiled.generate(prompts[-4:], params, use_tqdm=False)) > 0
    if "num_kv_blocks" in knobs:
        assert engine.scheduler.num_preemptions > 0, "the pool was meant to be small enough to preempt"


def test_a_bad_value_names_the_knob():
    with pytest.raises(ValueError, match=r"enforce_eager must be True or False, got 'no'"):
        LLMEngine("/no/such/model.gguf", enforce_eager="no")


@pytest.mark.cpu_only(reason="breaks the C++ compiler inductor builds CPU kernels with (CUDA's are Triton's)")
def test_a_compiler_that_fails_names_the_knob_at_start(tiny, monkeypatch):
    import torch._dynamo
    import torch._inductor.config

    torch._dynamo.reset()  # forget the compiled graphs, so this engine compiles again
    monkeypatch.setattr(torch._inductor.config, "force_disable_caches", True)
    monkeypatch.setattr(torch._inductor.config.cpp, "cxx", ("/no/such/c++",))
    with pytest.raises(CompileError, match=r"torch.compile of the decoder failed \(.*\); pass enforce_eager=True"):
        LLMEngine(tiny, enforce_eager=False)
    torch._dynamo.reset()


def test_only_a_compiling_process_imports_dynamo():
    """The eager engine, its workers and the server never import torch._dynamo (~1.5 s a process): the
    compiled decoder wraps what it must call eagerly on its first compile (compile.EAGER), not at import."""
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys, ref_engine.engine, ref_engine.executor.multiproc_executor, "
            "ref_engine.entrypoints.openai.api_server, ref_engine.model.compile; "
            "print('torch._dynamo' in sys.modules)")
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr
