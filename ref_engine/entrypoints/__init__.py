"""Ways into the engine from outside the process: the OpenAI-compatible HTTP server (`openai/`).

Lesson: lessons/06-architecture-map.md (the API server).
"""
