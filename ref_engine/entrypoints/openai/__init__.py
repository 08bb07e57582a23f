"""The OpenAI-compatible server, in vLLM's layout: `protocol.py` (request bodies), `serving.py` (from a
request to engine requests and back, shared), `serving_completion.py`, `serving_chat.py`, `api_server.py`
(routes, keys, errors, startup and shutdown).

Lesson: lessons/06-architecture-map.md (the API server).
"""
