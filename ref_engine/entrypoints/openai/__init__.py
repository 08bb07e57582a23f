"""The OpenAI-compatible server, in vLLM's layout: `protocol.py` (request bodies), `serving.py` (from a
request to engine requests and back, shared), `serving_completion.py`, `serving_chat.py`; the web app as
routers over typed state: `openai_routes.py` (the OpenAI API), `ops_routes.py` (health, metrics, cache
reset, traces), `server_state.py` (`ServerState` on `app.state`: readiness, keys, failures),
`errors.py`, `middleware.py`; `api_server.py` (the app, startup, the drain, `serving-lab serve`).

Lesson: lessons/06-architecture-map.md (the API server).
"""
