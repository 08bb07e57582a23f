"""The OpenAI-compatible server, live on 127.0.0.1, against the official `openai` client (tiny model).

One server (and one engine-core process) serves the whole module. Its engine's sampler raises for requests
with `min_p=POISON_MIN_P` (tests/engine_core_faults.py), to show one failing request fails alone.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time

import httpx
import openai
import pytest
import uvicorn
import yaml
from engine_core_faults import POISON_MIN_P, SLOW_MIN_P, PoisonedEngineArgs
from live_server import free_port, wait_healthy

from ref_engine import LLM, SamplingParams
from ref_engine.async_engine.async_llm import AsyncLLM
from ref_engine.entrypoints.openai.api_server import build_app
from ref_engine.entrypoints.openai.tenants import ApiKey
from serving_lab import cli
from serving_lab.manifest import EXAMPLE_MANIFEST

KEYS = {"key-acme": ApiKey("acme"), "key-globex": ApiKey("globex"), "key-ops": ApiKey("ops", admin=True)}
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")
MAX_PENDING = 64
MAX_BODY = 32 * 1024
MODEL = "tiny"


@pytest.fixture(scope="module")
def tiny(make_tiny_hf_model):
    return make_tiny_hf_model("llama", name="server-llama")


@pytest.fixture(scope="module")
def server(tiny, device):
    """(base URL, the first /health response while the engine was loading)."""
    port = free_port()
    engine = AsyncLLM(PoisonedEngineArgs(str(tiny), device=device, num_threads=1, engine_kwargs={"num_kv_blocks": 256},
                                         trace_requests=True), MODEL)
    app = build_app(engine, api_keys=KEYS, max_pending_requests=MAX_PENDING, max_request_bytes=MAX_BODY,
                    chat_template=CHAT_TEMPLATE)
    uv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    first = wait_healthy(url)[0]
    yield url, first
    uv.should_exit = True
    thread.join(30)
    assert not engine.client.is_alive(), "shutdown left the engine core running"


@pytest.fixture(scope="module")
def url(server):
    return server[0]


@pytest.fixture(scope="module")
def client(url):
    return openai.OpenAI(base_url=f"{url}/v1", api_key="key-acme", max_retries=0)


@pytest.fixture(scope="module")
def offline(tiny, device):
    return LLM(tiny, device=device)


def post(url: str, path: str, body, key: str = "key-acme", **kwargs) -> httpx.Response:
    content = body if isinstance(body, (str, bytes)) else json.dumps(body)
    return httpx.post(f"{url}{path}", content=content, timeout=60, **kwargs,
                      headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})


def metrics(url: str) -> dict[str, float]:
    """Every sample of /metrics, by name with labels."""
    samples = {}
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def sample(samples: dict[str, float], name: str, **labels: str) -> float:
    labels = {"model_name": MODEL, **labels}
    key = name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"
    return samples[key]


def assert_error(response: httpx.Response, status: int, param: str | None = None) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"] and error["type"]
    assert error["code"] == status
    if param is not None:
        assert error["param"] == param, error
    assert response.headers["x-request-id"]


def test_health_said_503_while_the_model_loaded(server):
    assert_error(server[1], 503)


def test_greedy_completion_equals_the_offline_engine(client, offline):
    prompts = ["Hello there", "Another prompt"]
    response = client.completions.create(model=MODEL, prompt=prompts, max_tokens=8, temperature=0)
    expected = offline.generate(prompts, SamplingParams(max_tokens=8, temperature=0.0), use_tqdm=False)
    assert [c.text for c in sorted(response.choices, key=lambda c: c.index)] == [e.outputs[0].text for e in expected]
    assert response.usage.completion_tokens == sum(len(e.outputs[0].token_ids) for e in expected)
    assert response.usage.prompt_tokens == sum(len(e.prompt_token_ids) for e in expected)


def test_streamed_completion_with_n_and_usage(client):
    stream = client.completions.create(model=MODEL, prompt="Stream me", max_tokens=12, n=2, seed=7,
                                       temperature=1.0, extra_body={"ignore_eos": True}, stream=True,
                                       stream_options={"include_usage": True})
    texts, reasons, usage = {0: "", 1: ""}, {}, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            texts[choice.index] += choice.text
            if choice.finish_reason:
                reasons[choice.index] = choice.finish_reason
    assert reasons == {0: "length", 1: "length"}
    assert usage.completion_tokens == 24 and usage.prompt_tokens > 0
    assert texts[0] != texts[1]  # seeds 7 and 8
    again = client.completions.create(model=MODEL, prompt="Stream me", max_tokens=12, n=2, seed=7,
                                      temperature=1.0, extra_body={"ignore_eos": True})
    assert {c.index: c.text for c in again.choices} == texts  # seeded: streamed or not, the same text


def test_chat_streamed_and_not_agree_and_role_comes_first(client):
    messages = [{"role": "user", "content": "hi"}]
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_completion_tokens=10,
                                           temperature=0)
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=10, temperature=0,
                                                 stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    assert whole.choices[0].message.role == "assistant"


def test_stop_string_and_logprobs(client):
    greedy = client.completions.create(model=MODEL, prompt="Stop test", max_tokens=16, temperature=0,
                                       extra_body={"ignore_eos": True})
    text = greedy.choices[0].text
    start = next(i for i in range(1, len(text) - 2) if "\ufffd" not in text[i:i + 2]
                 and text[i:i + 2] not in text[:i + 1])
    stopped = client.completions.create(model=MODEL, prompt="Stop test", max_tokens=16, temperature=0,
                                        stop=[text[start:start + 2]], extra_body={"ignore_eos": True})
    assert stopped.choices[0].text == text[:start] and stopped.choices[0].finish_reason == "stop"
    with_logprobs = client.completions.create(model=MODEL, prompt="Stop test", max_tokens=4, temperature=0,
                                              logprobs=2, extra_body={"ignore_eos": True})
    logprobs = with_logprobs.choices[0].logprobs
    assert len(logprobs.tokens) == 4 == len(logprobs.token_logprobs)
    assert all(len(top) == 2 and max(top.values()) >= lp for top, lp in zip(logprobs.top_logprobs,
                                                                          logprobs.token_logprobs))
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=3,
                                          temperature=0, logprobs=True, top_logprobs=2)
    assert [len(t.top_logprobs) for t in chat.choices[0].logprobs.content] == [2] * chat.usage.completion_tokens


def test_64_concurrent_streams_each_get_their_tokens(url):
    async def one(client: openai.AsyncOpenAI, i: int) -> tuple[int, int]:
        stream = await client.completions.create(
            model=MODEL, prompt=f"request {i}", max_tokens=4 + i % 32, temperature=0.5, seed=i, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        usage = None
        async for chunk in stream:
            usage = chunk.usage or usage
        return 4 + i % 32, usage.completion_tokens

    async def run():
        async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="key-acme", max_retries=0) as client:
            return await asyncio.gather(*(one(client, i) for i in range(64)))

    for expected, got in asyncio.run(run()):
        assert got == expected


def test_preemption_shows_in_metrics_when_kv_blocks_run_short(url):
    """32 distinct 100-token prompts fit the pool's 256 blocks of 16 tokens (7 blocks each); with 150
    tokens decoded each needs 16 blocks, so any 17 of them running at once need more than the pool, and the
    scheduler must preempt however the requests' arrivals at the core spread out (with 60 tokens, 10 blocks
    each, a slow CI machine once spread them enough that none was preempted). Every request still gets all
    its tokens."""
    before = metrics(url)
    prompts = [f"{i:03d}" + "x" * 97 for i in range(32)]
    response = post(url, "/v1/completions", {"prompt": prompts, "max_tokens": 150, "ignore_eos": True})
    assert response.status_code == 200, response.text
    assert [c["finish_reason"] for c in response.json()["choices"]] == ["length"] * 32
    assert response.json()["usage"]["completion_tokens"] == 32 * 150
    after = metrics(url)
    events = sample(after, "vllm:num_preemptions_total") - sample(before, "vllm:num_preemptions_total")
    sequences = (sample(after, "serving_lab:preempted_requests_total")
                 - sample(before, "serving_lab:preempted_requests_total"))
    assert events >= sequences > 0


async def _post_and_hang_up_while_running(url: str, body: dict, headers: dict) -> None:
    """POST a whole-response request and close the connection once the server runs it (not after a fixed
    time: on a fast machine the tiny model could finish all of it first)."""
    async with httpx.AsyncClient(timeout=60, headers=headers) as client:
        post = asyncio.create_task(client.post(f"{url}/v1/completions", json=body))
        deadline = time.monotonic() + 20
        while sample(await asyncio.to_thread(metrics, url), "vllm:num_requests_running") == 0:
            assert time.monotonic() < deadline and not post.done(), "the request never ran"
            await asyncio.sleep(0.005)
        post.cancel()  # the client hangs up while the server generates
        with pytest.raises(asyncio.CancelledError):
            await post


@pytest.mark.parametrize("stream", [True, False], ids=["streaming", "whole-response"])
def test_a_client_that_disconnects_leaves_no_running_request_and_no_used_block(url, stream):
    # slowed to 20 ms a step (about 5 s in all): the server must see the hang-up while the requests run,
    # even where a busy machine delays it
    body = {"model": MODEL, "prompt": "a long one", "max_tokens": 240, "n": 8, "stream": stream,
            "ignore_eos": True, "min_p": SLOW_MIN_P}
    headers = {"Authorization": "Bearer key-acme"}
    tokens_before = sample(metrics(url), "vllm:generation_tokens_total")
    if stream:
        with httpx.stream("POST", f"{url}/v1/completions", json=body, headers=headers, timeout=60) as response:
            lines = response.iter_lines()
            assert next(line for line in lines if line.startswith("data:"))
    else:
        asyncio.run(_post_and_hang_up_while_running(url, body, headers))
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        samples = metrics(url)
        if (sample(samples, "vllm:num_requests_running") == 0
                and sample(samples, "vllm:kv_cache_usage_perc") == 0):
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"still running or holding blocks: {samples}")
    assert sample(samples, "vllm:generation_tokens_total") - tokens_before < 8 * 240  # stopped, not finished
    assert sample(samples, "vllm:request_success_total", finished_reason="abort") >= 8


BAD_INPUTS = {
    "invalid-json": ("/v1/completions", '{"prompt": "x", ', "key-acme", 400, None),
    "bad-type": ("/v1/completions", {"prompt": "x", "max_tokens": "many"}, "key-acme", 400, "max_tokens"),
    "unknown-field": ("/v1/completions", {"prompt": "x", "temprature": 0.5}, "key-acme", 400, "temprature"),
    "bad-range": ("/v1/completions", {"prompt": "x", "top_p": 2.0}, "key-acme", 400, "top_p"),
    "negative-temperature": ("/v1/completions", {"prompt": "x", "temperature": -1}, "key-acme", 400,
                             "temperature"),
    "stream-options-without-stream": ("/v1/completions", {"prompt": "x", "stream_options": {"include_usage": True}},
                                      "key-acme", 400, "stream_options"),
    "n-zero": ("/v1/completions", {"prompt": "x", "n": 0}, "key-acme", 400, "n"),
    "unsupported-penalty": ("/v1/completions", {"prompt": "x", "presence_penalty": 0.5}, "key-acme", 400,
                            "presence_penalty"),
    "priority-without-policy": ("/v1/completions", {"prompt": "x", "priority": 3}, "key-acme", 400, "priority"),
    "stop-token-outside-vocab": ("/v1/completions", {"prompt": "x", "stop_token_ids": [10**6]}, "key-acme", 400,
                                 "stop_token_ids"),
    "prompt-too-long": ("/v1/completions", {"prompt": "x" * 300}, "key-acme", 400, "prompt"),
    "max-tokens-too-many": ("/v1/completions", {"prompt": "x", "max_tokens": 1000}, "key-acme", 400, "max_tokens"),
    "chat-max-completion-tokens": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                                            "max_completion_tokens": 1000}, "key-acme", 400,
                                   "max_tokens"),
    "empty-messages": ("/v1/chat/completions", {"messages": []}, "key-acme", 400, "messages"),
    "wrong-key": ("/v1/completions", {"prompt": "x"}, "key-nobody", 401, None),
    "unknown-model": ("/v1/completions", {"prompt": "x", "model": "gpt-9"}, "key-acme", 404, "model"),
    "oversized": ("/v1/completions", {"prompt": "x" * (MAX_BODY + 1)}, "key-acme", 413, None),
    "unknown-route": ("/v1/nothing", {}, "key-acme", 404, None),
    # lone surrogates (JSON's "\\ud800") are no Unicode any tokenizer or cache key can encode
    "surrogate-user": ("/v1/completions", '{"prompt": "x", "user": "\\ud800"}', "key-acme", 400, "user"),
    "surrogate-salt": ("/v1/completions", '{"prompt": "x", "cache_salt": "a\\udfff"}', "key-acme", 400, "cache_salt"),
    "surrogate-prompt": ("/v1/completions", '{"prompt": "x\\ud800y"}', "key-acme", 400, "prompt"),
    "surrogate-message": ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "\\ud800"}]}',
                          "key-acme", 400, "messages"),
    "surrogate-stop": ("/v1/completions", '{"prompt": "x", "stop": ["\\ud800"]}', "key-acme", 400, "stop"),
    "logprobs-over-max": ("/v1/completions", {"prompt": "x", "logprobs": 21}, "key-acme", 400, "logprobs"),
    "top-logprobs-over-max": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                                       "logprobs": True, "top_logprobs": 49152}, "key-acme", 400,
                              "top_logprobs"),
    "image-part": ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x"}}]}]}, "key-acme", 400, "messages"),
}


@pytest.mark.parametrize("case", BAD_INPUTS, ids=list(BAD_INPUTS))
def test_bad_input_gets_its_status_and_the_server_keeps_serving(url, client, case):
    path, body, key, status, param = BAD_INPUTS[case]
    assert_error(post(url, path, body, key=key), status, param)
    assert client.completions.create(model=MODEL, prompt="still here", max_tokens=2).choices[0].text is not None


def test_admission_control_answers_429_past_the_cap(url):
    # more choices than the cap could ever admit: no retry helps, so a 400 naming n, not a 429
    assert_error(post(url, "/v1/completions", {"prompt": "too many", "n": MAX_PENDING + 1}), 400, "n")
    body = {"prompt": "hold", "max_tokens": 240, "n": MAX_PENDING, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, headers={"Authorization": "Bearer key-acme"},
                      timeout=60) as held:  # the cap's worth of requests, streaming
        lines = held.iter_lines()  # kept: closing the iterator would close the connection
        next(line for line in lines if line.startswith("data:"))
        assert_error(post(url, "/v1/completions", {"prompt": "one more"}), 429)


def test_a_request_failing_in_sampling_fails_alone_with_500(url, client):
    async def run():
        async with httpx.AsyncClient(timeout=60, headers={"Authorization": "Bearer key-acme"}) as http:
            def send(body):
                return http.post(f"{url}/v1/completions", json={"prompt": "p", "max_tokens": 6,
                                                                "ignore_eos": True, **body})
            return await asyncio.gather(send({}), send({"min_p": POISON_MIN_P}), send({"temperature": 0}))

    ok, bad, also_ok = asyncio.run(run())
    assert_error(bad, 500)
    assert "injected" in bad.json()["error"]["message"]
    assert ok.json()["usage"]["completion_tokens"] == 6 == also_ok.json()["usage"]["completion_tokens"]


def test_metrics_have_vllm_names_and_move(url, client):
    before = metrics(url)
    client.completions.create(model=MODEL, prompt="count me", max_tokens=5, extra_body={"ignore_eos": True})
    after = metrics(url)
    assert sample(after, "vllm:generation_tokens_total") - sample(before, "vllm:generation_tokens_total") == 5
    assert sample(after, "vllm:prompt_tokens_total") > sample(before, "vllm:prompt_tokens_total")
    for histogram in ("vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds",
                      "vllm:request_queue_time_seconds", "vllm:request_time_per_output_token_seconds"):
        assert sample(after, f"{histogram}_count") == sample(before, f"{histogram}_count") + 1
    assert sample(after, "vllm:inter_token_latency_seconds_count") == sample(
        before, "vllm:inter_token_latency_seconds_count") + 4
    assert sample(after, "vllm:request_success_total", finished_reason="length") == sample(
        before, "vllm:request_success_total", finished_reason="length") + 1
    for gauge in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                  "vllm:num_preemptions_total", "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
                  "serving_lab:preempted_requests_total"):
        sample(after, gauge)  # present


def test_the_api_key_tenant_isolates_the_prefix_cache(url):
    prompt = "shared system prompt " * 4  # several full blocks

    def hits_after(key: str) -> float:
        post(url, "/v1/completions", {"prompt": prompt, "max_tokens": 1}, key=key).raise_for_status()
        return sample(metrics(url), "vllm:prefix_cache_hits_total")

    start = hits_after("key-acme")
    assert hits_after("key-globex") == start  # another tenant: no hit
    assert hits_after("key-acme") > start  # the same tenant again: a hit


def test_models_tokenize_detokenize_reset(url):
    models = httpx.get(f"{url}/v1/models", headers={"Authorization": "Bearer key-acme"}).json()
    assert [m["id"] for m in models["data"]] == [MODEL]
    tokens = post(url, "/tokenize", {"prompt": "héllo"}).json()
    assert tokens["count"] == len(tokens["tokens"]) == len("héllo".encode())
    assert post(url, "/detokenize", {"tokens": tokens["tokens"]}).json()["prompt"] == "héllo"
    chat = post(url, "/tokenize", {"messages": [{"role": "user", "content": "x"}]}).json()
    assert post(url, "/detokenize", {"tokens": chat["tokens"]}).json()["prompt"] == "<|user|>x\n<|assistant|>"
    assert post(url, "/reset_prefix_cache", {}, key="key-ops").status_code == 200  # an admin resets all
    response = httpx.get(f"{url}/v1/models", headers={"X-Request-Id": "mine-1"})
    assert_error(response, 401)
    assert response.headers["x-request-id"] == "mine-1"
    assert re.fullmatch(r"[0-9a-f]{32}", post(url, "/tokenize", {"prompt": "x"}).headers["x-request-id"])


def test_bench_serve_counts_what_the_server_counted(url, tmp_path):
    before = metrics(url)
    result_file = tmp_path / "bench.json"
    cli.main(["bench", "serve", "--base-url", url, "--api-key", "key-acme", "--num-prompts", "8",
              "--random-input-len", "6", "--random-output-len", "5", "--max-concurrency", "4",
              "--request-rate", "200", "--result-file", str(result_file)])
    result = json.loads(result_file.read_text())
    after = metrics(url)
    assert result["completed"] == 8 and result["failed"] == 0 and result["model"] == MODEL
    assert result["total_output_tokens"] == 40 == (sample(after, "vllm:generation_tokens_total")
                                                   - sample(before, "vllm:generation_tokens_total"))
    assert result["total_input_tokens"] == sample(after, "vllm:prompt_tokens_total") - sample(
        before, "vllm:prompt_tokens_total")
    assert 0 < result["mean_ttft_ms"] <= result["mean_e2el_ms"] and result["mean_itl_ms"] > 0
    assert len(result["itls"]) == 8 and all(len(gaps) == 4 for gaps in result["itls"])


def test_bench_serve_simulate_stores_the_prediction_next_to_the_measurement(url, tiny, tmp_path, capsys):
    manifest = yaml.safe_load(EXAMPLE_MANIFEST.read_text())
    manifest["engine"]["model"] = str(tiny)
    manifest["api"]["request_limits"]["max_model_len"] = None
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(manifest))
    result_file = tmp_path / "bench.json"
    cli.main(["bench", "serve", "--base-url", url, "--api-key", "key-acme", "--num-prompts", "6",
              "--random-input-len", "6", "--random-output-len", "5", "--max-concurrency", "2",
              "--request-rate", "50", "--simulate", "--hardware", "local-cpu", "--frontend-latency-ms", "2",
              "--config", str(tmp_path / "tiny.yaml"), "--result-file", str(result_file)])
    result = json.loads(result_file.read_text())
    simulated = result["simulated"]
    assert simulated["completed"] == 6 == result["completed"] and simulated["hardware"] == "local-cpu"
    assert simulated["total_output_tokens"] == 30 == result["total_output_tokens"]
    assert simulated["total_input_tokens"] == 36 == result["total_input_tokens"]
    assert simulated["frontend_latency_ms"] == 2 and simulated["mean_ttft_ms"] >= 2
    assert 0 < simulated["output_throughput"] and simulated["mean_ttft_ms"] <= simulated["mean_e2el_ms"]
    out = capsys.readouterr().out
    assert all(name in out for name in ("output_throughput", "mean_ttft_ms", "measured", "simulated"))


def test_a_traced_request_passes_every_box_in_order(url):
    """--trace-requests: one streamed request's timeline, from both processes, on one clock and in order."""
    auth = {"Authorization": "Bearer key-acme"}
    body = {"prompt": [5, 6, 7, 8, 9], "max_tokens": 3, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, headers={**auth, "X-Request-Id": "traced"},
                      timeout=60) as response:
        assert response.status_code == 200
        response.read()
    trace = httpx.get(f"{url}/debug/trace/traced", headers=auth).json()
    by_box = {box: [e for e in trace["events"] if e["box"] == box] for box in ("api_server", "engine_core")}
    api = [e["event"] for e in by_box["api_server"]]
    core = [e["event"] for e in by_box["engine_core"]]
    assert api == ["arrived", "tokenized", "sent_to_core"] + ["output_received", "chunk_sent"] * 3, api
    assert core == ["queued"] + ["scheduled", "sampled", "detokenized"] * 3 + ["finished"], core
    scheduled = [e["attrs"] for e in by_box["engine_core"] if e["event"] == "scheduled"]
    assert [(s["num_tokens"], s["num_computed_tokens"]) for s in scheduled] == [(5, 0), (1, 5), (1, 6)]
    at = {}
    for e in trace["events"]:  # the two processes share one clock, so causes come before effects
        at.setdefault(e["event"], []).append(e["time"])
    assert at["sent_to_core"][0] <= at["queued"][0] <= at["scheduled"][0]
    for made, received, written in zip(at["detokenized"], at["output_received"], at["chunk_sent"]):
        assert made <= received <= written
    assert at["chunk_sent"][-1] <= trace["now"]
    assert httpx.get(f"{url}/debug/trace/traced").status_code == 401
    assert_error(httpx.get(f"{url}/debug/trace/never-sent", headers=auth), 404, "request_id")


def test_chat_content_as_a_list_of_text_parts_is_the_joined_text(client):
    as_parts = client.chat.completions.create(model=MODEL, max_tokens=4, temperature=0, messages=[
        {"role": "user", "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]}])
    as_text = client.chat.completions.create(model=MODEL, max_tokens=4, temperature=0,
                                             messages=[{"role": "user", "content": "one\ntwo"}])
    assert as_parts.choices[0].message.content == as_text.choices[0].message.content
    assert as_parts.usage.prompt_tokens == as_text.usage.prompt_tokens


def test_two_requests_with_one_x_request_id_both_succeed_and_echo_it(url):
    async def run():
        async with httpx.AsyncClient(timeout=60, headers={"Authorization": "Bearer key-acme",
                                                          "X-Request-Id": "same"}) as http:
            body = {"prompt": "twice", "max_tokens": 20, "ignore_eos": True, "n": 2}
            return await asyncio.gather(*(http.post(f"{url}/v1/completions", json=body) for _ in range(2)))

    for response in asyncio.run(run()):
        assert response.status_code == 200, response.text
        assert response.headers["x-request-id"] == "same" and response.json()["usage"]["completion_tokens"] == 40


def test_a_chunked_body_over_the_cap_is_413_and_a_wrong_method_405(url):
    def chunks():
        yield b'{"prompt": "'
        for _ in range(MAX_BODY // 1024 + 1):
            yield b"x" * 1024
        yield b'"}'

    response = httpx.post(f"{url}/v1/completions", content=chunks(), timeout=60,
                          headers={"Authorization": "Bearer key-acme", "Content-Type": "application/json"})
    assert "content-length" not in response.request.headers
    assert_error(response, 413)
    small = httpx.post(f"{url}/v1/completions", content=iter([b'{"prompt": "x", ', b'"max_tokens": 2}']),
                       headers={"Authorization": "Bearer key-acme", "Content-Type": "application/json"})
    assert small.status_code == 200, small.text  # a chunked body under the cap is read as usual
    wrong = httpx.get(f"{url}/v1/completions", headers={"Authorization": "Bearer key-acme"})
    assert_error(wrong, 405)
    assert "POST" in wrong.headers["allow"]


def test_refused_requests_are_counted_by_reason_and_status(url):
    def failures(samples: dict[str, float], reason: str, status: int) -> float:
        return samples.get(f'serving_lab:request_failures_total{{model_name="{MODEL}",reason="{reason}",'
                           f'status="{status}"}}', 0.0)

    before = metrics(url)
    post(url, "/v1/completions", {"prompt": "x", "temprature": 1})
    post(url, "/v1/completions", {"prompt": "x"}, key="key-nobody")
    post(url, "/v1/completions", {"prompt": "x", "n": MAX_PENDING + 1})
    after = metrics(url)
    for reason, status in (("invalid_request", 400), ("unauthorized", 401), ("too_many_choices", 400)):
        assert failures(after, reason, status) == failures(before, reason, status) + 1, reason


def test_only_an_admin_key_resets_another_tenants_prefix_cache(url):
    assert_error(post(url, "/reset_prefix_cache?tenant=globex", {}), 403, "tenant")
    assert_error(post(url, "/reset_prefix_cache", {}, key="key-nobody"), 401)


def test_a_tenant_reset_forgets_that_tenants_blocks_only(url):
    prompt = "a prompt both tenants cache " * 4

    def hits(key: str) -> float:
        response = post(url, "/v1/completions", {"prompt": prompt, "max_tokens": 1}, key=key)
        return response.json()["usage"]["prompt_tokens_details"]["cached_tokens"]

    hits("key-acme"), hits("key-globex")
    assert post(url, "/reset_prefix_cache", {}, key="key-acme").status_code == 200  # acme's own
    assert hits("key-acme") == 0 and hits("key-globex") > 0
    assert post(url, "/reset_prefix_cache?tenant=globex", {}, key="key-ops").status_code == 200  # an admin's
    assert hits("key-globex") == 0
