"""Tensor parallelism on the engine (ref_engine/executor/, worker/, distributed/, model/linear.py).

- TP 2 and TP 4 on a tiny random Llama (4 attention heads, 2 KV heads: TP 2 splits the KV heads, TP 4 copies
  each to two ranks) and TP 3 on SmolLM2 (9 heads, 3 KV heads) give TP 1's greedy tokens through chunked
  prefill, preemption by swap, prefix-cache hits and n-gram speculation, and its logprobs within 1e-4 (the
  all-reduce sums the ranks' partial products in another order than one matmul does; measured: at most 4e-6
  on the tiny model, 1.3e-5 on SmolLM2). TP 4 (12 s: four processes on the course's two cores) and SmolLM2
  at TP 3 (30 s) run only with SERVING_LAB_LONG_TESTS=1; by default TP 4's split is checked on the weights
  each rank loads (which KV head it copies);
- the same workload through `UniProcExecutor` and `MultiprocExecutor` at TP 1 takes the same scheduler
  decisions step by step and gives the same tokens;
- a worker killed between steps makes the next step raise `ExecutorDeadError` naming its death (not the
  broken all-reduce its peer reports first, nor the timeout), and no worker survives (through a live server:
  tests/serving_lab/test_server_worker_death.py);
- each rank's KV pool is the simulator's for the same degree (core/kv_sizing.py);
- what cannot run is a ValueError that names the knob.

Each engine here starts real worker processes (about 2 s per rank on the course CPU), so the default tests
start three and keep the workloads small.
"""

from __future__ import annotations

import os
import signal

import pytest
import torch
from batched_regimes import regime_prompts

from core.config import EngineConfig, ParallelConfig
from core.kv_sizing import CPU_KV_CACHE_MEMORY
from ref_engine import LLM, SamplingParams
from ref_engine.executor import ExecutorDeadError
from ref_engine.kv_transfer.config import KVTransferConfig
from ref_engine.model.loader import load_model, quantized
from ref_engine.worker import Worker, WorkerConfig
from sim.hardware import HardwareProfile
from sim.simulator import num_kv_blocks_for

# chunked prefill (a 32-token budget, prompts of up to 53), preemption by swap (12 blocks for 16 requests),
# prefix-cache hits (regime_prompts' last four share a prefix) and n-gram speculation at any batch size, in
# one engine configuration (tests/batched_regimes.py has them one per engine: here each engine costs processes)
REGIMES = dict(max_num_batched_tokens=32, num_kv_blocks=12, max_num_seqs=16, preemption_mode="swap",
               num_swap_blocks=64, speculative_method="ngram", num_speculative_tokens=3,
               speculative_disable_by_batch_size=None)
GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, logprobs=2)
LOGPROB_TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def tiny(make_tiny_hf_model, device):
    return load_model(make_tiny_hf_model("llama", name="tp-llama"), device=device)


def skip_without_a_gpu_per_rank(device: str, tp: int) -> None:
    """On CUDA rank r runs on cuda:r (`rank_device`): `tp` ranks need as many GPUs."""
    if device == "cuda" and torch.cuda.device_count() < tp:
        pytest.skip(f"tensor_parallel_size={tp} on CUDA needs {tp} GPUs; this machine has {torch.cuda.device_count()}")


@pytest.fixture(scope="module")
def reference(tiny):
    """TP 1 in the engine's process: the tokens, logprobs and step records every other run must match."""
    llm = LLM(tiny, **REGIMES)
    return llm.generate(regime_prompts(), GREEDY, use_tqdm=False), llm.llm_engine.step_records


def run(model, **knobs):
    """The regimes' workload on a new engine; its outputs and step records, its workers stopped."""
    with LLM(model, **REGIMES, **knobs) as llm:
        return llm.generate(regime_prompts(), GREEDY, use_tqdm=False), llm.llm_engine


def assert_same_outputs(outputs, expected, tolerance: float = LOGPROB_TOLERANCE) -> None:
    assert [o.outputs[0].token_ids for o in outputs] == [e.outputs[0].token_ids for e in expected]
    for output, want in zip(outputs, expected):
        for got, ref in zip(output.outputs[0].logprobs, want.outputs[0].logprobs):
            assert got.keys() == ref.keys()
            assert max(abs(got[t] - ref[t]) for t in ref) <= tolerance, (got, ref)


def decisions(step_records):
    return [(r.request_ids, r.query_lens, r.context_lens, r.num_preempted, r.verified) for r in step_records]


@pytest.mark.parametrize("tp", [2, pytest.param(4, marks=[pytest.mark.slow, pytest.mark.long])],
                         ids=["tp2-kv-heads-split", "tp4-kv-heads-copied"])
def test_tensor_parallel_greedy_outputs_equal_tp1(tiny, reference, tp, device):
    skip_without_a_gpu_per_rank(device, tp)
    outputs, engine = run(tiny, tensor_parallel_size=tp, allow_cpu_oversubscription=True)
    expected, expected_steps = reference
    assert_same_outputs(outputs, expected)
    assert decisions(engine.step_records) == decisions(expected_steps)
    assert engine.scheduler.num_preemptions > 0 and any(r.verified for r in engine.step_records)
    assert sum(o.num_cached_tokens for o in outputs) > 0  # the shared prefixes hit the cache
    assert len(engine.model_executor.all_reduce_s) == tp  # every rank reported its all-reduce time


def test_uniproc_and_multiproc_executors_agree_at_tp1(tiny, reference):
    outputs, engine = run(tiny, distributed_executor_backend="mp")
    expected, expected_steps = reference
    assert decisions(engine.step_records) == decisions(expected_steps)
    assert_same_outputs(outputs, expected, tolerance=0.0)
    assert engine.runner is None  # the runner lives in the worker process, not beside the engine


def test_tp4_ranks_load_their_query_heads_and_copy_their_kv_head(tiny, device):
    """4 query heads and 2 KV heads over 4 ranks: rank r keeps query head r and KV head r // 2 (the one its
    query head reads), so ranks 0 and 1 hold the same K and V."""
    dim = tiny.arch.head_dim
    full = tiny.model.model.layers[0].self_attn.qkv_proj.weight  # [hidden, q | k | v]
    q_size, kv_size = tiny.arch.num_attention_heads * dim, tiny.arch.num_kv_heads * dim
    for rank in range(4):
        qkv = load_model(tiny.path, device=device, tp_rank=rank, tp_size=4).model.model.layers[0].self_attn.qkv_proj.weight
        q, k, v = qkv.split([dim, dim, dim], dim=1)
        kv_head = slice((rank // 2) * dim, (rank // 2 + 1) * dim)
        assert torch.equal(q, full[:, rank * dim:(rank + 1) * dim])
        assert torch.equal(k, full[:, q_size:q_size + kv_size][:, kv_head])
        assert torch.equal(v, full[:, q_size + kv_size:][:, kv_head])


def test_a_killed_worker_ends_the_executor_naming_its_death(tiny, device):
    skip_without_a_gpu_per_rank(device, 2)
    llm = LLM(tiny, **REGIMES, tensor_parallel_size=2)
    engine, executor = llm.llm_engine, llm.llm_engine.model_executor
    pids = executor.worker_pids
    engine.add_request("0", regime_prompts()[0], GREEDY)
    engine.step()
    os.kill(pids[1], signal.SIGKILL)
    with pytest.raises(ExecutorDeadError, match=r"worker 1 \(pid \d+\) died \(signal 9\)"):
        engine.step()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # stopped and reaped: no worker outlives the executor
    with pytest.raises(ExecutorDeadError, match="the executor is dead"):
        executor.execute_model(engine.scheduler.schedule(engine.now()))


@pytest.mark.cpu_only(reason="the CPU's fixed KV pool, against the local-cpu profile")
@pytest.mark.parametrize("tp", [1, 2])
def test_each_rank_holds_the_kv_pool_the_simulator_gives(tiny, tp):
    """A rank's pool from its share of the KV heads, by the core's rule: with kv_cache_memory, and on a CPU's
    fixed pool (sized on one rank's shard, in the engine's process: no process group needed)."""
    shard = load_model(tiny.path, device="cpu", tp_rank=0, tp_size=tp)
    for config in (EngineConfig(kv_cache_memory=3 << 20), EngineConfig()):
        config = config.for_model(tiny.arch.max_position_embeddings)
        worker = Worker(0, WorkerConfig(tiny.path, torch.float32, None, torch.float32, config,
                                        ParallelConfig(tensor_parallel_size=tp), torch.device("cpu")), model=shard)
        blocks = worker.determine_num_kv_blocks()
        assert blocks == num_kv_blocks_for(tiny.arch, HardwareProfile.named("local-cpu"), config, "float32",
                                           tensor_parallel_size=tp)
        memory = config.kv_cache_memory or CPU_KV_CACHE_MEMORY
        assert blocks == memory // tiny.arch.kv_bytes_per_block(config.block_size, 4, tp)  # 1 / tp of the heads


@pytest.mark.parametrize(("knobs", "message"), [
    (dict(tensor_parallel_size=3), r"tensor_parallel_size=3 does not split .* allowed: 1, 2, 4"),
    (dict(tensor_parallel_size=2, distributed_executor_backend="uni"), "distributed_executor_backend='uni'"),
    pytest.param(dict(tensor_parallel_size=4), r"tensor_parallel_size=4 is more ranks than this machine's 2 CPU "
                 "cores.*allow_cpu_oversubscription=True",
                 marks=pytest.mark.cpu_only(reason="ranks share the CPU's cores; a CUDA rank has a GPU of its own")),
    (dict(tensor_parallel_size=2, kv_transfer_config=KVTransferConfig(kv_role="kv_producer")),
     "kv_transfer_config .* tensor_parallel_size=2"),
], ids=["heads", "uni-backend", "cores", "disaggregation"])
def test_what_cannot_run_is_refused_naming_the_knob(tiny, monkeypatch, knobs, message):
    monkeypatch.setattr("ref_engine.executor.cpu_cores", lambda: 2)
    with pytest.raises(ValueError, match=message):
        LLM(tiny, **knobs)


@pytest.mark.cpu_only(reason="int8 runs on torch's CPU kernel (check_quantization refuses CUDA first)")
def test_quantization_is_refused_above_tp1(tiny):
    with pytest.raises(ValueError, match=r"quantization='int8' runs on one rank only.*tensor_parallel_size=2"):
        LLM(quantized(tiny, "int8"), tensor_parallel_size=2)


@pytest.mark.slow
@pytest.mark.long
def test_smollm2_at_tp3_gives_tp1s_greedy_tokens(smollm2, device):
    """9 heads and 3 KV heads over 3 ranks: one KV head each (the course machine has 2 cores: oversubscribed)."""
    skip_without_a_gpu_per_rank(device, 3)
    prompts = ["The capital of France is", "def fibonacci(n):", "Tensor parallelism splits"]
    params = SamplingParams(max_tokens=8, temperature=0.0, logprobs=2)
    expected = LLM(smollm2, num_kv_blocks=64).generate(prompts, params, use_tqdm=False)
    with LLM(smollm2, num_kv_blocks=64, tensor_parallel_size=3, allow_cpu_oversubscription=True) as llm:
        assert_same_outputs(llm.generate(prompts, params, use_tqdm=False), expected)
