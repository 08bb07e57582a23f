"""The serving engine in two processes, as vLLM V1: an engine-core process running the busy loop
(`core.py`), and in the API server's process its client (`core_client.py`) and `AsyncLLM`
(`async_llm.py`), which gives every request its own stream of outputs.

Lesson: lessons/06-architecture-map.md (the engine core and the API server).
"""
