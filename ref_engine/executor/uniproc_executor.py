"""`UniProcExecutor`: one worker in the engine's own process (vLLM's name), tensor-parallel degree 1.

The default, and what the engine did before it had executors: the step is a method call, the logits never
leave the process, and an error in the model raises where it happened.

Lesson: lessons/06-architecture-map.md#the-boxes
"""

from __future__ import annotations

from typing import Any

from core.interfaces import SchedulerOutput
from ref_engine.executor.abstract import Executor
from ref_engine.model.loader import LoadedModel
from ref_engine.runner import ModelOutput
from ref_engine.worker.worker import Worker, WorkerConfig


class UniProcExecutor(Executor):
    def __init__(self, worker_config: WorkerConfig, model: LoadedModel) -> None:
        """`model`: the engine's loaded model, which the worker runs as it is."""
        self.driver_worker = Worker(0, worker_config, model=model)
        self.driver_worker.init_device()
        self.driver_worker.load_model()
        self.all_reduce_s = [0.0]

    def collective_rpc(self, method: str, args: tuple[Any, ...] = ()) -> list[Any]:
        return [getattr(self.driver_worker, method)(*args)]

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelOutput:
        return self.driver_worker.execute_model(scheduler_output).model_output

    def shutdown(self) -> None:
        self.driver_worker.shutdown()
