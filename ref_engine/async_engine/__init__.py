"""The engine as the API server's process sees it, as vLLM V1: `AsyncLLM` (`async_llm.py`), which gives every
request its own stream of outputs from the engine-core process (ref_engine/engine_core/), and the
Prometheus stat logger its outputs feed (`prometheus.py`).

Lesson: lessons/06-architecture-map.md (the engine core and the API server).
"""
