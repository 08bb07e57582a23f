"""The prefix cache's timing side channel, shown: a client whose prompt starts with what another client
sent gets it served from the cache, which both usage's `cached_tokens` and a much shorter time to first
token reveal. On a server without API keys (one tenant, as vLLM) that is by design: everyone shares. With
keys, tenants come from authentication only, so a second tenant never hits the first one's blocks, whatever
`user` either sends (the field a client chooses, which once named the tenant).

Robust on a noisy machine: the cached-token count is the exact signal; TTFT is compared only as medians of
a few tries with a 2x margin, on a prompt long enough (900 tokens on a model wide enough) that its prefill
dominates the time to first token.
"""

from __future__ import annotations

import json
import random
import statistics
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
import uvicorn
from live_server import free_port, wait_healthy

from ref_engine.async_engine.async_llm import AsyncLLM
from ref_engine.engine_core.core import EngineCoreArgs
from ref_engine.entrypoints.openai.api_server import build_app
from ref_engine.entrypoints.openai.tenants import ApiKey

TRIES = 3
PROMPT_LEN = 900  # the tiny models' tokenizer has one token per byte


@pytest.fixture(scope="module")
def wide(make_tiny_hf_model):
    """Wide and deep enough that a 900-token prefill takes far longer than one HTTP round trip."""
    return make_tiny_hf_model("llama", name="side-channel-llama", hidden_size=256, num_hidden_layers=4,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=64, intermediate_size=512,
                              max_position_embeddings=1024)


@contextmanager
def serving(model, api_keys: dict[str, ApiKey] | None, device: str) -> Iterator[str]:
    port = free_port()
    engine = AsyncLLM(EngineCoreArgs(str(model), device=device, num_threads=1, engine_kwargs={"num_kv_blocks": 512}))
    uv = uvicorn.Server(uvicorn.Config(build_app(engine, api_keys=api_keys), host="127.0.0.1", port=port,
                                       log_level="warning"))
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url)
        yield url
    finally:
        uv.should_exit = True
        thread.join(30)


def send(url: str, prompt: str, key: str | None, user: str) -> tuple[float, int]:
    """(seconds to the first streamed token, prompt tokens the cache served) of one completion."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = {"prompt": prompt, "max_tokens": 2, "ignore_eos": True, "user": user, "stream": True,
            "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    ttft, cached = None, None
    with httpx.stream("POST", f"{url}/v1/completions", json=body, headers=headers, timeout=60) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith('data: {"id"') and '"usage"' not in line and ttft is None:
                ttft = time.perf_counter() - start
            if '"usage": {' in line:
                cached = json.loads(line.removeprefix("data: "))["usage"]["prompt_tokens_details"]["cached_tokens"]
    return ttft, cached


def probe(url: str, victim_key: str | None, attacker_key: str | None) -> dict[str, list]:
    """Per try: a fresh long prompt sent by the victim, then by the attacker naming the victim's `user`."""
    rng = random.Random(0)
    result = {"victim_ttft": [], "victim_cached": [], "attacker_ttft": [], "attacker_cached": []}
    for _ in range(TRIES):
        prompt = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz ") for _ in range(PROMPT_LEN))
        for who, key in (("victim", victim_key), ("attacker", attacker_key)):
            ttft, cached = send(url, prompt, key, user="alice")
            result[f"{who}_ttft"].append(ttft)
            result[f"{who}_cached"].append(cached)
    return result


def test_a_shared_cache_reveals_another_clients_prompt_and_keyed_tenants_do_not(wide, device):
    with serving(wide, None, device) as url:
        send(url, "warm up", None, user="x")
        shared = probe(url, None, None)
    with serving(wide, {"key-a": ApiKey("acme"), "key-b": ApiKey("globex")}, device) as url:
        send(url, "warm up", "key-a", user="x")
        keyed = probe(url, "key-a", "key-b")
    block = 16
    assert shared["victim_cached"] == [0] * TRIES == keyed["victim_cached"]
    # the exact signal: across the shared cache every full block of the victim's prompt is served
    assert all(c >= (PROMPT_LEN // block - 1) * block for c in shared["attacker_cached"]), shared
    assert keyed["attacker_cached"] == [0] * TRIES, keyed  # another tenant, whatever `user` it sends
    # the timing signal, with a wide margin: a cached prompt starts far sooner
    shared_probe, shared_victim = (statistics.median(shared[k]) for k in ("attacker_ttft", "victim_ttft"))
    keyed_probe = statistics.median(keyed["attacker_ttft"])
    assert shared_probe < shared_victim / 2, shared
    assert keyed_probe > 2 * shared_probe, (keyed, shared)
