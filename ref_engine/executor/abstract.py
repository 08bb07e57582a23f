"""`Executor`: how the engine runs the model on its workers (vLLM's executor), and `ExecutorDeadError`.

The engine drives one executor whatever the parallelism: it asks the workers for the KV pool they can hold
(`determine_num_kv_blocks`: the smallest over the ranks), has them allocate it (`initialize_cache`), then
each step hands over the scheduler's output and gets rank 0's logits back (`execute_model`); `shutdown`
stops the workers. `UniProcExecutor` runs one worker in the engine's process (tensor-parallel degree 1, the
default); `MultiprocExecutor` runs one worker process per rank. Sampling stays in the engine's process,
which holds each request's random generator and logprobs.

Lesson: lessons/06-architecture-map.md#the-boxes
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

from core.interfaces import SchedulerOutput
from ref_engine.runner import ModelOutput

if TYPE_CHECKING:
    from ref_engine.worker.worker import Worker


class ExecutorDeadError(RuntimeError):
    """A worker died, stopped answering or failed in a step: the executor cannot run another step (its other
    workers are stopped too). The engine core then exits, and its server answers 503 and exits in turn, for
    whatever supervises it to start a new one (ref_engine/engine_core/core.py)."""


class Executor(ABC):
    """Runs the model on `tensor_parallel_size` workers. `all_reduce_s`: the seconds each rank spent in
    all-reduces during the last step (zeros at degree 1)."""

    all_reduce_s: list[float]
    driver_worker: Worker | None = None  # the worker in the engine's process, if one runs there ("uni")

    @abstractmethod
    def collective_rpc(self, method: str, args: tuple[Any, ...] = ()) -> list[Any]:
        """`Worker.<method>(*args)` on every rank, in rank order; their results."""

    @abstractmethod
    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelOutput:
        """Run one step on every rank; rank 0's logits, valid until the next call."""

    @abstractmethod
    def shutdown(self) -> None:
        """Stop the workers (idempotent)."""

    def determine_num_kv_blocks(self) -> int:
        """The KV blocks every rank can hold: the smallest of the ranks' pools."""
        return min(self.collective_rpc("determine_num_kv_blocks"))

    def initialize_cache(self, num_kv_blocks: int, num_swap_blocks: int) -> None:
        self.collective_rpc("initialize_cache", (num_kv_blocks, num_swap_blocks))
