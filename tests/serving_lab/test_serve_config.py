"""`serving-lab serve --config MANIFEST` and the graceful drain (tiny model).

A bad manifest or flag stops the command with exit status 2 and one line naming the key, before any process
starts. The shipped manifest, its model substituted, starts the server the command line builds
(`build_server`); a SIGTERM then drains it: new requests get 503 while open ones run for up to
`--graceful-timeout` seconds, and those still running then are aborted.

The client's own manifest (tests/serving_lab/data/client_deploy.yaml, byte for byte) stops `serve` with one
line per key this one-CPU engine cannot honour, each naming its override; with those overrides it serves.
"""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
import yaml
from live_server import free_port, wait_healthy

from ref_engine.entrypoints.openai.admission import Admission
from ref_engine.entrypoints.openai.api_server import build_server
from ref_engine.entrypoints.openai.protocol import CompletionRequest
from ref_engine.entrypoints.openai.serving import OpenAIError
from ref_engine.entrypoints.openai.serving_completion import OpenAIServingCompletion
from serving_lab import cli
from serving_lab.manifest import DEFAULT_MODEL, EXAMPLE_MANIFEST

CLIENT = Path(__file__).parent / "data" / "client_deploy.yaml"
# What the one-CPU engine cannot honour in the client's file, overridden: the model, the context, the degree,
# and the draft model (prompt lookup in its place, the same 5 speculative tokens).
CLIENT_OVERRIDES = ["--model", DEFAULT_MODEL, "--max-model-len", "2048", "--tensor-parallel-size", "1",
                    "--speculative-model", "[ngram]"]

GRACEFUL_TIMEOUT = 1.0


@pytest.fixture(scope="module")
def tiny(make_tiny_hf_model):
    return make_tiny_hf_model("llama", name="serve-config-llama")


def bad_block_size(tmp_path) -> str:
    data = yaml.safe_load(EXAMPLE_MANIFEST.read_text())
    data["cache"]["block_size_tokens"] = "16"
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(data))
    return str(tmp_path / "bad.yaml")


@pytest.mark.parametrize("argv, key", [
    (lambda tmp, tiny: ["--config", bad_block_size(tmp)], "cache.block_size_tokens: Input should be a valid integer"),
    (lambda tmp, tiny: ["--config", str(EXAMPLE_MANIFEST), "--max-num-seqs", "0"], "api.request_limits.max_num_seqs"),
    (lambda tmp, tiny: ["--config", str(EXAMPLE_MANIFEST), str(tiny)],  # 2048 tokens; the tiny model has 256
     "api.request_limits.max_model_len: max_model_len (2048) exceeds the model's"),
    (lambda tmp, tiny: ["--block-size", "32"], "--block-size override a manifest's keys: give --config"),
    (lambda tmp, tiny: ["--config", str(EXAMPLE_MANIFEST), "--scheduling-policy", "fcfs"], "api.admission.fairness"),
], ids=["wrong-type", "bad-flag", "too-long-for-the-model", "override-without-manifest", "policy-flag"])
def test_a_bad_manifest_or_flag_exits_2_with_one_line_naming_the_key(tmp_path, tiny, capsys, argv, key):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["serve", *argv(tmp_path, tiny)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and key in err and "Traceback" not in err, err


def test_the_tensor_parallel_degree_travels_in_the_engine_core_s_engine_kwargs(monkeypatch, tmp_path, tiny):
    """A manifest's `engine.tensor_parallel_size`, and `serve --tensor-parallel-size N` alone or over it (and
    `--allow-cpu-oversubscription`), reach the keywords the engine-core process builds its `LLMEngine` from (stopped there: no process
    starts)."""
    class Built(Exception):
        pass

    def capture(engine_args, served_model_name):
        raise Built(engine_args)

    monkeypatch.setattr("ref_engine.entrypoints.openai.api_server.AsyncLLM", capture)
    data = yaml.safe_load(EXAMPLE_MANIFEST.read_text())
    data["engine"]["tensor_parallel_size"] = 3
    (tmp_path / "tp3.yaml").write_text(yaml.safe_dump(data))
    degrees, oversubscribed = [], []
    for argv in ([str(tiny), "--tensor-parallel-size", "2"], ["--config", str(tmp_path / "tp3.yaml")],
                 ["--config", str(EXAMPLE_MANIFEST), "--tensor-parallel-size", "3", "--allow-cpu-oversubscription"]):
        args = cli.build_parser().parse_args(["serve", *argv])
        with pytest.raises(Built) as built:
            build_server(args, cli.serve_config(args))
        kwargs = built.value.args[0].engine_kwargs
        degrees.append(kwargs["tensor_parallel_size"])
        oversubscribed.append(kwargs.get("allow_cpu_oversubscription", False))
    assert degrees == [2, 3, 3]
    assert oversubscribed == [False, False, True]  # more ranks than cores only when asked for


def test_a_manifest_that_does_not_stream_answers_stream_requests_with_400(tmp_path, tiny):
    data = yaml.safe_load(EXAMPLE_MANIFEST.read_text())
    data["api"]["stream"] = False
    (tmp_path / "no-stream.yaml").write_text(yaml.safe_dump(data))
    args = cli.build_parser().parse_args(["serve", str(tiny), "--config", str(tmp_path / "no-stream.yaml"),
                                          "--max-model-len", "256"])
    cli.serve_config(args)
    assert args.allow_streaming is False
    engine = SimpleNamespace(model_config=SimpleNamespace(scheduling_policy="fair"))
    serving = OpenAIServingCompletion(engine, "smollm2", Admission(8), allow_streaming=args.allow_streaming)
    serving.check_supported(CompletionRequest(prompt="x"))  # a whole response is fine
    with pytest.raises(OpenAIError) as error:
        serving.check_supported(CompletionRequest(prompt="x", stream=True))
    assert (error.value.status, error.value.param) == (400, "stream") and "api.stream: false" in error.value.message


def test_the_manifest_sets_the_numerics_and_a_flag_overrides_them(tmp_path, tiny):
    data = yaml.safe_load(EXAMPLE_MANIFEST.read_text())
    data["engine"]["dtype"] = "bfloat16"
    (tmp_path / "bf16.yaml").write_text(yaml.safe_dump(data))
    argv = ["serve", str(tiny), "--config", str(tmp_path / "bf16.yaml"), "--max-model-len", "256"]
    args = cli.build_parser().parse_args(argv)
    cli.serve_config(args)
    assert (args.dtype, args.quantization) == ("bfloat16", None)
    args = cli.build_parser().parse_args([*argv, "--dtype", "float32", "--quantization", "int8"])
    cli.serve_config(args)
    assert (args.dtype, args.quantization, args.kv_cache_dtype) == ("float32", "int8", "auto")
    args = cli.build_parser().parse_args([*argv, "--kv-cache-dtype", "bfloat16"])
    cli.serve_config(args)
    assert args.kv_cache_dtype == "bfloat16"
    assert build_server(args, cli.serve_config(args)).engine.engine_args.kv_cache_dtype == "bfloat16"
    assert build_server(args, cli.serve_config(args)).engine.engine_args.enforce_eager is True
    args = cli.build_parser().parse_args([*argv, "--no-enforce-eager"])
    assert build_server(args, cli.serve_config(args)).engine.engine_args.enforce_eager is False
    assert not hasattr(cli.build_parser().parse_args(["serve"]), "dtype")  # no manifest: build_server's float32


async def collect(http: httpx.AsyncClient, body: dict, started: asyncio.Event) -> list[dict]:
    """Every data chunk of a streamed completion; `started` is set at the first."""
    chunks = []
    async with http.stream("POST", "/v1/completions", json={**body, "stream": True, "ignore_eos": True}) as response:
        async for line in response.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line.removeprefix("data: ")))
                started.set()
    return chunks


def test_the_shipped_manifest_serves_and_sigterm_drains(tiny):
    port = free_port()
    args = cli.build_parser().parse_args([
        "serve", str(tiny), "--config", str(EXAMPLE_MANIFEST), "--max-model-len", "256", "--max-num-seqs", "2",
        "--port", str(port), "--graceful-timeout", str(GRACEFUL_TIMEOUT)])
    server = build_server(args, cli.serve_config(args))
    config = server.engine.engine_args.engine_kwargs["config"]
    assert (config.max_num_seqs, config.scheduling_policy, config.max_model_len) == (2, "fair", 256)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url)
    assert [m["id"] for m in httpx.get(f"{url}/v1/models").json()["data"]] == ["smollm2"]

    async def drive():
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            short_started, long_started = asyncio.Event(), asyncio.Event()
            short = asyncio.create_task(collect(http, {"prompt": "short", "max_tokens": 20}, short_started))
            await short_started.wait()
            # 32 choices of 240 tokens, 2 at a time: ~3,800 steps, beyond the graceful timeout even on a fast,
            # quiet machine (8 choices once finished within it there)
            long = asyncio.create_task(collect(http, {"prompt": "long", "max_tokens": 240, "n": 32}, long_started))
            await long_started.wait()
            server.handle_exit(signal.SIGTERM, None)
            signalled = time.monotonic()
            refused = await http.post("/v1/completions", json={"prompt": "late"})
            health = await http.get("/health")
            short_chunks = await short
            long_chunks = await long
            return signalled, time.monotonic(), refused, health, short_chunks, long_chunks

    signalled, long_ended, refused, health, short_chunks, long_chunks = asyncio.run(drive())
    assert refused.status_code == 503 and refused.json()["error"]["message"] == "the server is shutting down"
    assert health.status_code == 503
    assert short_chunks[-1]["choices"][0]["finish_reason"] == "length"  # the open request finished
    error = long_chunks[-1]["error"]  # the request left at the timeout was aborted: retry elsewhere
    assert error["code"] == 503 and "shut down" in error["message"]
    assert long_ended - signalled >= GRACEFUL_TIMEOUT - 0.2
    thread.join(30)
    assert not thread.is_alive() and not server.engine.client.is_alive()
    aborted = server.engine.stat_logger.registry.get_sample_value(
        "vllm:request_success_total", {"model_name": "smollm2", "finished_reason": "abort"})
    assert aborted >= 1  # the long request's choices still running or waiting


def test_the_client_manifest_without_overrides_stops_with_one_line_per_key(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["serve", "--config", str(CLIENT)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    header, *lines = err.strip().splitlines()
    assert header == "serving-lab: error: 4 keys the engine cannot run on this machine:"
    overrides = {"engine.model": "--model", "engine.tensor_parallel_size": "--tensor-parallel-size 1",
                 "api.request_limits.max_model_len": "--max-model-len 8192",
                 "optional.speculative_decoding.draft_model": "--speculative-model"}
    assert [line.strip().split(":")[0] for line in lines] == list(overrides)
    for line, flag in zip(lines, overrides.values()):
        assert f"override with {flag}" in line, line
    assert "32768" in lines[2] and "8192" in lines[2]


def test_without_the_draft_override_the_draft_line_stays(capsys):
    with pytest.raises(SystemExit):  # nothing is silently substituted: the draft is named until overridden
        cli.main(["serve", "--config", str(CLIENT), *CLIENT_OVERRIDES[:-2]])
    err = capsys.readouterr().err.strip()
    assert err.startswith("serving-lab: error: optional.speculative_decoding.draft_model: "
                          "'organization/chat-draft-model' is no model on this machine") and len(err.splitlines()) == 1
    args = cli.build_parser().parse_args(["serve", "--config", str(CLIENT), *CLIENT_OVERRIDES[:-2],
                                          "--speculative-decoding", "null"])
    assert cli.serve_config(args).speculative_method is None  # or leave speculation out, saying so


def test_the_manifest_tenants_section_reaches_args(tmp_path):
    data = yaml.safe_load(CLIENT.read_text())
    data["tenants"] = {"acme": {"weight": 2, "max_num_seqs": 4, "max_pending_requests": 8}}
    (tmp_path / "tenants.yaml").write_text(yaml.safe_dump(data))
    args = cli.build_parser().parse_args(["serve", "--config", str(tmp_path / "tenants.yaml"), *CLIENT_OVERRIDES])
    config = cli.serve_config(args)
    assert args.tenants["acme"].max_pending_requests == 8 and args.tenants["acme"].weight == 2
    assert dict(config.tenant_weights) == {"acme": 2} and dict(config.tenant_max_num_seqs) == {"acme": 4}
    plain = cli.build_parser().parse_args(["serve", "--config", str(CLIENT), *CLIENT_OVERRIDES])
    cli.serve_config(plain)
    assert plain.tenants is None and plain.allow_streaming is True  # incremental_tokens: streaming on
    assert cli.build_parser().parse_args(["serve"]).config is None


def test_the_client_manifest_serves_a_streaming_chat_with_the_overrides():
    port = free_port()
    args = cli.build_parser().parse_args(["serve", "--config", str(CLIENT), *CLIENT_OVERRIDES, "--port", str(port)])
    config = cli.serve_config(args)
    assert (config.max_model_len, config.max_num_seqs, config.scheduling_policy, config.enable_chunked_prefill,
            config.prefill_budget_tokens, config.decode_batch_max_tokens, config.num_speculative_tokens) == (
        2048, 256, "fair", True, 2048, 256, 5)
    server = build_server(args, config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url)
        assert [m["id"] for m in httpx.get(f"{url}/v1/models").json()["data"]] == ["chat"]  # served_model_name
        body = {"model": "chat", "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8,
                "stream": True}
        chunks = []
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as response:
            assert response.status_code == 200
            for line in response.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunks.append(json.loads(line.removeprefix("data: ")))
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
        assert len(chunks) > 2 and text  # incremental tokens: several deltas
        assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length") or any(
            c["choices"] and c["choices"][0].get("finish_reason") for c in chunks)
    finally:
        server.handle_exit(signal.SIGTERM, None)
        thread.join(30)


def test_the_int4_group_size_travels_in_the_engine_core_s_engine_kwargs(monkeypatch, tiny):
    """`serve --quantization int4 --quantization-group-size 64` reaches the engine-core's `LLMEngine` keywords;
    without the flag the engine's default (32) holds and nothing is passed."""
    class Built(Exception):
        pass

    def capture(engine_args, served_model_name):
        raise Built(engine_args)

    monkeypatch.setattr("ref_engine.entrypoints.openai.api_server.AsyncLLM", capture)
    sizes = []
    for extra in (["--quantization-group-size", "64"], []):
        args = cli.build_parser().parse_args(["serve", str(tiny), "--quantization", "int4", *extra])
        with pytest.raises(Built) as built:
            build_server(args, cli.serve_config(args))
        sizes.append(built.value.args[0].engine_kwargs.get("quantization_group_size"))
    assert sizes == [64, None]
