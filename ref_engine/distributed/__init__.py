"""Tensor parallelism's process group (vLLM's `distributed`): who this process is among the engine's ranks,
and the all-reduce the model's row-parallel layers end with.

Lesson: lessons/07-tuning-knobs.md#parallelism
"""

from ref_engine.distributed.communication_op import tensor_model_parallel_all_reduce
from ref_engine.distributed.parallel_state import (
    GroupCoordinator,
    destroy_distributed_environment,
    get_tp_group,
    init_distributed_environment,
)

__all__ = ["GroupCoordinator", "destroy_distributed_environment", "get_tp_group", "init_distributed_environment",
           "tensor_model_parallel_all_reduce"]
