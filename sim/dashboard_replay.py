"""A simulated run as the dashboard's frames: record it, then replay it at a chosen speed.

`record_simulation` runs the simulator with a recorder on its steps: the same `StepSummarizer` the
engine core uses (core/step_summary.py), with a KV pool snapshot every `FRAME_INTERVAL_S x speed`
simulated seconds, so the replay has a fresh one for each frame. `Replay.frames` then plays the record
back, `speed` simulated seconds per second of replay, in the frames a live server sends
(core/dashboard_frames.py), so the page cannot tell them apart but for the word "simulated" and the end of
the replay (`done`). Who paces it: `serving-lab simulate --dashboard` on the wall clock
(serving_lab/dashboard_replay.py), or the course site's page in the browser (`Replay.all_frames`, played on
the page's own timer; this module runs there too, so it imports only the core and the simulator).

The six metrics move as the simulated clock passes each request's moments: its first token (TTFT, and
its prompt counted as served), each later token (an ITL gap, one token served), its end (TPOT); the
histograms use the server's buckets.

Lesson: lessons/06-architecture-map.md (the same loop, simulated).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from core.dashboard_frames import (
    FRAME_INTERVAL_S,
    RATE_WINDOW_S,
    STEP_FIELDS,
    histogram_json,
    metrics_json,
    pool_json,
    steps_json,
    tenants_json,
)
from core.metrics import LATENCY_BUCKETS, RunMetrics, StepRecord
from core.request import DEFAULT_TENANT
from core.scheduler import Scheduler
from core.step_summary import StepSummarizer, StepSummary
from core.workload import Workload
from sim.simulator import Simulator


@dataclass
class _Recorder:
    """`Simulator.run`'s `on_step`: a summary per step, and when each request was first preempted."""

    pool_interval: float
    summaries: list[StepSummary] = field(default_factory=list)
    first_preempted: list[float] = field(default_factory=list)  # the time each request was first preempted
    summarizer: StepSummarizer | None = None

    def __call__(self, scheduler: Scheduler, record: StepRecord) -> None:
        if self.summarizer is None:
            self.summarizer = StepSummarizer(scheduler, scheduler.config, self.pool_interval)
        end = record.start + record.duration
        self.summaries.append(self.summarizer.summarize(record, end))
        if record.num_preempted:  # the scheduler's running total of requests preempted at least once
            newly = scheduler.make_stats().num_preempted_reqs - len(self.first_preempted)
            self.first_preempted += [end] * newly


@dataclass(frozen=True)
class Recording:
    """A simulated run, ready to replay: its step summaries and its metrics (with every request's row)."""

    title: str
    summaries: list[StepSummary]
    run: RunMetrics
    first_preempted: list[float]  # sorted
    tenant_weights: dict[str, float] | None  # the fair policy's; None under another policy

    @property
    def end_time(self) -> float:
        last = self.summaries[-1] if self.summaries else None
        return last.start + last.duration if last else 0.0


def record_simulation(simulator: Simulator, workload: Workload, speed: float, title: str) -> Recording:
    """Run `workload` on `simulator`, recording what a replay at `speed` needs."""
    check_speed(speed)
    recorder = _Recorder(pool_interval=FRAME_INTERVAL_S * speed)
    run = simulator.run(workload, on_step=recorder)
    config = simulator.config
    weights = dict(config.tenant_weights or ()) if config.scheduling_policy == "fair" else None
    return Recording(title, recorder.summaries, run, recorder.first_preempted, weights)


def check_speed(speed: float) -> None:
    if not speed > 0:
        raise ValueError(f"--speed must be > 0 (simulated seconds per second of replay), got {speed}")


class _Moments:
    """Values observed at moments of the simulated clock, summed and bucketed as the clock passes them."""

    def __init__(self, moments: list[tuple[float, float]]) -> None:
        moments.sort()
        self.times = [t for t, _ in moments]
        self.values = [v for _, v in moments]
        self.passed = 0
        self.total = 0.0
        self.counts = [0] * (len(LATENCY_BUCKETS) + 1)

    def advance(self, until: float) -> None:
        end = bisect.bisect_right(self.times, until)
        for value in self.values[self.passed:end]:
            self.total += value
            self.counts[bisect.bisect_left(LATENCY_BUCKETS, value)] += 1
        self.passed = end

    def sum_count(self) -> tuple[float, int]:
        return self.total, self.passed


class Replay:
    """Plays one `Recording` back, to any number of pages, each from the start."""

    def __init__(self, recording: Recording, speed: float) -> None:
        check_speed(speed)
        self.recording = recording
        self.speed = speed
        self.step_ends = [s.start + s.duration for s in recording.summaries]
        self.preemptions = _cumulative([s.num_preempted for s in recording.summaries])
        rows = [r for r in recording.run.requests if r.finished]
        self.token_times = sorted(t for r in rows for t in r.token_times)
        served = [(r.first_token_time, (r.tenant or DEFAULT_TENANT, r.num_prompt_tokens))
                  for r in rows if r.first_token_time is not None]
        served += [(t, (r.tenant or DEFAULT_TENANT, 1)) for r in rows for t in r.token_times]
        served.sort(key=lambda moment: moment[0])
        self.served = served

    def _moments(self) -> dict[str, _Moments]:
        rows = [r for r in self.recording.run.requests if r.finished]
        return {"ttft": _Moments([(r.first_token_time, r.ttft) for r in rows]),
                "itl": _Moments([(b, b - a) for r in rows for a, b in zip(r.token_times, r.token_times[1:])]),
                "tpot": _Moments([(r.finish_time, r.tpot) for r in rows if r.tpot is not None])}

    def frames(self, clock: Iterable[float]) -> Iterator[dict[str, Any]]:
        """One page's replay: a frame at each moment `clock` gives (simulated seconds, increasing), the last
        one `done` (a moment past the run's end is its end). Lazy: each moment is read when its frame is
        asked for, so a paced reader's clock can be the wall clock."""
        recording = self.recording
        moments = self._moments()
        service: dict[str, int] = {}
        sent_steps = sent_service = 0
        for moment in clock:
            now = min(moment, recording.end_time)
            done = now >= recording.end_time
            num_steps = bisect.bisect_right(self.step_ends, now)
            steps = recording.summaries[sent_steps:num_steps]
            for latency in moments.values():
                latency.advance(now)
            for _, (tenant, tokens) in self.served[sent_service:(end := bisect.bisect_right(
                    self.served, now, key=lambda moment: moment[0]))]:
                service[tenant] = service.get(tenant, 0) + tokens
            sent_service = end
            pool = next((s.kv_pool for s in reversed(steps) if s.kv_pool is not None), None)
            yield {
                "source": "simulator", "title": recording.title, "done": done, "time": now,
                "num_steps": num_steps, "step_fields": STEP_FIELDS, "steps": steps_json(steps),
                "kv_pool": pool_json(pool) if pool is not None else None,
                "tenants": tenants_json(service, recording.tenant_weights),
                "metrics": self._metrics(now, num_steps, moments),
                "histograms": {name: histogram_json(LATENCY_BUCKETS, moments[name].counts) for name in ("ttft", "itl")},
            }
            if done:
                return
            sent_steps = num_steps

    def all_frames(self) -> list[dict[str, Any]]:
        """The whole replay, one frame per `FRAME_INTERVAL_S` of replay (`speed` x that of the simulated clock):
        what a page without a server (the course site's, in the browser) plays back on its own timer."""
        step = FRAME_INTERVAL_S * self.speed
        return list(self.frames(step * i for i in itertools.count()))

    def _metrics(self, now: float, num_steps: int, moments: dict[str, _Moments]) -> dict[str, Any]:
        generated = bisect.bisect_right(self.token_times, now)
        window = min(RATE_WINDOW_S, now)
        recent = generated - bisect.bisect_right(self.token_times, now - window)
        last = self.recording.summaries[num_steps - 1] if num_steps else None
        return metrics_json(
            ttft=moments["ttft"].sum_count(), itl=moments["itl"].sum_count(), tpot=moments["tpot"].sum_count(),
            generation_tokens=generated, output_rate=recent / window if window > 0 else None,
            num_preemptions=self.preemptions[num_steps],
            num_preempted_requests=bisect.bisect_right(self.recording.first_preempted, now),
            kv_usage=last.kv_usage if last else 0.0)


def _cumulative(counts: list[int]) -> list[int]:
    """[0, c0, c0 + c1, ...]: the total of the first i counts at index i."""
    totals = [0]
    for count in counts:
        totals.append(totals[-1] + count)
    return totals
