"""Lesson 6: the architecture map. The boxes as a diagram, and requests traced through a running server.

`architecture_diagram` draws the boxes of `serving-lab serve` (two processes, ZeroMQ between them) and the
path of one request. `TracedServer` starts the real server (`serving-lab serve --trace-requests`) in a
subprocess, as a user would, and warms it with one request; `trace_request` streams one completion from it and reads back the request's
timeline (GET /debug/trace/<id>), and `traced_load` does the same for requests sent together.
`ttft_breakdown` and `step_rows` say where the time went, box by box, on one clock; `simulated_request`
and `load_rows` put the simulator's prediction (this machine's calibrated profile) next to the measurement.

`request_sequence` draws one streamed request as a sequence diagram; `demo` is `serving-lab demo serve`.

Lesson: lessons/06-architecture-map.md#one-request-traced
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from statistics import fmean, median
from typing import Any

import httpx

from core.config import EngineConfig
from core.metrics import relative_error
from core.workload import Workload, WorkloadRequest
from course.demo import GPU, DemoContext, DemoReport, gpu_name, plot_comparison, side_by_side
from course.drawing import ARROW, COLORS, arrow, box, canvas
from serving_lab.pairing import Sides
from sim.cost_model import BatchShape

# ---- the diagram ----

# (name, process, x, y, what it does); x, y are the box's centre on a 12 x 7 canvas
BOXES: tuple[tuple[str, str, float, float, str], ...] = (
    ("client", "client", 1.0, 5.6, "HTTP + SSE"),
    ("API server", "api", 3.5, 5.6, "FastAPI: parse, check, admit (429)"),
    ("tokenizer", "api", 3.5, 4.0, "prompt -> token ids"),
    ("streamer", "api", 3.5, 1.2, "deltas -> SSE chunks"),
    ("engine core", "core", 8.5, 5.6, "busy loop: step()"),
    ("scheduler", "core", 6.4, 4.0, "who runs, how many tokens"),
    ("KV cache manager", "core", 6.4, 2.6, "block tables, prefix cache"),
    ("block pool", "core", 6.4, 1.2, "free queue, ref counts"),
    ("model runner", "core", 10.6, 4.0, "batch -> logits"),
    ("attention", "core", 10.6, 2.6, "paged KV reads"),
    ("sampler", "core", 10.6, 1.2, "logits -> tokens"),
    ("detokenizer", "core", 8.5, 2.6, "tokens -> text"),
)
# (from, to, label, where the label sits along the arrow): one request's path, numbered in the order taken
ARROWS: tuple[tuple[str, str, str, float], ...] = (
    ("client", "API server", "1 POST", 0.5),
    ("API server", "tokenizer", "2", 0.5),
    ("tokenizer", "engine core", "3 ZeroMQ", 0.5),
    ("engine core", "scheduler", "4 schedule", 0.5),
    ("scheduler", "KV cache manager", "5 slots", 0.5),
    ("KV cache manager", "block pool", "6 blocks", 0.5),
    ("engine core", "model runner", "7 execute", 0.5),
    ("model runner", "attention", "8", 0.5),
    ("attention", "sampler", "9", 0.5),
    ("sampler", "detokenizer", "10", 0.5),
    ("detokenizer", "streamer", "11 ZeroMQ", 0.75),
    ("streamer", "client", "12 SSE", 0.5),
)
PROCESSES = {"api": ("API-server process", "#dbe9f6", 2.4, 0.6, 4.6, 6.6),
             "core": ("engine-core process", "#fbe3cf", 5.3, 0.6, 11.7, 6.6)}


def architecture_diagram(path: str | Path | None = None):
    """The boxes of `serving-lab serve` and one request's path through them, as a matplotlib figure (saved
    to `path` as well when given: the lesson's image is this figure)."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    fig, ax = plt.subplots(figsize=(12, 6.2))
    ax.set_xlim(0, 12)
    ax.set_ylim(0.4, 7)
    ax.axis("off")
    for label, color, x0, y0, x1, y1 in PROCESSES.values():
        ax.add_patch(FancyBboxPatch((x0, y0), x1 - x0, y1 - y0, boxstyle="round,pad=0.05", fc=color, ec="grey"))
        ax.text((x0 + x1) / 2, y1 - 0.2, label, ha="center", va="top", fontsize=10, style="italic")
    patches, centre = {}, {}
    for name, process, x, y, what in BOXES:
        centre[name] = (x, y)
        patches[name] = ax.add_patch(FancyBboxPatch((x - 0.9, y - 0.38), 1.8, 0.76, boxstyle="round,pad=0.03",
                                                    fc="white", ec="grey" if process == "client" else "black"))
        ax.text(x, y + 0.1, name, ha="center", va="center", fontsize=9, weight="bold")
        ax.text(x, y - 0.18, what, ha="center", va="center", fontsize=6.5)
    for start, end, label, where in ARROWS:  # clipped at the boxes' edges
        ax.annotate("", centre[end], centre[start], arrowprops=dict(
            arrowstyle="-|>", color="#444", lw=1.1, patchA=patches[start], patchB=patches[end]))
        (x0, y0), (x1, y1) = centre[start], centre[end]
        ax.text(x0 + where * (x1 - x0) + 0.08, y0 + where * (y1 - y0) + 0.08, label, fontsize=7.5, color="#a33")
    ax.set_title("serving-lab serve: the boxes, and one request's path (1-12)", fontsize=11)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=80)
    return fig


# ---- a traced server ----

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TracedServer:
    """`serving-lab serve --trace-requests` in a subprocess, for a `with` block: started and healthy on
    entry, stopped with SIGINT (a graceful shutdown) on exit. `args`: more flags of `serve`."""

    def __init__(self, *args: str, startup_timeout_s: float = 300.0) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = args
        self.startup_timeout_s = startup_timeout_s
        self.process: subprocess.Popen | None = None
        self.client = httpx.Client(timeout=300)  # one client, reused: a new one costs an SSL context

    def __enter__(self) -> TracedServer:
        root = str(Path(__file__).resolve().parents[1])  # the repository, importable in the child as here
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (root, os.environ.get("PYTHONPATH"))))}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "serving_lab.cli", "serve", "--port", str(self.port), "--trace-requests",
             *self.args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited with {self.process.returncode}: "
                                   f"{self.process.stderr.read()[-2000:]}")
            try:
                if self.client.get(f"{self.url}/health").status_code == 200:
                    # the first request pays one-time costs (lazy imports, first allocations): not traced ones
                    self.client.post(f"{self.url}/v1/completions",
                                     json={"prompt": [1, 2, 3], "max_tokens": 2}).raise_for_status()
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        self.__exit__(None, None, None)
        raise RuntimeError(f"the server was not healthy after {self.startup_timeout_s:.0f} s")

    def __exit__(self, *exc: Any) -> None:
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process.stderr.close()
        self.client.close()

    def metrics(self) -> dict[str, float]:
        """Every sample of GET /metrics, by name with labels."""
        samples = {}
        for line in self.client.get(f"{self.url}/metrics").text.splitlines():
            if line and not line.startswith("#") and "_created{" not in line:
                name, value = line.rsplit(" ", 1)
                samples[name] = float(value)
        return samples


@dataclass
class TracedRequest:
    """One streamed completion: the client's clock (perf_counter, shared with the server on this machine)
    and the server's timeline of it (GET /debug/trace/<request_id>)."""

    request_id: str
    prompt_len: int
    output_len: int
    sent: float  # when the client started sending
    chunks: list[float] = field(default_factory=list)  # when each SSE chunk with tokens reached the client
    events: list[dict[str, Any]] = field(default_factory=list)

    def times(self, event: str) -> list[float]:
        return [e["time"] for e in self.events if e["event"] == event]

    def steps(self) -> list[dict[str, Any]]:
        """The engine core's "scheduled" events' attributes, one per step that ran this request."""
        return [e["attrs"] for e in self.events if e["event"] == "scheduled"]


def trace_request(server: TracedServer, prompt_len: int, output_len: int, request_id: str,
                  seed: int = 0) -> TracedRequest:
    """Stream one completion (a seeded prompt of `prompt_len` token ids, exactly `output_len` tokens, greedy)
    and fetch its trace."""
    rng = random.Random(seed)
    body = {"prompt": [rng.randrange(1000, 40000) for _ in range(prompt_len)], "max_tokens": output_len,
            "ignore_eos": True, "temperature": 0, "stream": True}
    traced = TracedRequest(request_id, prompt_len, output_len, sent=time.perf_counter())
    with server.client.stream("POST", f"{server.url}/v1/completions", json=body,
                              headers={"X-Request-Id": request_id}) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data: {"):
                traced.chunks.append(time.perf_counter())
    trace = server.client.get(f"{server.url}/debug/trace/{request_id}")
    trace.raise_for_status()
    traced.events = trace.json()["events"]
    return traced


def traced_load(server: TracedServer, num_requests: int, prompt_len: int, output_len: int,
                prefix: str = "load") -> list[TracedRequest]:
    """`num_requests` traced completions sent at once (one client thread each), in sending order."""
    with ThreadPoolExecutor(num_requests) as pool:
        futures = [pool.submit(trace_request, server, prompt_len, output_len, f"{prefix}-{i}", i)
                   for i in range(num_requests)]
        return [f.result() for f in futures]


# ---- where the time went ----

def ttft_breakdown(traced: TracedRequest) -> list[dict[str, Any]]:
    """The time to first token, box by box along the request's path, from the client's send to its first
    chunk. Consecutive events on one clock, so the rows add up to the client's TTFT exactly."""
    first_step_end = traced.times("sampled")[len(_prefill_steps(traced)) - 1]
    path = [("client -> API server", "network, HTTP parsing, body validation", traced.times("arrived")[0]),
            ("API server", "checks, tokenization", traced.times("tokenized")[0]),
            ("API server", "params, admission, response start, hand-off", traced.times("sent_to_core")[0]),
            ("ZeroMQ", "to the engine core", traced.times("queued")[0]),
            ("scheduler", "queueing: waiting for a step", traced.times("scheduled")[0]),
            ("model runner + sampler", "prefill step(s): forward, sample, update", first_step_end),
            ("detokenizer", "the step's outputs, text included", traced.times("detokenized")[0]),
            ("ZeroMQ", "back to the API server", traced.times("output_received")[0]),
            ("streamer", "SSE chunk built, handed to uvicorn", traced.times("chunk_sent")[0]),
            ("network", "uvicorn's write, to the client", traced.chunks[0])]
    ttft = traced.chunks[0] - traced.sent
    rows, previous = [], traced.sent
    for where, what, end in path:
        rows.append({"box": where, "what": what, "ms": 1000 * (end - previous),
                     "share_pct": 100 * (end - previous) / ttft})
        previous = end
    return rows


def _prefill_steps(traced: TracedRequest) -> list[dict[str, Any]]:
    return [s for s in traced.steps() if s["num_computed_tokens"] < traced.prompt_len]


def step_rows(traced: TracedRequest) -> list[dict[str, Any]]:
    """One row per step that produced a token: its phase and batch, how long the core spent on it (forward
    + sampling, detokenization, the loop's gap before it) and how long the token then took to reach the
    client; `itl_ms` is the gap the client saw since the previous chunk."""
    steps = traced.steps()
    sampled, detokenized = traced.times("sampled"), traced.times("detokenized")
    scheduled = traced.times("scheduled")
    received, written = traced.times("output_received"), traced.times("chunk_sent")
    num_prefill = len(_prefill_steps(traced))
    rows = []
    for k in range(len(detokenized)):  # the k-th output: the step num_prefill - 1 + k
        s = num_prefill - 1 + k
        rows.append({
            "token": k + 1, "phase": "prefill" if k == 0 else "decode", "num_tokens": steps[s]["num_tokens"],
            "batch_size": steps[s]["batch_size"],
            "loop_gap_ms": 1000 * (scheduled[s] - sampled[s - 1]) if s else None,
            "forward_sample_ms": 1000 * (sampled[s] - scheduled[s]),
            "detokenize_ms": 1000 * (detokenized[k] - sampled[s]),
            "to_api_ms": 1000 * (received[k] - detokenized[k]), "sse_ms": 1000 * (written[k] - received[k]),
            "network_ms": 1000 * (traced.chunks[k] - written[k]),
            "itl_ms": 1000 * (traced.chunks[k] - traced.chunks[k - 1]) if k else None})
    return rows


# ---- the simulator's prediction ----

def _measured(traced: TracedRequest) -> dict[str, float]:
    """The request's TTFT and mean ITL seen by the engine core (queued -> outputs built) and the client."""
    detokenized = traced.times("detokenized")
    core_itl = [b - a for a, b in zip(detokenized, detokenized[1:])]
    client_itl = [b - a for a, b in zip(traced.chunks, traced.chunks[1:])]
    return {"core_ttft_ms": 1000 * (detokenized[0] - traced.times("queued")[0]),
            "client_ttft_ms": 1000 * (traced.chunks[0] - traced.sent),
            "core_itl_ms": 1000 * sum(core_itl) / len(core_itl),
            "client_itl_ms": 1000 * sum(client_itl) / len(client_itl)}


def simulated_request(traced: TracedRequest, sides: Sides, config: EngineConfig | None = None
                      ) -> list[dict[str, Any]]:
    """The simulator's TTFT and mean ITL for the same request alone (same lengths, the server's config),
    next to what the engine core and the client measured; errors relative to the core's numbers (the
    simulator models the engine, not HTTP) and to the client's."""
    workload = Workload((WorkloadRequest(0.0, traced.prompt_len, traced.output_len),), name="one request")
    simulated = sides.simulator(config or EngineConfig()).run(workload)
    measured = _measured(traced)
    rows = []
    for metric, value in (("ttft_ms", simulated.mean_ttft_ms), ("itl_ms", simulated.mean_itl_ms)):
        core, client = measured[f"core_{metric}"], measured[f"client_{metric}"]
        rows.append({"metric": metric, "client": client, "engine_core": core, "simulated": value,
                     "simulated_err_pct": relative_error(value, core),
                     "vs_client_err_pct": relative_error(value, client)})
    return rows


def request_slowdown(traced: TracedRequest, sides: Sides) -> tuple[float, float]:
    """`common.machine_slowdown` for a request that ran alone, as (the median over its steps, its first step
    alone): the core's forward + sampling time over the cost model's price of that step (one row: its new
    tokens after its cached context). About 1 while the machine is in the state its profile was fitted in;
    both gate the timing claims of the experiments run beside it (`claims.machine_note(..., slowdowns=...)`).
    The first step is the prefill, all of a TTFT's compute: one slow prefill moves the TTFT a lot and the
    median of the decode steps not at all."""
    cost_model = sides.cost_model()
    sampled, scheduled = traced.times("sampled"), traced.times("scheduled")
    ratios = [(sampled[i] - scheduled[i])
              / cost_model.step_time(BatchShape((step["num_tokens"],), (step["num_computed_tokens"],)))
              for i, step in enumerate(traced.steps())]
    return median(ratios), ratios[0]


def load_rows(load: list[TracedRequest], sides: Sides, config: EngineConfig) -> list[dict[str, Any]]:
    """Per request of a traced load: when it reached the core, how long it queued, its TTFT at the core;
    then the simulator's, fed the same lengths and arrivals. Rows are in the order the requests reached the
    core. Time 0 is the core's first step: the core reads every message waiting before it steps, so the
    requests that reached it before that step are candidates of one batch, and the simulator gets them
    together at 0 (fed their own arrival times, it would start a step on the first alone)."""
    load = sorted(load, key=lambda t: t.times("queued")[0])
    t0 = min(t.times("scheduled")[0] for t in load)
    workload = Workload(tuple(WorkloadRequest(max(0.0, t.times("queued")[0] - t0), t.prompt_len, t.output_len)
                              for t in load), name="traced load")
    simulated = sides.simulator(config).run(workload).requests
    rows = []
    for t, s in zip(load, simulated):
        queued, scheduled = t.times("queued")[0], t.times("scheduled")[0]
        ttft = 1000 * (t.times("detokenized")[0] - queued)
        sim_ttft = 1000 * s.ttft
        rows.append({"request_id": t.request_id, "arrival_ms": 1000 * max(0.0, queued - t0),
                     "queue_ms": 1000 * (scheduled - queued),
                     "sim_queue_ms": 1000 * (s.first_scheduled_time - s.arrival_time),
                     "first_step_batch": t.steps()[0]["batch_size"], "ttft_ms": ttft, "sim_ttft_ms": sim_ttft,
                     "sim_ttft_ms_err_pct": relative_error(sim_ttft, ttft)})
    return rows


def max_batch_size(load: list[TracedRequest]) -> int:
    """The largest batch any traced step ran (the core's decision: never above `max_num_seqs`)."""
    return max(s["batch_size"] for t in load for s in t.steps())


def admission_order(load: list[TracedRequest]) -> tuple[list[str], list[str]]:
    """(the order the requests reached the core, the order they were first scheduled): equal under FCFS."""
    by_queued = sorted(load, key=lambda t: t.times("queued")[0])
    by_scheduled = sorted(load, key=lambda t: (t.times("scheduled")[0], t.times("queued")[0]))
    return [t.request_id for t in by_queued], [t.request_id for t in by_scheduled]


# ---- the diagram ----


def request_sequence():
    """Lesson 6: the sequence diagram of one streamed request, numbered as the lesson's table and trace are."""
    lanes = ["client", "API server", "engine core", "scheduler +\nKV cache", "model runner\n+ sampler"]
    messages = [(0, 1, "1 POST /v1/completions"), (1, 1, "2 tokenize, check length"),
                (1, 2, "3 EngineCoreRequest (ZeroMQ)"), (2, 3, "4-6 schedule: admit, allocate slots"),
                (2, 4, "7-9 forward + sample"), (4, 2, "token"), (2, 2, "10 detokenize"),
                (2, 1, "11 outputs (ZeroMQ)"), (1, 0, "12 SSE chunk"), (2, 3, "next step: 4-12 again ...")]
    fig, ax = canvas(11, 5.6, (-0.5, len(lanes) * 2.4 - 1.5), (0, len(messages) + 1.8))
    top = len(messages) + 1
    for i, lane in enumerate(lanes):
        x = i * 2.4
        box(ax, x, top + 0.3, lane, COLORS[i % len(COLORS)], fontsize=8.5)
        ax.plot([x, x], [0.2, top - 0.2], color="#999", lw=1, ls="--")
    for row, (src, dst, label) in enumerate(messages):
        y = top - 1 - row
        if src == dst:  # work inside one box: a short loop
            ax.annotate("", (src * 2.4 + 0.05, y - 0.35), (src * 2.4 + 0.05, y),
                        arrowprops=dict(arrowstyle="-|>", color=ARROW, connectionstyle="arc3,rad=-1.2"))
            ax.text(src * 2.4 + 0.35, y - 0.2, label, fontsize=7.5, color="#a33", va="center")
        else:
            arrow(ax, (src * 2.4, y), (dst * 2.4, y), label, fontsize=7.5, offset=(0, 0.04))
    ax.set_title("One streamed request, box by box (the numbers are lesson 6's table and trace events)", fontsize=11)
    fig.tight_layout()
    return fig


# ---- the demo (serving-lab demo) ----

DEMO_PRESETS = {  # notebook 06's fast sizes
    "full": dict(prompt_len=64, output_len=8, burst=6, burst_prompt_len=32, max_num_seqs=2),
    "fast": dict(prompt_len=16, output_len=3, burst=3, burst_prompt_len=8, max_num_seqs=2),
}


def demo(context: DemoContext) -> DemoReport:
    """The OpenAI-compatible server (`serving-lab serve --trace-requests`, started as a user
    would, `TracedServer`), one streamed request traced through its boxes and then a burst that queues behind
    `max_num_seqs`, each beside the simulator's prediction of the same requests (`simulated_request`,
    `load_rows`). The simulator models the engine core, so its error is against the core's clock; the client's
    numbers add HTTP, tokenization and ZeroMQ. Then the same request on a simulated H100."""
    p = context.preset(DEMO_PRESETS)
    config = EngineConfig(max_num_seqs=p["max_num_seqs"])
    model = (context.model_path,) if context.model_path else ()  # `serve MODEL`, as `vllm serve`
    with TracedServer("--max-num-seqs", str(p["max_num_seqs"]), *model) as server:
        one = trace_request(server, p["prompt_len"], p["output_len"], "demo-one")
        burst = traced_load(server, p["burst"], p["burst_prompt_len"], p["output_len"], prefix="demo-burst")
    sides = Sides(arch=context.model.arch, hardware=context.profile, measure=False)
    # (measured, simulated) rows as the other experiments make them: the request alone on both clocks ...
    prediction = simulated_request(one, sides, config)
    slowdown, prefill_slowdown = request_slowdown(one, sides)
    alone = []
    for clock, column in (("engine core", "engine_core"), ("client", "client")):
        alone_on = {"requests": "one alone", "clock": clock}
        alone += [{**alone_on, "side": "measured", "slowdown": slowdown, "prefill_slowdown": prefill_slowdown,
                   **{r["metric"]: r[column] for r in prediction}},
                  {**alone_on, "side": "simulated", **{r["metric"]: r["simulated"] for r in prediction}}]
    # ... and the burst's means on the core's clock
    queued = load_rows(burst, sides, config)
    means = {"requests": f"burst of {p['burst']}, mean", "clock": "engine core"}
    burst_means = [{**means, "side": side, **{metric: fmean(r[f"{prefix}{metric}"] for r in queued)
                                              for metric in ("queue_ms", "ttft_ms")}}
                   for side, prefix in (("measured", ""), ("simulated", "sim_"))]
    columns = ("requests", "clock")
    comparison = (side_by_side(alone, columns, ("ttft_ms", "itl_ms"))
                  + side_by_side(burst_means, columns, ("queue_ms", "ttft_ms")))
    figure, (queue,) = plot_comparison(comparison, columns, f"serving-lab serve, max_num_seqs={p['max_num_seqs']}: one "
                                       f"request alone ({p['prompt_len']} tokens in, {p['output_len']} out), then a "
                                       f"burst of {p['burst']} ({p['burst_prompt_len']} in): measured vs simulated")
    queue.plot([r["queue_ms"] for r in queued], "s-", label="measured")
    queue.plot([r["sim_queue_ms"] for r in queued], "o--", label="simulated")
    queue.set(xticks=range(len(queued)), xlabel="burst request, in the order it reached the core",
              ylabel="queue time (ms)")
    queue.legend(fontsize=7)
    gpu = {r["metric"]: r["simulated"] for r in simulated_request(one, GPU, config)}
    return DemoReport(comparison, columns, figure, notes=[
        f"GPU what-if, {gpu_name()}: the same request alone: TTFT {gpu['ttft_ms']:.1f} ms, ITL {gpu['itl_ms']:.1f} ms",
    ])
