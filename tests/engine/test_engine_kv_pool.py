"""The engine sizes its KV pool as the simulator does: one rule (core/kv_sizing.py), fed by torch
measurements here (its worker's, ref_engine/worker/) and by a hardware profile and the model's dims there."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from core.config import EngineConfig
from core.kv_sizing import CPU_KV_CACHE_MEMORY
from ref_engine.engine import LLM, LLMEngine
from ref_engine.worker import parameter_bytes
from sim.hardware import HardwareProfile
from sim.simulator import Simulator, num_kv_blocks_for

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
    assert parameter_bytes(engine.runner.model) == engine.arch.weight_bytes(4)  # measured = the simulator's count
    for config in (engine.config, engine.config.replace(gpu_memory_utilization=0.5, max_num_batched_tokens=64)):
        monkeypatch.setattr(worker, "worker_config", replace(worker.worker_config, config=config))
        measured = worker.determine_num_kv_blocks()
        assert measured == num_kv_blocks_for(engine.arch, gpu, config, "float32")
        assert measured < config.gpu_memory_utilization * total // per_block(engine)


def test_a_pool_bigger_than_the_free_device_memory_is_refused(engine, monkeypatch):
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (10**6, 2 * 10**9))
    worker = engine.model_executor.driver_worker
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
