"""`Worker`: one tensor-parallel rank of the engine: its device, its share of the model, its KV cache, its runner.

vLLM's worker, cut to what one rank needs. An executor (ref_engine/executor/) drives every worker through the
same calls, in the engine's process (`UniProcExecutor`) or in a process of its own (`MultiprocExecutor`):

1. `init_device`: set its process's float32 matmul precision (TF32 or not); join the engine's process group above
   degree 1 (ref_engine/distributed/);
2. `load_model`: its share of the weights (ref_engine/model/linear.py). A worker process loads the model file
   itself and keeps its slice; the worker in the engine's process takes the engine's own model;
3. `determine_num_kv_blocks`: the KV pool it can hold, by the core's rule (core/kv_sizing.py), from its own
   device memory, its own weights, its share of the KV heads and, on a GPU, the peak of one dummy step at
   the largest batch (`profile_activation_bytes`, vLLM's profiling run); rank 0 also counts a draft model's
   pool and weights, which live beside it. The executor takes the smallest over the ranks (vLLM does the
   same), which is what the scheduler hands out;
4. `initialize_cache`: allocate that pool and build its `ModelRunner` (compiling the model if asked);
5. `execute_model`, every step: each rank runs the whole batch on its heads; rank 0 also runs the LM head.

Lesson: lessons/06-architecture-map.md#the-boxes
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from core.config import EngineConfig, ParallelConfig
from core.interfaces import ScheduledRequest, SchedulerOutput
from core.kv_sizing import DraftFootprint, num_kv_blocks
from core.math_utils import cdiv
from ref_engine.cuda_graphs import capture_sizes
from ref_engine.distributed.parallel_state import (
    destroy_distributed_environment,
    get_tp_group,
    init_distributed_environment,
    rank_device,
)
from ref_engine.model.loader import LoadedModel, load_model, set_float32_matmul_precision
from ref_engine.runner import ModelOutput, ModelRunner


@dataclass(frozen=True)
class WorkerConfig:
    """What every rank builds its share from. Picklable: it crosses into the worker processes."""

    model_path: Path | None  # the checkpoint a worker process loads (None: in-process only, given the model)
    dtype: torch.dtype  # the weights'
    quantization: str | None
    kv_cache_dtype: torch.dtype
    config: EngineConfig  # settled for the model (`for_model`)
    parallel_config: ParallelConfig
    device: torch.device  # the engine's: rank r of an engine on cuda:i runs on cuda:i+r (`rank_device`)
    enforce_eager: bool = True
    float32_matmul_precision: str = "highest"  # "high": TF32 on CUDA, set in each worker's process
    draft: DraftFootprint | None = None  # a draft model's, run beside rank 0 on its device (spec_decode.py)


@dataclass(frozen=True)
class WorkerInfo:
    """What a worker reports once its model is loaded."""

    rank: int
    pid: int
    model_id: str
    weights_digest: str
    weight_bytes: int  # its share, as loaded
    num_threads: int  # torch's intra-op threads in its process


@dataclass
class WorkerOutput:
    """One rank's answer to a step."""

    model_output: ModelOutput  # rank 0's holds the logits; the other ranks' logits are None
    all_reduce_s: float = 0.0  # wall time inside this step's all-reduces (`GroupCoordinator`)
    num_all_reduces: int = 0


class Worker:
    def __init__(self, rank: int, worker_config: WorkerConfig, distributed_init_method: str | None = None,
                 model: LoadedModel | None = None) -> None:
        """`distributed_init_method`: where the ranks meet (above degree 1); `model`: the engine's loaded
        model, for a worker in the engine's process (else `load_model` loads `worker_config.model_path`)."""
        self.rank = rank
        self.worker_config = worker_config
        self.tp_size = worker_config.parallel_config.tensor_parallel_size
        self.device = rank_device(worker_config.device, rank)
        self.distributed_init_method = distributed_init_method
        self.loaded = model
        self.model_runner: ModelRunner | None = None

    def init_device(self) -> None:
        set_float32_matmul_precision(self.worker_config.float32_matmul_precision, self.device)
        if self.tp_size > 1:
            init_distributed_environment(self.rank, self.tp_size, self.distributed_init_method, self.device)

    def load_model(self) -> WorkerInfo:
        if self.loaded is None:
            c = self.worker_config
            self.loaded = load_model(c.model_path, c.dtype, self.device, c.quantization, tp_rank=self.rank,
                                     tp_size=self.tp_size)
        return WorkerInfo(self.rank, os.getpid(), self.loaded.model_id, self.loaded.weights_digest,
                          parameter_bytes(self.loaded.model), torch.get_num_threads())

    def determine_num_kv_blocks(self) -> int:
        """This rank's KV pool by the core's rule (`kv_sizing.num_kv_blocks`), from what torch measures here:
        on a GPU its memory, this rank's weights and the activation peak of the largest step
        (`profile_activation_bytes`); a CPU has no device memory to profile, so its pool is fixed by the rule
        and the activation estimate (`ArchConfig.peak_activation_bytes`) only fills the slot. Rank 0 counts
        the draft model beside it: the draft's blocks share the target's ids, one for one."""
        config, arch = self.worker_config.config, self.loaded.arch
        per_block = arch.kv_bytes_per_block(config.block_size, self.worker_config.kv_cache_dtype.itemsize,
                                            self.tp_size)
        draft = self.worker_config.draft if self.rank == 0 else None
        free = device_memory = None
        if self.device.type == "cuda":
            activation_bytes = self.profile_activation_bytes()
            free, device_memory = cuda_memory_info(self.device)
        else:
            dtype_bytes = next(self.loaded.model.parameters()).dtype.itemsize
            activation_bytes = arch.peak_activation_bytes(config.max_num_batched_tokens, config.max_num_seqs,
                                                          dtype_bytes)
        blocks = num_kv_blocks(config, per_block, device_memory=device_memory,
                               weight_bytes=parameter_bytes(self.loaded.model), activation_bytes=activation_bytes,
                               model=self.loaded.model_id, draft=draft)
        pool_bytes = blocks * (per_block + (draft.bytes_per_block if draft else 0))
        if free is not None and pool_bytes > free:  # other processes hold part of the device
            raise ValueError(f"a KV pool of {blocks} blocks needs {pool_bytes / 2**30:.2f} GiB, but only "
                             f"{free / 2**30:.2f} GiB of {self.device} are free; lower gpu_memory_utilization "
                             "or set kv_cache_memory or num_kv_blocks")
        return blocks

    def profile_activation_bytes(self) -> int:
        """vLLM's profiling run, on a CUDA device: the peak memory of one dummy step at the largest batch
        (`dummy_batch`), above what was allocated before it (the weights, and the few blocks the step
        writes). It measures what `ArchConfig.peak_activation_bytes` leaves out: dtype-conversion copies,
        the attention's score matrix, the allocator's buffers, and the decode gathers of one-token rows."""
        c = self.worker_config
        batch = dummy_batch(c.config.max_num_batched_tokens, c.config.max_num_seqs, c.config.block_size,
                            c.config.max_model_len)
        runner = ModelRunner(
            self.loaded.model, self.loaded.arch, num_kv_blocks=sum(len(s.block_ids) for s in batch.scheduled),
            num_swap_blocks=0, block_size=c.config.block_size, dtype=c.kv_cache_dtype, device=self.device,
            tensor_parallel_size=self.tp_size, compute_logits=self.rank == 0)
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        before = torch.cuda.memory_allocated(self.device)
        runner.execute_model(batch)
        torch.cuda.synchronize(self.device)
        return torch.cuda.max_memory_allocated(self.device) - before

    def initialize_cache(self, num_kv_blocks: int, num_swap_blocks: int) -> int:
        """Allocate the KV pool (and its host pool for swapping) and build the runner; returns the pool's bytes."""
        c = self.worker_config
        self.model_runner = ModelRunner(
            self.loaded.model, self.loaded.arch, num_kv_blocks=num_kv_blocks, num_swap_blocks=num_swap_blocks,
            block_size=c.config.block_size, dtype=c.kv_cache_dtype, device=self.device,
            enforce_eager=c.enforce_eager, tensor_parallel_size=self.tp_size, compute_logits=self.rank == 0,
            cudagraph_capture_sizes=capture_sizes(c.config.cudagraph_capture_sizes, c.config.max_num_seqs),
            max_model_len=c.config.max_model_len)
        return sum(t.numel() * t.element_size() for t in self.model_runner.kv_caches)

    def execute_model(self, scheduler_output: SchedulerOutput) -> WorkerOutput:
        model_output = self.model_runner.execute_model(scheduler_output)
        if self.tp_size == 1:
            return WorkerOutput(model_output)
        return WorkerOutput(model_output, *get_tp_group().take_all_reduce_stats())

    def shutdown(self) -> None:
        """Leave the process group and drop the runner (its KV pools) and the model, so that their memory can
        go to the next engine in this process. Idempotent."""
        destroy_distributed_environment()
        self.model_runner = self.loaded = None


def dummy_batch(num_tokens: int, num_seqs: int, block_size: int, max_model_len: int) -> SchedulerOutput:
    """The largest step a config allows, for the profiling run: `num_tokens` prompt tokens (id 0) spread
    evenly over `num_seqs` new requests (fewer if there are fewer tokens), each sampled, in blocks of their
    own; no longer than `max_model_len` each, as the scheduler would cut them."""
    num_tokens = min(num_tokens, num_seqs * max_model_len)
    num_seqs = min(num_seqs, num_tokens)
    lengths = [num_tokens // num_seqs + (i < num_tokens % num_seqs) for i in range(num_seqs)]
    scheduled, next_block = [], 0
    for i, n in enumerate(lengths):
        blocks = list(range(next_block, next_block + cdiv(n, block_size)))
        next_block += len(blocks)
        scheduled.append(ScheduledRequest(f"profile-{i}", [0] * n, 0, blocks, needs_logits=True))
    return SchedulerOutput(step_id=-1, scheduled=scheduled)


def cuda_memory_info(device: torch.device) -> tuple[int, int]:
    """(free, total) bytes of a CUDA device for this process's next KV pool. Free counts what torch's caching
    allocator holds but no tensor uses (reserved - allocated): `mem_get_info` sees it as taken, yet this
    process can have it, e.g. the pool of an engine dropped without `shutdown`."""
    free, total = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device), total


def parameter_bytes(model: torch.nn.Module) -> int:
    """Bytes the model's weights take on its device, as loaded (a tied embedding counts once)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())
