"""What `serve --dashboard` costs the engine core: its loop's step time with the dashboard on and off.

    python benchmarks/dashboard_overhead.py [--batches 1 64] [--rounds 6] [--steps 48] [--threads 1]

The engine core's loop (`EngineCore._step`: the engine's step, then building and pickling the message
for the API server) runs in this process on the default model, with sockets that pickle the message as
ZeroMQ's `send_pyobj` does and drop it. For each batch, runs alternate between the dashboard on and off
(`EngineCore(dashboard=...)`: a `StepSummary` per step, a KV pool snapshot at most every 0.1 s), each run
decoding `--steps` steps of the batch after its prefill. Reported per batch:

- the median step time of the loop, on and off (the median over runs of each run's median step), and
  their difference, as the median over rounds of each round's on/off ratio (a round is one run of each,
  back to back, so a slow drift of the machine cancels) with its range: the whole cost, but within the
  machine's noise;
- the dashboard's own work per step, timed directly: `StepSummarizer.summarize` (including the pool
  snapshots it takes) and pickling the summaries, as a share of the step time (the second pickling the
  benchmark does to time them is taken back out of the "on" step time);
- one pool snapshot of the engine's pool, the largest part of that work (taken at most 10 times a second);
- the API server's side, in its own process: building and encoding one frame of a full feed (the newest
  256 of 1024 steps, as a page that connects gets), which it does at most ten times a second per page.

Prints markdown for benchmarks/RESULTS.md ("Dashboard overhead"). A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pickle
import platform
import statistics
import time
from typing import Any

import torch

from core.kv_pool_snapshot import KVPoolSnapshot
from core.step_summary import StepSummarizer, StepSummary
from ref_engine import SamplingParams
from ref_engine.async_engine.prometheus import PrometheusStatLogger
from ref_engine.async_engine.step_feed import StepFeed
from ref_engine.engine import LLMEngine
from ref_engine.engine_core.core import EngineCore
from ref_engine.entrypoints.dashboard.live import live_frames
from ref_engine.model.loader import load_model
from ref_engine.model.store import default_model_path

PROMPT_LEN = 16


class PicklingSocket:
    """What the core's output socket costs this process: `send_pyobj` pickles (zmq's protocol), then drops.
    It also times pickling each message's step summaries alone: the dashboard's share of the pickling."""

    def __init__(self) -> None:
        self.bytes = 0
        self.summary_seconds = 0.0
        self.summaries: list[StepSummary] = []  # every summary sent, for the API server's side

    def send_pyobj(self, message: Any, flags: int = 0) -> None:
        self.bytes += len(pickle.dumps(message, pickle.HIGHEST_PROTOCOL))
        if getattr(message, "step_summaries", None):
            start = time.perf_counter()
            pickle.dumps(message.step_summaries, pickle.HIGHEST_PROTOCOL)
            self.summary_seconds += time.perf_counter() - start
            self.summaries += message.step_summaries


class TimedSummarizer(StepSummarizer):
    """A `StepSummarizer` that adds up the time it takes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seconds = 0.0

    def summarize(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        summary = super().summarize(*args, **kwargs)
        self.seconds += time.perf_counter() - start
        return summary


def run(engine: LLMEngine, batch: int, steps: int, dashboard: bool, tag: str) -> dict[str, float]:
    """One run: `batch` requests prefilled, then `steps` decode steps timed; the loop's times and, with
    the dashboard, its own work."""
    socket = PicklingSocket()
    core = EngineCore(engine, None, socket, dashboard=dashboard)
    if dashboard:
        core.summarizer = TimedSummarizer(engine.scheduler)
    params = SamplingParams(max_tokens=steps + 1, temperature=0.0, ignore_eos=True)
    for i in range(batch):
        engine.add_request(f"{tag}-{i}", {"prompt_token_ids": [1000 + (7 * i + j) % 20000 for j in range(PROMPT_LEN)]},
                           params)
    core._step()  # the prefill: not timed
    if dashboard:
        core.summarizer.seconds = socket.summary_seconds = 0.0
    times = []
    bytes_before = socket.bytes
    while engine.has_unfinished_requests():
        timing_pickle = socket.summary_seconds
        start = time.perf_counter()
        core._step()  # less the benchmark's own second pickling of the summaries
        times.append(time.perf_counter() - start - (socket.summary_seconds - timing_pickle))
    result: dict[str, Any] = {"step": statistics.median(times), "steps": len(times),
                              "bytes": (socket.bytes - bytes_before) / len(times), "summaries": socket.summaries}
    if dashboard:
        result["work"] = (core.summarizer.seconds + socket.summary_seconds) / len(times)
    return result


def frame_cost(summaries: list[StepSummary]) -> tuple[float, int]:
    """(seconds, bytes) of one frame of a full feed built from these summaries, JSON-encoded as the stream
    sends it: the API server's work per frame per page."""
    feed = StepFeed()
    while feed.num_steps < feed.steps.maxlen:
        feed.add(summaries)
    feed.add_service("default", 1000)
    frames = live_frames(feed, PrometheusStatLogger("bench").registry, "bench", None, lambda: False)

    async def one_frame() -> tuple[float, int]:
        start = time.perf_counter()
        frame = await anext(frames)
        encoded = json.dumps(frame, separators=(",", ":"), allow_nan=False)
        return time.perf_counter() - start, len(encoded)

    return asyncio.run(one_frame())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--rounds", type=int, default=6, help="runs with the dashboard on, and as many off")
    parser.add_argument("--steps", type=int, default=48, help="decode steps timed per run")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1: on a shared 2-core machine more is slower, RESULTS.md)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model(default_model_path(), dtype="float32", device="cpu")
    print(f"machine: {platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; {args.rounds} runs on and {args.rounds} off per batch, "
          f"alternating, {args.steps} decode steps each (prompts of {PROMPT_LEN} tokens)\n")
    print("| batch | step, off (ms) | step, on (ms) | difference (range over rounds) | dashboard's work per step (us) | "
          "its share of a step | message per step, off / on (bytes) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    snapshot_us = num_blocks = 0.0
    summaries: list[StepSummary] = []
    for batch in args.batches:
        engine = LLMEngine(loaded, max_num_seqs=max(batch, 1))
        run(engine, batch, 4, False, "warm-up")
        on: list[dict[str, float]] = []
        off: list[dict[str, float]] = []
        for i in range(args.rounds):
            for dashboard in ((True, False) if i % 2 == 0 else (False, True)):
                (on if dashboard else off).append(run(engine, batch, args.steps, dashboard, f"{batch}-{i}-{dashboard}"))
        step_off = statistics.median(r["step"] for r in off)
        step_on = statistics.median(r["step"] for r in on)
        work = statistics.median(r["work"] for r in on)
        ratios = sorted(a["step"] / b["step"] - 1 for a, b in zip(on, off))
        summaries = on[-1]["summaries"]
        print(f"| {batch} | {1000 * step_off:.2f} | {1000 * step_on:.2f} | {100 * statistics.median(ratios):+.1f} % "
              f"({100 * ratios[0]:+.1f} to {100 * ratios[-1]:+.1f} %) | {1e6 * work:.1f} | {100 * work / step_off:.3f} % | "
              f"{statistics.median(r['bytes'] for r in off):.0f} / {statistics.median(r['bytes'] for r in on):.0f} |")
        kv = engine.scheduler.kv_cache_manager
        num_blocks = kv.block_pool.num_blocks
        start = time.perf_counter()
        for _ in range(100):
            KVPoolSnapshot.of(kv, engine.scheduler.requests)
        snapshot_us = 1e6 * (time.perf_counter() - start) / 100
    print(f"\none KV pool snapshot of the engine's {num_blocks:.0f}-block pool (idle, prefix cache full): "
          f"{snapshot_us:.0f} us; taken at most every 0.1 s, so at most {snapshot_us / 1e3:.2f} ms a second "
          f"({snapshot_us / 1e5:.2f} % of the core's time)")
    seconds, size = frame_cost(summaries)
    print(f"one frame of a full feed (256 steps), built and JSON-encoded in the API server: {1e3 * seconds:.1f} ms, "
          f"{size / 1024:.0f} KiB; at most ten a second per page ({seconds * 1e3:.0f} % of a core at most)")


if __name__ == "__main__":
    main()
