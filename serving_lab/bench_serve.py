"""`serving-lab bench serve`: a load generator for any OpenAI-compatible `/v1/completions` endpoint (this
course's server or a real vLLM), measured from the client's side, with `vllm bench serve`'s result names.

Requests are sent at a rate (`--request-rate`, arrivals a gamma process: `--burstiness 1` is Poisson,
below 1 burstier, `inf` all at once) and/or under a cap on requests in flight (`--max-concurrency`). Each
streams (SSE) with `ignore_eos` and `max_tokens` set to its output length, so every request produces
exactly the tokens asked for; the server's `usage` chunk gives the token count. Per request: TTFT (send to
first token), ITL (each gap between streamed chunks), E2EL (send to last byte), TPOT = (E2EL - TTFT) /
(output tokens - 1). Prompts are synthetic (random token ids below 256, valid in every tokenizer this course
uses) or a JSONL file of {"prompt": ..., "output_len": ...}.

The result JSON has the field names of `vllm bench serve` (`output_throughput`, `mean_ttft_ms`,
`p99_itl_ms`, ...) and of `RunMetrics`, so a measured run, a vLLM run and a simulated run sit in one table;
`--simulate` adds the simulator's prediction of the same run under `simulated` (serving_lab/bench_predict.py).

The requests and their arrival gaps are serving_lab/bench_requests.py's, shared with the prediction.

Tenants: a server with API keys knows a request's tenant by its key alone, so `--tenants a:3,b:1` shares the
requests out among tenants in those proportions (interleaved, as a workload spec's `tenants=` mix) and
`--api-key-file` (the server's own key file) gives each tenant's key; the result then has a row per tenant
(`tenants`: completed, output throughput, mean TTFT), which is where a per-tenant budget or weight shows.

Lesson: lessons/06-architecture-map.md (measuring the server from outside).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from tqdm import tqdm

from core.metrics import latency_summary
from serving_lab.bench_requests import (
    BenchRequest,
    arrival_gaps,
    assign_tenants,
    load_prompts,
    synthetic_requests,
)
from serving_lab.workload_spec import parse_tenant_mix


@dataclass
class RequestResult:
    success: bool = False
    input_tokens: int = 0  # as the server counted them (its usage chunk)
    output_tokens: int = 0
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0
    generated_text: str = ""
    error: str = ""


def tenant_keys(path: str | Path, tenants: list[str]) -> dict[str, str]:
    """Each tenant's API key from a server's key file (the first key of that tenant); a ValueError names a
    tenant the file gives no key."""
    from ref_engine.entrypoints.openai.tenants import load_api_keys

    keys: dict[str, str] = {}
    for key, grant in load_api_keys(path).keys.items():
        keys.setdefault(grant.tenant, key)
    missing = [t for t in tenants if t not in keys]
    if missing:
        raise ValueError(f"--tenants: {path} has no key for tenant(s) {', '.join(missing)}; its tenants: "
                         f"{', '.join(sorted(keys))}")
    return {t: keys[t] for t in tenants}


async def send_request(http: httpx.AsyncClient, url: str, model: str | None, request: BenchRequest,
                       headers: dict[str, str] | None = None) -> RequestResult:
    body: dict[str, Any] = {"prompt": request.prompt, "max_tokens": request.output_len, "temperature": 0.0,
                            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    if model:
        body["model"] = model
    result = RequestResult()
    start = last = time.perf_counter()
    try:
        async with http.stream("POST", url, json=body, headers=headers) as response:
            if response.status_code != 200:
                result.error = f"HTTP {response.status_code}: {(await response.aread()).decode(errors='replace')}"
                return result
            async for line in response.aiter_lines():
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[len("data:"):])
                if "error" in chunk:
                    result.error = chunk["error"].get("message", "error")
                    return result
                if chunk.get("usage"):
                    result.input_tokens = chunk["usage"]["prompt_tokens"]
                    result.output_tokens = chunk["usage"]["completion_tokens"]
                for choice in chunk.get("choices", []):
                    now = time.perf_counter()
                    if not result.ttft:
                        result.ttft = now - start
                    else:
                        result.itl.append(now - last)
                    last = now
                    result.generated_text += choice.get("text", "")
        result.latency = time.perf_counter() - start
        result.success = True
    except httpx.HTTPError as error:
        result.error = f"{type(error).__name__}: {error}"
    return result


async def run_benchmark(base_url: str, requests: list[BenchRequest], *, model: str | None = None,
                        request_rate: float = math.inf, burstiness: float = 1.0, max_concurrency: int | None = None,
                        seed: int = 0, api_key: str | None = None, tenant_keys: dict[str, str] | None = None,
                        progress: bool = True) -> dict[str, Any]:
    """Send `requests` and return the result dict (vllm bench serve's names); a request with a tenant goes
    with `tenant_keys[tenant]` instead of `api_key`."""
    if burstiness <= 0 or request_rate <= 0:
        raise ValueError("request_rate and burstiness must be > 0")
    url = base_url.rstrip("/") + "/v1/completions"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limit = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    bar = tqdm(total=len(requests), desc="bench serve", unit="req", disable=not progress)

    async def one(http: httpx.AsyncClient, request: BenchRequest) -> RequestResult:
        own = {"Authorization": f"Bearer {tenant_keys[request.tenant]}"} if request.tenant else None
        if limit is None:
            result = await send_request(http, url, model, request, own)
        else:
            async with limit:
                result = await send_request(http, url, model, request, own)
        bar.update(1)
        return result

    pool = httpx.Limits(max_connections=max_concurrency or len(requests))
    async with httpx.AsyncClient(timeout=httpx.Timeout(None), headers=headers, limits=pool) as http:
        if model is None:  # the server's first (for ours and a plain vLLM: only) model
            any_key = api_key or next(iter((tenant_keys or {}).values()), None)
            models = await http.get(base_url.rstrip("/") + "/v1/models",
                                    headers={"Authorization": f"Bearer {any_key}"} if any_key else None)
            models.raise_for_status()
            model = models.json()["data"][0]["id"]
        start = time.perf_counter()
        tasks = []
        for request, gap in zip(requests, arrival_gaps(len(requests), request_rate, burstiness, seed)):
            await asyncio.sleep(gap)
            tasks.append(asyncio.create_task(one(http, request)))
        results = await asyncio.gather(*tasks)
        duration = time.perf_counter() - start
    bar.close()
    return summarize(requests, results, duration, request_rate=request_rate, burstiness=burstiness,
                     max_concurrency=max_concurrency, model=model)


def summarize(requests: list[BenchRequest], results: list[RequestResult], duration: float,
              **settings: Any) -> dict[str, Any]:
    done = [(q, r) for q, r in zip(requests, results) if r.success]
    n_in = sum(r.input_tokens for _, r in done)
    n_out = sum(r.output_tokens for _, r in done)
    per_s = (lambda x: x / duration) if duration > 0 else (lambda x: math.nan)
    tpot = [(r.latency - r.ttft) / (r.output_tokens - 1) for _, r in done if r.output_tokens > 1]
    return {
        **settings, "num_prompts": len(requests), "duration": duration, "completed": len(done),
        "failed": len(results) - len(done), "total_input_tokens": n_in, "total_output_tokens": n_out,
        "request_throughput": per_s(len(done)), "output_throughput": per_s(n_out),
        "total_token_throughput": per_s(n_in + n_out),
        **latency_summary("ttft", [r.ttft for _, r in done]), **latency_summary("tpot", tpot),
        **latency_summary("itl", [gap for _, r in done for gap in r.itl]),
        **latency_summary("e2el", [r.latency for _, r in done]),
        "input_lens": [r.input_tokens for _, r in done], "output_lens": [r.output_tokens for _, r in done],
        "ttfts": [r.ttft for _, r in done], "itls": [r.itl for _, r in done],
        "generated_texts": [r.generated_text for _, r in done], "errors": [r.error for r in results if r.error],
        **({"tenants": tenant_rows(requests, results, duration)} if any(q.tenant for q in requests) else {}),
    }


def tenant_rows(requests: list[BenchRequest], results: list[RequestResult], duration: float) -> dict[str, Any]:
    """Per tenant: requests sent and completed, output tok/s and mean TTFT of the completed ones."""
    rows: dict[str, Any] = {}
    for tenant in dict.fromkeys(q.tenant for q in requests):
        mine = [r for q, r in zip(requests, results) if q.tenant == tenant]
        done = [r for r in mine if r.success]
        rows[tenant] = {"num_prompts": len(mine), "completed": len(done),
                        "output_throughput": sum(r.output_tokens for r in done) / duration if duration > 0 else math.nan,
                        "mean_ttft_ms": 1000 * sum(r.ttft for r in done) / len(done) if done else math.nan}
    return rows


def add_bench_serve_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--base-url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default=None, help="the served model's name (default: the server's first)")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--tenants", metavar="MIX", default=None,
                        help="share the requests among tenants, e.g. a:3,b:1 (needs --api-key-file)")
    parser.add_argument("--api-key-file", default=None, help="the server's key file: each tenant's key")
    parser.add_argument("--num-prompts", type=int, default=100)
    parser.add_argument("--random-input-len", type=int, default=128)
    parser.add_argument("--random-output-len", type=int, default=64)
    parser.add_argument("--dataset-path", default=None, help='JSONL of {"prompt": ..., "output_len": ...}')
    parser.add_argument("--request-rate", type=float, default=math.inf, help="requests/s (default: inf, all at once)")
    parser.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of the gaps: 1 is Poisson")
    parser.add_argument("--max-concurrency", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--result-file", default=None, help="write the result JSON here")


def main(args: argparse.Namespace) -> dict[str, Any]:
    """Measure the run, predict it (`--simulate`, serving_lab/bench_predict.py), or only predict it
    (`--dry-run`); print a summary and write the result JSON."""
    from serving_lab.bench_predict import comparison, predict

    if args.dataset_path:
        requests = load_prompts(args.dataset_path, args.num_prompts)
    else:
        requests = synthetic_requests(args.num_prompts, args.random_input_len, args.random_output_len, args.seed)
    keys = None
    if args.tenants is not None:
        if args.api_key_file is None:
            raise ValueError("--tenants: a server knows a tenant by its API key; give --api-key-file (the "
                             "server's key file)")
        mix = parse_tenant_mix(args.tenants, "--tenants")
        requests, keys = assign_tenants(requests, mix), tenant_keys(args.api_key_file, list(mix))
    elif args.api_key_file is not None:
        raise ValueError("--api-key-file goes with --tenants (one key for every request: --api-key)")
    settings = dict(request_rate=args.request_rate, burstiness=args.burstiness, seed=args.seed,
                    max_concurrency=args.max_concurrency)
    predicting = dict(settings, config=args.config, hardware=args.hardware,
                      frontend_latency_ms=args.frontend_latency_ms)
    if args.dry_run:
        result = {**settings, "num_prompts": len(requests), "simulated": predict(requests, **predicting)}
        print(comparison(None, result["simulated"]))
    else:
        result = asyncio.run(run_benchmark(args.base_url, requests, model=args.model, api_key=args.api_key,
                                           tenant_keys=keys, **settings))
        print(f"completed {result['completed']}/{result['num_prompts']} in {result['duration']:.2f} s: "
              f"{result['output_throughput']:.1f} output tok/s, mean TTFT {result['mean_ttft_ms']:.1f} ms, "
              f"mean ITL {result['mean_itl_ms']:.1f} ms")
        for tenant, row in result.get("tenants", {}).items():
            print(f"  tenant {tenant}: completed {row['completed']}/{row['num_prompts']}, "
                  f"{row['output_throughput']:.1f} output tok/s, mean TTFT {row['mean_ttft_ms']:.1f} ms")
        if args.simulate:
            result["simulated"] = predict(requests, **predicting)
            print(comparison(result, result["simulated"]))
    if args.result_file:
        Path(args.result_file).write_text(json.dumps(result, indent=1), encoding="utf-8")
    return result
