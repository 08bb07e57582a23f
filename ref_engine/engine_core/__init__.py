"""The engine core, as vLLM V1 has it: one `EngineCore` busy loop around one `LLMEngine`, in a process of its
own (`core.py`), one vocabulary of messages (`messages.py`), and two kinds of client (`client.py`): the API
server's asynchronous `AsyncMPClient` and the blocking `SyncMPClient` the disaggregation router drives two
cores with.

Lesson: lessons/06-architecture-map.md (the engine core and the API server).
"""
