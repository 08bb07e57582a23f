"""The engine sizes its KV pool as the simulator does: one rule (core/kv_sizing.py), fed by torch
measurements here (its worker's, ref_engine/worker/) and by a hardware profile and the model's dims there."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from core.config import EngineConfig
from core.kv_sizing import CPU_KV_CACHE_MEMORY, DraftFootprint
from ref_engine.engine import LLM, LLMEngine
from ref_engine.runner import ModelRunner
from ref_engine.worker import parameter_bytes
from ref_engine.worker import worker as worker_module
from ref_engine.worker.worker import dummy_batch
from sim.hardware import HardwareProfile
from sim.simulator import Simulator, num_kv_blocks_for
from sim.spec_decode import AcceptanceRate

pytestmark = pytest.mark.cpu_only(reason="a CPU engine: its fixed pool, and the GPU path with torch's memory "
                                         "queries faked around it")


@pytest.fixture(scope="module")
def engine(make_tiny_hf_model):
    """A tiny engine on the CPU, with its default (unset) pool size."""
    return LLMEngine(make_tiny_hf_model("llama", name="kv-sizing"), dtype="float32", device="cpu",
                     max_num_seqs=8)


def per_block(engine: LLMEngine) -> int:
    return engine.arch.kv_bytes_per_block(engine.config.block_size, 4)  # float32


def test_on_a_cpu_engine_and_simulator_give_the_same_fixed_pool(engine):
    simulated = num_kv_blocks_for(engine.arch, HardwareProfile.named("local-cpu"), engine.config, "float32")
    assert engine.num_kv_blocks == simulated == CPU_KV_CACHE_MEMORY // per_block(engine)


def test_on_a_gpu_engine_and_simulator_give_the_same_pool_for_the_same_memory(engine, monkeypatch):
    """The engine's GPU path, with torch's memory query answered as a 2 GB device would answer it."""
    total = 2 * 10**9
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (total - 10**8, total))
    worker = engine.model_executor.driver_worker
    monkeypatch.setattr(worker, "device", torch.device("cuda"))
    gpu = HardwareProfile.named("h100-sxm")
    gpu = HardwareProfile(name="2 GB GPU", peak_flops=gpu.peak_flops, memory_bandwidth=gpu.memory_bandwidth,
                          memory_bytes=total)
    # the profiling run measures what the simulator estimates (their difference is the activations' error)
    monkeypatch.setattr(worker, "profile_activation_bytes", lambda: engine.arch.peak_activation_bytes(
        worker.worker_config.config.max_num_batched_tokens, worker.worker_config.config.max_num_seqs, 4))
    assert parameter_bytes(engine.runner.model) == engine.arch.weight_bytes(4)  # measured = the simulator's count
    for config in (engine.config, engine.config.replace(gpu_memory_utilization=0.5, max_num_batched_tokens=64)):
        monkeypatch.setattr(worker, "worker_config", replace(worker.worker_config, config=config))
        measured = worker.determine_num_kv_blocks()
        assert measured == num_kv_blocks_for(engine.arch, gpu, config, "float32")
        assert measured < config.gpu_memory_utilization * total // per_block(engine)


def test_a_pool_bigger_than_the_free_device_memory_is_refused(engine, monkeypatch):
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (10**6, 2 * 10**9))
    worker = engine.model_executor.driver_worker
    monkeypatch.setattr(worker, "profile_activation_bytes", lambda: 10**6)
    monkeypatch.setattr(worker, "device", torch.device("cuda"))
    with pytest.raises(ValueError, match="lower gpu_memory_utilization"):
        worker.determine_num_kv_blocks()


def test_memory_the_caching_allocator_holds_unused_counts_as_free(engine, monkeypatch):
    """A dropped engine's pool stays reserved by torch's allocator: mem_get_info calls it taken, the next
    pool may have it (reserved - allocated)."""
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (10**6, 2 * 10**9))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 15 * 10**8)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 10**8)
    worker = engine.model_executor.driver_worker
    monkeypatch.setattr(worker, "device", torch.device("cuda"))
    monkeypatch.setattr(worker, "profile_activation_bytes", lambda: 10**6)
    monkeypatch.setattr(worker, "worker_config",
                        replace(worker.worker_config, config=engine.config.replace(gpu_memory_utilization=0.5)))
    assert worker.determine_num_kv_blocks() > 0


def test_shutdown_frees_the_pool_and_a_closed_engine_takes_no_requests(make_tiny_hf_model, monkeypatch):
    emptied = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(True))
    with LLM(make_tiny_hf_model("llama", name="kv-shutdown"), device="cpu", num_kv_blocks=16) as llm:
        engine = llm.llm_engine
        assert llm.generate("hi", use_tqdm=False)[0].finished
    assert engine.runner is None and engine.proposer is None
    assert not emptied  # only a CUDA engine gives cached memory back
    with pytest.raises(RuntimeError, match="shut down"):
        llm.generate("hi", use_tqdm=False)
    engine.device = torch.device("cuda")
    llm.shutdown()  # idempotent
    assert emptied


def test_engine_and_simulator_size_the_same_swap_pool(make_tiny_hf_model):
    config = dict(num_kv_blocks=16, preemption_mode="swap", swap_space=0.01)
    engine = LLMEngine(make_tiny_hf_model("llama", name="kv-swap"), dtype="float32", device="cpu", **config)
    simulated = Simulator(engine.arch, "local-cpu", EngineConfig(**config), dtype="float32")
    assert engine.scheduler.num_swap_blocks == simulated.config.num_swap_blocks == 0.01 * 2**30 // per_block(engine)
    assert len(engine.runner.host_kv_caches[0][0]) == engine.scheduler.num_swap_blocks


def fake_cuda_device(monkeypatch, worker, total: int) -> None:
    """The worker's sizing answered as on an empty CUDA device of `total` bytes."""
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (total, total))
    monkeypatch.setattr(worker, "device", torch.device("cuda"))


@pytest.fixture(scope="module")
def draft_engine(make_tiny_hf_model):
    """A tiny target with a smaller draft model of its own file (so its weights are its own)."""
    target = make_tiny_hf_model("llama", name="kv-target")
    draft = make_tiny_hf_model("llama", name="kv-draft", num_hidden_layers=1, num_key_value_heads=1)
    return LLMEngine(target, dtype="float32", device="cpu", kv_cache_memory=2**20,
                     speculative_method="draft_model", speculative_model=str(draft))


def all_kv_bytes(engine: LLMEngine) -> int:
    return sum(t.numel() * t.element_size() for t in (*engine.runner.kv_caches, *engine.proposer.runner.kv_caches))


def test_a_draft_models_pool_and_weights_count_against_the_gpu(draft_engine, monkeypatch):
    """Target and draft pools (one block id each) and both weights fit the utilisation share together."""
    total, activations = 4 * 10**7, 10**6
    worker = draft_engine.model_executor.driver_worker
    fake_cuda_device(monkeypatch, worker, total)
    monkeypatch.setattr(worker, "profile_activation_bytes", lambda: activations)
    config = draft_engine.config.replace(kv_cache_memory=None)
    draft = worker.worker_config.draft
    draft_weights = parameter_bytes(draft_engine.proposer.runner.model)
    draft_block = sum(t[:, 0].numel() * t.element_size() for t in draft_engine.proposer.runner.kv_caches)
    assert draft == DraftFootprint(draft_block, draft_weights) and draft_weights > 0
    monkeypatch.setattr(worker, "worker_config", replace(worker.worker_config, config=config))
    joint = worker.determine_num_kv_blocks()
    monkeypatch.setattr(worker, "worker_config", replace(worker.worker_config, draft=None))
    target_only = worker.determine_num_kv_blocks()
    budget = config.gpu_memory_utilization * total - activations - parameter_bytes(worker.loaded.model) - draft_weights
    assert joint * (per_block(draft_engine) + draft.bytes_per_block) <= budget
    assert (joint + 1) * (per_block(draft_engine) + draft.bytes_per_block) > budget  # and no smaller than that
    assert joint < target_only


def test_a_draft_models_pool_counts_against_kv_cache_memory_on_a_cpu(draft_engine):
    draft_per_block = draft_engine.model_executor.driver_worker.worker_config.draft.bytes_per_block
    assert draft_engine.num_kv_blocks == 2**20 // (per_block(draft_engine) + draft_per_block)
    assert len(draft_engine.proposer.runner.kv_caches[0][0]) == draft_engine.num_kv_blocks  # ids one for one
    assert all_kv_bytes(draft_engine) <= 2**20


def test_engine_and_simulator_size_a_draft_models_pool_alike(draft_engine):
    simulated = Simulator(draft_engine.arch, "local-cpu", draft_engine.config, dtype="float32",
                          draft_arch=replace(draft_engine.arch, num_layers=1, num_kv_heads=1),  # the draft's dims
                          acceptance=AcceptanceRate((0.5,)))
    assert simulated.num_kv_blocks == draft_engine.num_kv_blocks


def test_on_a_gpu_the_activations_are_measured_in_a_dummy_step_at_the_largest_batch(engine, monkeypatch):
    """The profiling run's arithmetic (the peak above what was allocated before the step), its batch, and
    that only a CUDA worker runs it: a CPU keeps the estimate."""
    worker = engine.model_executor.driver_worker
    sizing = []
    monkeypatch.setattr(worker_module, "num_kv_blocks", lambda *args, **kw: sizing.append(kw) or 16)
    monkeypatch.setattr(worker, "profile_activation_bytes", lambda: pytest.fail("profiled on a CPU"))
    worker.determine_num_kv_blocks()
    config = engine.config
    assert sizing[-1]["activation_bytes"] == engine.arch.peak_activation_bytes(config.max_num_batched_tokens,
                                                                               config.max_num_seqs, 4)
    monkeypatch.undo()

    calls, steps = [], []
    monkeypatch.setattr(worker_module, "num_kv_blocks", lambda *args, **kw: sizing.append(kw) or 16)
    fake_cuda_device(monkeypatch, worker, 2 * 10**9)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append("sync"))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: calls.append("reset"))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 7 * 10**6)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: calls.append("peak") or 9 * 10**6)

    class CPURunner(ModelRunner):  # the dummy step really runs, on the CPU, as the fake device's would
        def __init__(self, *args, **kw):
            super().__init__(*args, **{**kw, "device": torch.device("cpu")})

        def execute_model(self, output):
            calls.append("step")
            steps.append(output)
            return super().execute_model(output)

    monkeypatch.setattr(worker_module, "ModelRunner", CPURunner)
    worker.determine_num_kv_blocks()
    assert sizing[-1]["activation_bytes"] == 2 * 10**6
    assert calls == ["sync", "reset", "step", "sync", "peak"]
    [step] = steps
    assert sum(s.num_scheduled_tokens for s in step.scheduled) == config.max_num_batched_tokens
    assert len(step.scheduled) == config.max_num_seqs and all(s.needs_logits for s in step.scheduled)


def test_the_dummy_batch_spreads_the_tokens_over_the_sequences_in_blocks_of_their_own():
    batch = dummy_batch(10, 4, block_size=2, max_model_len=64)
    assert [s.num_scheduled_tokens for s in batch.scheduled] == [3, 3, 2, 2]
    assert [s.block_ids for s in batch.scheduled] == [[0, 1], [2, 3], [4], [5]]
    assert [s.num_scheduled_tokens for s in dummy_batch(3, 8, block_size=16, max_model_len=64).scheduled] == [1, 1, 1]
    assert [s.num_scheduled_tokens for s in dummy_batch(512, 2, block_size=16, max_model_len=64).scheduled] == [64, 64]
