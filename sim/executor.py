"""`SimulatedExecutor`: the engine loop of one replica, run on a SimPy clock instead of a GPU.

This module owns the simulated side of the seam between policy and execution. The real engine and this
executor drive the very same core `Scheduler`; they differ only in how a step is executed:

    real engine                              simulated executor
    schedule(now)                            schedule(env.now)
    run the model on the batch, time it      t = step_timer.step_time(output); yield env.timeout(t)
    sample one token per finished chunk      one dummy token per request that `needs_logits`
    update_from_output(output, result, now)  update_from_output(output, result, env.now)

With speculative decoding, a `SimulatedProposer` (sim/spec_decode.py) says after each step how many drafts
the verifier accepted (the scheduler rolls back the rest) and, after the update, drafts dummy tokens for
the next step: the engine's loop, move for move.

Outputs are lengths, not text: requests carry `ignore_eos`, so each ends at exactly `max_tokens`, and the
token id a step "samples" does not matter. Time comes from a `StepTimer`:
- `CostModelTimer` prices the batch with the roofline cost model (sim/cost_model.py);
- `ReplayTimer` replays measured step durations in order. Fed the real engine's step times, the
  simulator must reproduce the engine's batches and preemptions step for step: only time could ever
  make the two disagree, so with the same times there is nothing left to disagree about.

Invariants:
- simulated time only moves forward, and only in `yield`s: a step's start is the previous step's end,
  or a later arrival;
- the engine never busy-waits: when the scheduler has nothing to run it sleeps until a request arrives;
- a request arriving while a step runs joins at the next step boundary, as in a real engine. (Ties in
  time between an arrival and a step's end are broken by SimPy's deterministic event order.)
- every request handed to `add_request` either is refused (counted, ValueError from the scheduler) or
  finishes; `metrics()` raises if the scheduler stalled with requests left.

Lesson: lessons/01-continuous-batching.md (the engine loop); lessons/06-architecture-map.md (the seam);
lessons/05-speculative-decoding.md (simulated drafts).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Iterator
from typing import Protocol

import simpy

from core.interfaces import SchedulerOutput, StepResult
from core.metrics import RunMetrics, StepRecord, verifies
from core.metrics_stream import MetricsStream
from core.request import Request
from core.scheduler import Scheduler
from sim.cost_model import BatchShape

StepObserver = Callable[[Scheduler, StepRecord], None]  # `SimulatedExecutor.on_step`

# The token a simulated step "samples". Requests ignore EOS and have no stop tokens, so its value is moot.
DUMMY_TOKEN_ID = 0
DUMMY_SAMPLE = [DUMMY_TOKEN_ID]  # what every row that needs logits samples in a step without speculation


def feed_arrivals(env: simpy.Environment, requests: Iterable[Request], deliver: Callable[[Request], object],
                  delay_s: float = 0.0, max_concurrency: int | None = None) -> Generator[simpy.Event, None, None]:
    """SimPy process: `deliver(request)` at each request's `arrival_time` + `delay_s` (a server's front end,
    sim/simulator.py), in order of arrival (ties keep their order): `requests` is sorted here, unless it is an
    iterator, which is taken to be in arrival order already and read only as far as the clock has come (so
    a million requests can be made as they arrive: `Workload.iter_requests`). Requests arriving at the same time are
    delivered together, so "all at once" really reaches the first step all at once. One replica feeds its
    engine with it; a cluster, its router.

    `max_concurrency` n plays a client that keeps at most n requests open (`bench serve --max-concurrency`):
    `deliver` must then return the event that fires when the request finishes (or None if it was refused),
    and a request due while n are open waits for one of them to finish. Its `arrival_time` becomes the
    moment it is sent, because the client's clock (TTFT, end-to-end latency) starts there. (With `delay_s`,
    requests held back together reach the engine one delay apart: a bound on the error, small while the
    front end's milliseconds are small against a request's seconds.)"""
    if max_concurrency is not None and max_concurrency < 1:
        raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
    if not isinstance(requests, Iterator):
        requests = iter(sorted(requests, key=lambda r: r.arrival_time))
    open_requests: list[simpy.Event] = []
    for request in requests:
        if request.arrival_time + delay_s > env.now:
            yield env.timeout(request.arrival_time + delay_s - env.now)
        if max_concurrency is not None:
            open_requests = [event for event in open_requests if not event.triggered]
            if len(open_requests) >= max_concurrency:
                yield env.any_of(open_requests)
                open_requests = [event for event in open_requests if not event.triggered]
            if env.now > request.arrival_time + delay_s:  # held back by the cap: sent now
                request.arrival_time = env.now
                if delay_s:
                    yield env.timeout(delay_s)
        finished = deliver(request)
        if max_concurrency is not None and finished is not None:
            open_requests.append(finished)


class StepTimer(Protocol):
    """How long one engine step takes: the only thing the simulator models rather than reproduces."""

    def step_time(self, output: SchedulerOutput) -> float: ...


class Proposer(Protocol):
    """Simulated speculation as the engine loop sees it: a `SimulatedProposer` (sim/spec_decode.py, which
    imports this module, so the loop names only this protocol)."""

    def verify(self, output: SchedulerOutput) -> StepResult:
        """The tokens each row that needs logits gets after the step: accepted drafts + 1."""

    def propose(self, scheduler: Scheduler) -> None:
        """Give the scheduler drafts for its next step; called after `update_from_output`."""


class ShapePricer(Protocol):
    """Prices a `BatchShape` and a step's KV block copies: a `CostModel`, or a `PipelineCostModel` (sim/pipeline.py)."""

    def step_time(self, shape: BatchShape) -> float: ...

    def block_copy_time(self, num_swapped: int, num_copied: int) -> float: ...


class CostModelTimer:
    """Prices each step with a `CostModel` (or any `ShapePricer`): the batch shape the scheduler chose, plus the
    KV blocks its plan swaps or copies (`copy_time`), plus an engine's own CPU time per step
    (`engine_step_s`, sim/engine_profile.py)."""

    def __init__(self, cost_model: ShapePricer, engine_step_s: float = 0.0) -> None:
        self.cost_model = cost_model
        self.engine_step_s = engine_step_s

    def step_time(self, output: SchedulerOutput) -> float:
        query_lens, context_lens = output.batch_shape
        seconds = self.cost_model.step_time(BatchShape(query_lens, context_lens, num_logit_rows=output.num_logit_rows))
        seconds += self.engine_step_s
        if output.swap_out or output.swap_in or output.copy_blocks:
            seconds += self.copy_time(output)
        return seconds

    def copy_time(self, output: SchedulerOutput) -> float:
        """Seconds of the step's swap-out, swap-in and copy-on-write plan."""
        return self.cost_model.block_copy_time(len(output.swap_out) + len(output.swap_in), len(output.copy_blocks))


class ReplayTimer:
    """Replays measured step durations, one per step, in order (one run's worth: make a new one per run)."""

    def __init__(self, durations: Iterable[float]) -> None:
        self.durations = list(durations)
        if any(d < 0 for d in self.durations):
            raise ValueError("step durations must be >= 0")
        self._next = 0

    def step_time(self, output: SchedulerOutput) -> float:
        if self._next >= len(self.durations):
            raise RuntimeError(
                f"ReplayTimer ran out of durations at step {output.step_id}: it holds {len(self.durations)}; "
                "the simulated run took more steps than the one that was measured")
        duration = self.durations[self._next]
        self._next += 1
        return duration


class SimulatedExecutor:
    """One engine replica: a core scheduler stepped on `env`'s clock, its step times from `step_timer`.

    Requests come in through `add_request` (from `feed`, a router, or a disaggregated prefill); the engine
    process starts on construction and runs for as long as the SimPy environment does. `on_step`, if set,
    sees the scheduler and each step's record right after the step (a live view's recorder,
    serving_lab/dashboard_replay.py); `on_finish`, each request as it finishes (a progress bar).
    With `streaming=True` it keeps neither its requests nor a step log: a `MetricsStream`
    (core/metrics_stream.py) gathers its metrics as it goes, and a `StepRecord` is made only for `on_step`.
    """

    def __init__(self, env: simpy.Environment, scheduler: Scheduler, step_timer: StepTimer,
                 name: str = "engine", proposer: Proposer | None = None, *, streaming: bool = False) -> None:
        self.env = env
        self.proposer = proposer
        self.scheduler = scheduler
        self.step_timer = step_timer
        self.name = name
        self.requests: list[Request] = []  # every accepted request, in order of arrival here (unless streaming)
        self.steps: list[StepRecord] = []  # unless streaming
        self.streaming = streaming
        self.stream: MetricsStream | None = MetricsStream() if streaming else None
        self.num_refused = 0
        self._finished_events: dict[str, simpy.Event] = {}
        self._wakeup: simpy.Event | None = None  # set while the engine sleeps with nothing to run
        self.on_step: StepObserver | None = None
        self.on_finish: Callable[[Request], None] | None = None
        env.process(self._engine_loop())

    @property
    def num_unfinished(self) -> int:
        """Requests waiting or running here (what a least-loaded router compares)."""
        return self.scheduler.get_num_unfinished_requests()

    def add_request(self, request: Request) -> simpy.Event | None:
        """Queue `request` now. Returns an event that fires with the request when it finishes, or None
        if the scheduler refused it (it could never fit this engine)."""
        try:
            self.scheduler.add_request(request)
        except ValueError:
            self.num_refused += 1
            return None
        if self.stream is not None:
            self.stream.admitted(request)
        else:
            self.requests.append(request)
        finished = self.env.event()
        self._finished_events[request.request_id] = finished
        if self._wakeup is not None and not self._wakeup.triggered:
            self._wakeup.succeed()
        return finished

    def feed(self, requests: Iterable[Request]) -> Generator[simpy.Event, None, None]:
        """SimPy process: hand each request to this engine at its `arrival_time` (`feed_arrivals`)."""
        return feed_arrivals(self.env, requests, self.add_request)

    def _engine_loop(self) -> Generator[simpy.Event, None, None]:
        env, scheduler = self.env, self.scheduler
        while True:
            output = scheduler.schedule(env.now)
            if output.is_empty:
                self._wakeup = env.event()
                yield self._wakeup  # nothing runnable: sleep until the next add_request
                self._wakeup = None
                continue
            start = env.now
            duration = self.step_timer.step_time(output)
            yield env.timeout(duration)
            if self.proposer is not None:
                result = self.proposer.verify(output)
            else:  # one list shared by every row (the scheduler only reads it), not a new list per row
                result = StepResult(dict.fromkeys([s.request_id for s in output.scheduled if s.needs_logits],
                                                  DUMMY_SAMPLE))
            finished = scheduler.update_from_output(output, result, now=env.now)
            if self.proposer is not None:
                self.proposer.propose(scheduler)
            stream = self.stream
            if stream is not None:  # counted, and a StepRecord made only for an observer
                stream.step(env.now, output.kv_usage, () if self.proposer is None else
                            [(drafted, accepted) for _, drafted, accepted in verifies(output, result)])
            if stream is None or self.on_step is not None:
                record = StepRecord.from_output(output, start, duration, result)
                if stream is None:
                    self.steps.append(record)
                if self.on_step is not None:
                    self.on_step(scheduler, record)
            for request in finished:
                if stream is not None:
                    stream.finished(request)
                if self.on_finish is not None:
                    self.on_finish(request)
                self._finished_events.pop(request.request_id).succeed(request)

    def start_round(self) -> None:
        """Forget what was served so far (requests, steps, refusals) but keep the scheduler and its KV
        cache: the next `metrics()` covers only what comes after."""
        self.requests, self.steps, self.num_refused = [], [], 0
        self.stream = MetricsStream() if self.streaming else None

    def metrics(self) -> RunMetrics:
        """`RunMetrics` of everything this replica served; call once the environment has run out of events."""
        if self.scheduler.has_unfinished_requests():
            raise RuntimeError(
                f"{self.name}: the simulation ended with {self.num_unfinished} unfinished requests "
                f"({self.scheduler.num_running} running, {self.scheduler.num_waiting} waiting): "
                "the scheduler stalled")
        if self.stream is not None:
            return self.stream.metrics(num_failed=self.num_refused)
        return RunMetrics.from_requests(self.requests, self.steps, num_failed=self.num_refused)
