"""Autoscaling a fleet of simulated replicas: when to add or drain one, and what a cold start costs.

This module owns the fleet's size over time. An `Autoscaler` is a policy in the style of Knative's and
KServe's concurrency autoscaling: it aims at `target_concurrency` outstanding requests per replica; every
`interval_s` it counts the requests in the fleet (waiting, running, and held at the front door for lack of
a replica) and wants ceil(count / target) replicas, clamped to [min_replicas, max_replicas]. It scales up at
once and down only after wanting fewer for `scale_down_delay_s` without a break, and then to the most it
wanted in that window (so a lull between bursts does not throw warm replicas away, and a trickle of requests
that leaves the fleet empty at most ticks does not scale it to zero). With `min_replicas=0` the fleet scales
to zero; the first request after that waits at the front door (Knative's activator) while a replica starts.

By default the policy reads the count as it is at each tick. With `stable_window_s` it reads it as Knative's
pod autoscaler (KPA) does, averaged over two windows of the ticks' counts:
- stable mode: replicas for the mean count of the last `stable_window_s` (Knative's default 60 s), so a
  burst shorter than the window moves the fleet only in part, and the last replica goes only after a whole
  window without requests;
- panic mode: when the mean over the short panic window (`panic_window_pct` of the stable one, default 10%:
  6 s) calls for at least `panic_threshold_pct` (default 200%) of the replicas serving, the fleet panics:
  it scales to the panic window's count at once and does not scale down, until a whole stable window has
  passed without a reason to panic.
Knative samples each second; this policy samples at its ticks (every `interval_s`). Knative also caps how
fast a fleet may grow or shrink in one decision (`max-scale-up-rate`, `max-scale-down-rate`); not modelled.

A started replica serves only after its `ColdStart`, made of parts the simulator prices and the engine
can measure one by one:
- process start: container, interpreter, framework imports (a stated constant);
- weight load: the replica's share of the weights read and converted at `load_bandwidth` (disk or network),
  into fresh memory written at the allocation rate (below);
- KV-pool allocation: the pool's bytes written once, at `allocation_bandwidth` if given, else at the
  device's memory bandwidth (on a CPU the first touch of fresh pages is far slower than the memory: the OS
  maps and zeroes each 4 KiB page on its first write, so a CPU's rate is measured, benchmarks/cold_start.py);
- compile: graph capture or torch.compile (a stated constant; 0 for an eager engine).

Scaling down drains a replica: it takes no new request, finishes what it holds, then stops. No request is
lost to a scale-down. Scaling up first takes back a draining replica (it is warm), then starts new ones.

Invariants: at every moment starting + serving replicas (draining ones apart) <= max_replicas; after the
first decision, >= min_replicas; every request delivered is either served or refused by a replica's
scheduler; the same workload and policy give the same numbers (no wall clock, no unseeded randomness).

Output (`FleetTimeline`): the replicas' states over time, and GPU-seconds (each replica from the start of
its cold start to its stop, times its devices): what a cloud bill counts.

Lesson: lessons/07-tuning-knobs.md#from-one-replica-to-a-fleet (a spike with and without scale-to-zero).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from statistics import fmean

import simpy

from core.request import Request
from sim.cost_model import model_weight_bytes
from sim.executor import SimulatedExecutor
from sim.router import Router
from sim.simulator import Simulator, device_block_bytes


@dataclass(frozen=True)
class ColdStart:
    """How long a new replica takes before it serves, by part (module docstring). Bandwidths in bytes/s."""

    process_start_s: float = 0.0
    load_bandwidth: float = 2.0e9  # an assumption to state: a local NVMe disk reads a few GB/s
    compile_s: float = 0.0
    allocation_bandwidth: float | None = None  # None: the device's memory bandwidth

    def __post_init__(self) -> None:
        if self.process_start_s < 0 or self.compile_s < 0 or self.load_bandwidth <= 0 or (
                self.allocation_bandwidth is not None and self.allocation_bandwidth <= 0):
            raise ValueError(f"a cold start needs times >= 0 and bandwidths > 0, got {self}")

    def parts(self, simulator: Simulator) -> dict[str, float]:
        """Seconds of each part for one replica of `simulator` (per device: the devices start in parallel)."""
        weight_bytes = model_weight_bytes(simulator.arch, simulator.dtype, simulator.hardware) / simulator.num_devices
        pool_bytes = simulator.num_kv_blocks * device_block_bytes(
            simulator.arch, simulator.config.block_size, simulator.kv_cache_dtype,
            simulator.tensor_parallel_size, simulator.pipeline_parallel_size)
        allocation = self.allocation_bandwidth or simulator.hardware.memory_bandwidth
        return {"process_start": self.process_start_s,
                "weight_load": weight_bytes / self.load_bandwidth + weight_bytes / allocation,
                "kv_allocation": pool_bytes / allocation,
                "compile": self.compile_s}

    def seconds(self, simulator: Simulator) -> float:
        return sum(self.parts(simulator).values())


@dataclass(frozen=True)
class Autoscaler:
    """A concurrency-target autoscaling policy (module docstring)."""

    target_concurrency: float = 16.0
    min_replicas: int = 1
    max_replicas: int = 8
    scale_down_delay_s: float = 30.0
    interval_s: float = 2.0  # Knative decides every 2 s
    initial_replicas: int | None = None  # serving at time 0, warm; None: min_replicas
    cold_start: ColdStart = field(default_factory=ColdStart)
    stable_window_s: float | None = None  # Knative's averaging (module docstring); None: the count at each tick
    panic_window_pct: float = 10.0  # the panic window, as a percentage of the stable window (Knative's names)
    panic_threshold_pct: float = 200.0  # panic when the panic window wants this percentage of the serving replicas

    def __post_init__(self) -> None:
        initial = self.starting_replicas
        if not (0 <= self.min_replicas <= initial <= self.max_replicas and self.max_replicas >= 1):
            raise ValueError("an autoscaler needs 0 <= min_replicas <= initial_replicas <= max_replicas and "
                             f"max_replicas >= 1, got {self.min_replicas}, {initial}, {self.max_replicas}")
        if self.target_concurrency <= 0 or self.interval_s <= 0 or self.scale_down_delay_s < 0:
            raise ValueError("target_concurrency and interval_s must be > 0 and scale_down_delay_s >= 0")
        if self.stable_window_s is not None and not (
                self.stable_window_s >= self.interval_s and 0 < self.panic_window_pct <= 100
                and self.panic_threshold_pct > 0):
            raise ValueError("stable_window_s must be at least interval_s, panic_window_pct in (0, 100] and "
                             f"panic_threshold_pct > 0, got {self.stable_window_s}, {self.panic_window_pct}, "
                             f"{self.panic_threshold_pct}")

    @property
    def starting_replicas(self) -> int:
        return self.min_replicas if self.initial_replicas is None else self.initial_replicas

    def desired(self, outstanding: float) -> int:
        """How many replicas `outstanding` requests (or a window's mean count of them) call for."""
        return max(self.min_replicas, min(self.max_replicas, math.ceil(outstanding / self.target_concurrency)))

    @property
    def panic_window_s(self) -> float:
        return (self.stable_window_s or 0.0) * self.panic_window_pct / 100


@dataclass
class FleetTimeline:
    """The fleet's size over time: (time, starting, serving, draining) at each change, and the bill."""

    changes: list[tuple[float, int, int, int]] = field(default_factory=list)
    gpu_seconds: float = 0.0
    num_cold_starts: int = 0
    cold_start_s: float = 0.0  # one cold start's seconds (every replica is alike)

    @property
    def max_serving(self) -> int:
        return max((serving for _, _, serving, _ in self.changes), default=0)


class AutoscaledFleet:
    """Replicas of one `Simulator` on `env`, added and drained by `autoscaler`, fed through `router`.

    `deliver(request)` is the front door: it routes to a serving replica, or holds the request until one is.
    The cluster calls `run_until_done` as a SimPy process next to its arrivals and `close` at the end.
    `make_replica(name)` makes each new replica (default: `simulator.make_executor` on `env`; the cluster's
    sets streaming and a progress callback)."""

    def __init__(self, env: simpy.Environment, simulator: Simulator, router: Router, autoscaler: Autoscaler,
                 num_requests: int, make_replica: Callable[[str], SimulatedExecutor] | None = None) -> None:
        self.env, self.simulator, self.router, self.autoscaler = env, simulator, router, autoscaler
        self._make_replica = make_replica or (lambda name: simulator.make_executor(env, name))
        self.timeline = FleetTimeline(cold_start_s=autoscaler.cold_start.seconds(simulator))
        self.replicas: list[SimulatedExecutor] = []  # every replica ever started, in order
        self.serving: list[SimulatedExecutor] = []
        self.starting: list[SimulatedExecutor] = []
        self.draining: list[SimulatedExecutor] = []
        self._started_at: dict[str, float] = {}
        self._held: list[Request] = []  # at the front door: no replica serves yet
        self._num_undelivered = num_requests  # requests not yet handed to a replica (or refused)
        self._below_since: float | None = None  # when the autoscaler began wanting fewer replicas
        self._window_max = 0  # the most it wanted since then: what it scales down to
        self._counts: deque[tuple[float, int]] = deque()  # (tick, outstanding) over the stable window
        self._panic_since: float | None = None  # the last tick that gave a reason to panic, while panicking
        self._panic_max = 0  # the most replicas the panic window wanted since the panic began
        for _ in range(autoscaler.starting_replicas):
            self.serving.append(self._new_replica())
        self._record()

    # ---- the front door ----

    def deliver(self, request: Request) -> None:
        if not self.serving and not self.starting:  # scale from zero at once, not at the next decision
            self._scale_to(1)
        if self.serving:
            self._hand_over(request)
        else:
            self._held.append(request)

    def _hand_over(self, request: Request) -> None:
        replica = self.router.route(request, self.serving)
        finished = replica.add_request(request)
        self._num_undelivered -= 1
        if finished is not None:
            finished.callbacks.append(lambda _event, replica=replica: self._on_finished(replica))

    def _on_finished(self, replica: SimulatedExecutor) -> None:
        if replica in self.draining and replica.num_unfinished == 0:
            self.draining.remove(replica)
            self._stop(replica)
            self._record()

    # ---- scaling ----

    @property
    def outstanding(self) -> int:
        return len(self._held) + sum(r.num_unfinished for r in self.serving + self.draining)

    def run_until_done(self) -> Generator[simpy.Event, None, None]:
        """SimPy process: one decision every `interval_s` until every request is served and the fleet is at
        its minimum (so the run shows the scale-down that follows the last request)."""
        policy = self.autoscaler
        while self._num_undelivered or self.outstanding or self.starting or self.draining or (
                len(self.serving) > policy.min_replicas):
            yield self.env.timeout(policy.interval_s)
            self._decide()

    def _decide(self) -> None:
        policy, now = self.autoscaler, self.env.now
        current = len(self.serving) + len(self.starting)
        if policy.stable_window_s is None:
            desired = policy.desired(self.outstanding)
        else:
            desired = self._windowed_desired(now, current)
        if desired >= current:
            self._below_since = None
            if desired > current:
                self._scale_to(desired)
            return
        if self._below_since is None:
            self._below_since, self._window_max = now, desired
        self._window_max = max(self._window_max, desired)
        if now - self._below_since >= policy.scale_down_delay_s:
            self._scale_to(self._window_max)
            self._below_since = None

    def _windowed_desired(self, now: float, current: int) -> int:
        """Knative's stable and panic modes (module docstring) over the counts sampled at the ticks."""
        policy, counts = self.autoscaler, self._counts
        counts.append((now, self.outstanding))
        while counts[0][0] <= now - policy.stable_window_s:
            counts.popleft()
        stable = policy.desired(fmean([n for _, n in counts]))
        panic_mean = fmean([n for t, n in counts if t > now - policy.panic_window_s])  # holds this tick's
        if panic_mean / policy.target_concurrency >= policy.panic_threshold_pct / 100 * max(len(self.serving), 1):
            if self._panic_since is None:
                self._panic_max = current
            self._panic_since = now
        elif self._panic_since is not None and now - self._panic_since >= policy.stable_window_s:
            self._panic_since = None
        if self._panic_since is None:
            return stable
        self._panic_max = max(self._panic_max, policy.desired(panic_mean))
        return self._panic_max  # never fewer while panicking

    def _scale_to(self, desired: int) -> None:
        current = len(self.serving) + len(self.starting)
        while current < desired and self.draining:  # a draining replica is warm: take it back first
            self.serving.append(self.draining.pop())
            current += 1
        for _ in range(desired - current):
            replica = self._new_replica()
            self.starting.append(replica)
            self.timeline.num_cold_starts += 1
            self.env.process(self._cold_start(replica))
        for _ in range(current - desired):  # drain the newest serving replicas, which hold the least cache
            if not self.serving:
                break
            replica = self.serving.pop()
            forget: Callable[[SimulatedExecutor], None] | None = getattr(self.router, "forget", None)
            if forget is not None:
                forget(replica)
            if replica.num_unfinished:
                self.draining.append(replica)
            else:
                self._stop(replica)
        self._record()

    def _cold_start(self, replica: SimulatedExecutor) -> Generator[simpy.Event, None, None]:
        yield self.env.timeout(self.timeline.cold_start_s)
        self.starting.remove(replica)
        self.serving.append(replica)
        self._record()
        held, self._held = self._held, []
        for request in held:
            self._hand_over(request)

    def _new_replica(self) -> SimulatedExecutor:
        replica = self._make_replica(f"replica{len(self.replicas)}")
        self.replicas.append(replica)
        self._started_at[replica.name] = self.env.now
        return replica

    def _stop(self, replica: SimulatedExecutor) -> None:
        self.timeline.gpu_seconds += (self.env.now - self._started_at.pop(replica.name)) * self.simulator.num_devices

    def _record(self) -> None:
        self.timeline.changes.append((self.env.now, len(self.starting), len(self.serving), len(self.draining)))

    def close(self) -> FleetTimeline:
        """Bill the replicas still up at the end of the run."""
        for replica in self.serving + self.starting + self.draining:
            self._stop(replica)
        return self.timeline
