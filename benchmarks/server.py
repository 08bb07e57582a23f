"""What serving over HTTP costs, against the offline engine and llama.cpp's server, and how well
`bench serve --simulate` predicts it (issue 13).

    python benchmarks/server.py [--quick] [--port 8011] [--hardware NAME]

Starts `serving-lab serve` on the default model (SmolLM2-135M-Instruct) as a subprocess and measures:

(a) Server overhead. The same requests (synthetic token-id prompts of 128 tokens, fixed output lengths,
    `ignore_eos`) at concurrency 1, 8 and 32: through HTTP streaming (`bench serve --max-concurrency c`)
    and through the offline engine in this process (`LLMEngine`, with the same cap: a new request is added
    whenever one finishes, TTFT counted from its add). Output tok/s, TTFT mean and p99. Goal: the server
    loses under 10% of the offline throughput at concurrency 32.
(b) llama.cpp's HTTP server, as reference figures measured on this kind of 2-core machine on the same GGUF
    (not run here): one request at a time, 41-49 output tok/s at any concurrency, TTFT 0.5 s for a 128-token
    prompt. Goal: at least 3x the upper figure (49 tok/s) at concurrency 32, with p99 TTFT reported.
(c) The simulator's prediction (`bench_predict.predict`, this machine's calibrated profile, the front-end
    latency taken as the server's TTFT minus the offline TTFT at concurrency 1) against the measured
    server at two Poisson request rates below saturation (30% and 60% of the request rate measured at
    concurrency 32). Goal: within 20% on output throughput and mean TTFT.

`--hardware NAME` predicts on a named profile instead of the calibrated one (e.g. `local-cpu`, to smoke-test
the script without calibrating). Prints a Markdown block (machine, command, numbers, goals met or not) for benchmarks/RESULTS.md. `--quick`
runs fewer and shorter requests: a smoke run, not a result.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass

import httpx
import torch

from core.metrics import latency_summary
from ref_engine.engine import LLMEngine
from ref_engine.sampling_params import RequestOutputKind, SamplingParams
from serving_lab.bench_predict import predict
from serving_lab.bench_serve import BenchRequest, run_benchmark, synthetic_requests
from serving_lab.calibrate import load_or_calibrate

CONCURRENCIES = (1, 8, 32)
PROMPT_LEN = 128
LLAMA_CPP_TOK_S = (41.0, 49.0)  # reference figures (module docstring), not measured here
LLAMA_CPP_TTFT_S = 0.5
OVERHEAD_GOAL = 0.10
SPEEDUP_GOAL = 3.0
PREDICTION_GOAL = 0.20
RATE_SHARES = (0.3, 0.6)


@dataclass(frozen=True)
class Sizes:
    output_len: int
    requests_per_slot: int  # requests per concurrency slot: c x this many at concurrency c


QUICK, FULL = Sizes(output_len=16, requests_per_slot=1), Sizes(output_len=128, requests_per_slot=4)


def offline_run(engine: LLMEngine, requests: list[BenchRequest], concurrency: int) -> dict[str, float]:
    """The requests through the engine with at most `concurrency` open (vllm bench serve's cap, offline):
    output tok/s and TTFT from each request's add."""
    pending = list(enumerate(requests))
    added: dict[str, float] = {}
    ttft: dict[str, float] = {}
    num_open = num_tokens = 0
    start = time.perf_counter()
    while pending or num_open:
        while pending and num_open < concurrency:
            i, request = pending.pop(0)
            params = SamplingParams(max_tokens=request.output_len, temperature=0.0, ignore_eos=True,
                                    output_kind=RequestOutputKind.DELTA)
            engine.add_request(str(i), {"prompt_token_ids": request.prompt}, params)
            added[str(i)] = time.perf_counter()
            num_open += 1
        for output in engine.step():
            ttft.setdefault(output.request_id, time.perf_counter() - added[output.request_id])
            num_tokens += len(output.outputs[0].token_ids)
            num_open -= output.finished
    duration = time.perf_counter() - start
    return {"output_throughput": num_tokens / duration, **latency_summary("ttft", list(ttft.values()))}


def start_server(port: int) -> subprocess.Popen:
    """`serving-lab serve` on the default model, once /health says it is ready."""
    server = subprocess.Popen([sys.executable, "-m", "serving_lab.cli", "serve", "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and server.poll() is None:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                return server
        except httpx.ConnectError:
            pass
        time.sleep(0.5)
    server.kill()
    raise RuntimeError(f"serving-lab serve did not become healthy (exit code {server.poll()})")


def row(*cells: object) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def verdict(met: bool) -> str:
    return "met" if met else "NOT met"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer, shorter requests: a smoke run")
    parser.add_argument("--port", type=int, default=8011)
    parser.add_argument("--hardware", default=None, help="a profile for (c) (default: this machine's calibrated one)")
    args = parser.parse_args()
    sizes = QUICK if args.quick else FULL
    url = f"http://127.0.0.1:{args.port}"

    def workload(num: int, seed: int = 0) -> list[BenchRequest]:
        return synthetic_requests(num, PROMPT_LEN, sizes.output_len, seed)

    # the profile first: a calibration between the measured runs would leave the server idle for minutes and
    # hand (c) a profile of whatever speed the machine had then
    hardware = args.hardware or load_or_calibrate()
    engine = LLMEngine()
    offline_run(engine, workload(2), 2)  # warm-up
    offline = {c: offline_run(engine, workload(c * sizes.requests_per_slot), c) for c in CONCURRENCIES}
    del engine

    server = start_server(args.port)
    try:
        asyncio.run(run_benchmark(url, workload(2), max_concurrency=2, progress=False))  # warm-up
        served = {c: asyncio.run(run_benchmark(url, workload(c * sizes.requests_per_slot), max_concurrency=c,
                                               progress=False)) for c in CONCURRENCIES}
        saturation = served[CONCURRENCIES[-1]]["request_throughput"]
        frontend_ms = max(0.0, served[1]["mean_ttft_ms"] - offline[1]["mean_ttft_ms"])
        predictions = []
        for share in RATE_SHARES:
            rate = share * saturation
            requests = workload(max(16, round(rate * 60)) if not args.quick else 8, seed=1)  # about a minute
            measured = asyncio.run(run_benchmark(url, requests, request_rate=rate, seed=1, progress=False))
            simulated = predict(requests, request_rate=rate, seed=1, frontend_latency_ms=frontend_ms,
                                hardware=hardware)
            predictions.append((share, rate, measured, simulated))
    finally:
        server.terminate()
        server.wait(60)

    top = CONCURRENCIES[-1]
    loss = 1 - served[top]["output_throughput"] / offline[top]["output_throughput"]
    speedup = served[top]["output_throughput"] / LLAMA_CPP_TOK_S[1]
    print(f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"{torch.get_num_threads()} torch threads, torch {torch.__version__}, {datetime.date.today()}")
    command = " ".join(["python benchmarks/server.py", *sys.argv[1:]])
    print(f"Command: `{command}`; SmolLM2-135M-Instruct, "
          f"{PROMPT_LEN}-token prompts, {sizes.output_len} output tokens, "
          f"{sizes.requests_per_slot} request(s) per concurrency slot{' (quick: a smoke run)' if args.quick else ''}")
    print()
    print(row("concurrency", "offline tok/s", "server tok/s", "server loss", "offline TTFT mean / p99 (ms)",
              "server TTFT mean / p99 (ms)", "vs llama.cpp (49 tok/s)"))
    print(row(*["---"] * 7))
    for c in CONCURRENCIES:
        off, srv = offline[c], served[c]
        print(row(c, f"{off['output_throughput']:.1f}", f"{srv['output_throughput']:.1f}",
                  f"{1 - srv['output_throughput'] / off['output_throughput']:.1%}",
                  f"{off['mean_ttft_ms']:.0f} / {off['p99_ttft_ms']:.0f}",
                  f"{srv['mean_ttft_ms']:.0f} / {srv['p99_ttft_ms']:.0f}",
                  f"{srv['output_throughput'] / LLAMA_CPP_TOK_S[1]:.1f}x"))
    print()
    print(f"- Server overhead at concurrency {top}: {loss:.1%} of offline throughput (goal < "
          f"{OVERHEAD_GOAL:.0%}): {verdict(loss < OVERHEAD_GOAL)}.")
    print(f"- Against llama.cpp's server (reference figures for this kind of 2-core machine, not measured here: "
          f"{LLAMA_CPP_TOK_S[0]:.0f}-{LLAMA_CPP_TOK_S[1]:.0f} output tok/s at any concurrency, TTFT "
          f"{LLAMA_CPP_TTFT_S} s for a 128-token prompt): {speedup:.1f}x at concurrency {top}, p99 TTFT "
          f"{served[top]['p99_ttft_ms'] / 1000:.2f} s (goal >= {SPEEDUP_GOAL:.0f}x): "
          f"{verdict(speedup >= SPEEDUP_GOAL)}.")
    print()
    print(f"Simulated (`bench serve --simulate`, profile {predictions[0][3]['hardware']}, front end "
          f"{frontend_ms:.1f} ms) against "
          f"measured, Poisson arrivals:")
    print()
    print(row("rate (req/s)", "share of saturation", "measured tok/s", "simulated tok/s", "error",
              "measured TTFT (ms)", "simulated TTFT (ms)", "error"))
    print(row(*["---"] * 8))
    within = True
    for share, rate, measured, simulated in predictions:
        errors = [simulated[k] / measured[k] - 1 for k in ("output_throughput", "mean_ttft_ms")]
        within &= all(abs(e) <= PREDICTION_GOAL for e in errors)
        print(row(f"{rate:.2f}", f"{share:.0%}", f"{measured['output_throughput']:.1f}",
                  f"{simulated['output_throughput']:.1f}", f"{errors[0]:+.1%}", f"{measured['mean_ttft_ms']:.0f}",
                  f"{simulated['mean_ttft_ms']:.0f}", f"{errors[1]:+.1%}"))
    print()
    print(f"- Prediction within {PREDICTION_GOAL:.0%} on throughput and mean TTFT at both rates: {verdict(within)}.")


if __name__ == "__main__":
    main()
