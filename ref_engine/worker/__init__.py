"""One tensor-parallel rank of the engine: its device, its share of the model and KV cache, its model runner.

Lesson: lessons/06-architecture-map.md#the-boxes
"""

from ref_engine.worker.worker import Worker, WorkerConfig, WorkerInfo, WorkerOutput, parameter_bytes

__all__ = ["Worker", "WorkerConfig", "WorkerInfo", "WorkerOutput", "parameter_bytes"]
