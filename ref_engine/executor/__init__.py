"""Executors: how the engine runs its model on one or more workers (vLLM's `executor`), and `make_executor`,
which picks one for a `ParallelConfig` after checking that the model and the machine can run it.

Lesson: lessons/06-architecture-map.md#the-boxes
"""

from __future__ import annotations

import logging

import torch

from core.config import ParallelConfig
from ref_engine.distributed.parallel_state import cpu_cores
from ref_engine.executor.abstract import Executor, ExecutorDeadError
from ref_engine.executor.multiproc_executor import MultiprocExecutor
from ref_engine.executor.uniproc_executor import UniProcExecutor
from ref_engine.model.loader import LoadedModel, check_tensor_parallel_quantization
from ref_engine.worker.worker import WorkerConfig

__all__ = ["Executor", "ExecutorDeadError", "MultiprocExecutor", "UniProcExecutor", "make_executor"]

logger = logging.getLogger(__name__)


def make_executor(worker_config: WorkerConfig, model: LoadedModel) -> Executor:
    """The executor `worker_config.parallel_config` names, for `model` (the engine's). A ValueError names the
    knob when the model cannot be split that way (its heads, a quantized model) or the machine cannot run that
    many ranks: more GPUs than it has, or more CPU ranks than cores unless `allow_cpu_oversubscription`."""
    parallel = worker_config.parallel_config
    parallel.verify_with_model(model.arch)
    check_tensor_parallel_quantization(model.quantization, parallel.tensor_parallel_size)
    _check_machine(parallel, worker_config.device)
    if parallel.distributed_executor_backend == "uni":
        return UniProcExecutor(worker_config, model)
    return MultiprocExecutor(worker_config, model)


def _check_machine(parallel: ParallelConfig, device: torch.device) -> None:
    tp = parallel.tensor_parallel_size
    if device.type == "cuda":
        if (device.index or 0) + tp > torch.cuda.device_count():
            raise ValueError(f"tensor_parallel_size={tp} runs one rank per GPU from {device} on, and this machine "
                             f"has {torch.cuda.device_count()}")
        return
    cores = cpu_cores()
    if tp <= cores:
        return
    if not parallel.allow_cpu_oversubscription:
        raise ValueError(f"tensor_parallel_size={tp} is more ranks than this machine's {cores} CPU cores: they would "
                         f"take turns on the cores, and every all-reduce would wait for a rank that is not running; "
                         f"allowed: 1 to {cores}, or set allow_cpu_oversubscription=True (`serving-lab serve` and "
                         f"`generate`: --allow-cpu-oversubscription) to run it anyway")
    logger.warning("tensor_parallel_size=%d on %d CPU cores (allow_cpu_oversubscription): ranks share cores and "
                   "each all-reduce waits for the rank that is not running", tp, cores)
