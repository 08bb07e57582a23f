"""Lesson 1: continuous batching. The cost of a step, static vs continuous batching, load and capacity.

`step_loop` draws the engine loop; `demo` is `serving-lab demo batching`.

Lesson: lessons/01-continuous-batching.md.
"""

from __future__ import annotations

from collections.abc import Iterable
from statistics import median
from typing import Any

import simpy

from core.config import EngineConfig
from core.math_utils import cdiv
from core.metrics import RunMetrics, relative_error
from core.workload import Exponential, LengthSpec, Workload
from course.demo import GPU, DemoContext, DemoReport, gpu_name, plot_comparison, side_by_side
from course.drawing import COLORS, arrow, box, canvas
from serving_lab.pairing import Sides, run_pair
from sim.cost_model import BatchShape


def step_cost(batch_sizes: Iterable[int], contexts: Iterable[int], prefill_lens: Iterable[int], sides: Sides, *,
              decode_tokens: int = 5, max_num_batched_tokens: int = 16384, seed: int = 0) -> list[dict[str, Any]]:
    """The cost of one step (lesson 1, "cost-of-a-step"): a decode step of B requests at context C, and a prefill step
    of one L-token prompt, measured on the engine and priced by the cost model.

    Measured: B requests with C-token prompts and `decode_tokens` output tokens arrive at once; once their
    prompts are in, every step decodes all B of them, and the row is the median of those steps. A prefill row
    is the single step of one L-token prompt with one output token. Each point keeps its fastest of
    `sides.repeats` measurements, taken in separate passes over all points, so that a burst of activity of
    another program slows down one measurement of several points rather than every measurement of one.
    Simulated: the cost model's price of the same batch, `BatchShape.decode(B, C)` or `BatchShape.prefill(L)`,
    split into compute, memory and overhead (`CostModel.breakdown`).
    Columns: kind, batch_size, context, num_tokens (B for decode, L for prefill), side, step_ms,
    tokens_per_s (num_tokens / step time); simulated rows add step_ms_err_pct, compute_ms, memory_ms,
    overhead_ms, bound (the larger of compute and memory) and arithmetic_intensity (FLOPs per byte)."""
    cost_model = sides.cost_model()
    points = [("decode", b, c) for c in contexts for b in batch_sizes]
    points += [("prefill", 1, n) for n in prefill_lens]
    fastest: dict[tuple[str, int, int], float] = {}
    if sides.measure:
        _warm_up(sides)
        for _ in range(sides.repeats):
            for point in points:
                seconds = _measure_step(*point, sides, decode_tokens, max_num_batched_tokens, seed)
                fastest[point] = min(fastest.get(point, seconds), seconds)
    rows = []
    for kind, batch, length in points:
        labels = {"kind": kind, "batch_size": batch, "context": length if kind == "decode" else 0,
                  "num_tokens": batch if kind == "decode" else length}
        measured_s = fastest.get((kind, batch, length))
        if measured_s is not None:
            rows.append({**labels, "side": "measured", "step_ms": measured_s * 1e3,
                         "tokens_per_s": labels["num_tokens"] / measured_s})
        shape = BatchShape.decode(batch, length) if kind == "decode" else BatchShape.prefill(length)
        cost = cost_model.breakdown(shape)
        row = {**labels, "side": "simulated", "step_ms": cost.total_s * 1e3,
               "tokens_per_s": labels["num_tokens"] / cost.total_s}
        if measured_s is not None:
            row["step_ms_err_pct"] = relative_error(cost.total_s, measured_s)
        rows.append({**row, "compute_ms": cost.compute_s * 1e3, "memory_ms": cost.memory_s * 1e3,
                     "overhead_ms": cost.overhead_s * 1e3, "bound": cost.bound,
                     "arithmetic_intensity": cost.arithmetic_intensity})
    return rows


def _warm_up(sides: Sides) -> None:
    """One tiny engine run, so one-time costs (first calls, allocations) stay out of the measurements."""
    # The engine (torch) is imported only where a measured side needs it: simulator-only sweeps run without.
    from ref_engine import bench

    bench.run(Workload.synthetic(2, prompt_len=16, output_len=4, seed=0, name="warm-up"),
              EngineConfig(max_num_seqs=2, num_kv_blocks=8), model=sides.model)


def _measure_step(kind: str, batch: int, length: int, sides: Sides, decode_tokens: int, max_tokens: int,
                  seed: int) -> float:
    """Seconds of one decode step of `batch` requests at context `length`, or of one `length`-token prefill
    (one engine run)."""
    from ref_engine import bench

    if kind == "prefill":
        workload = Workload.synthetic(1, prompt_len=length, output_len=1, seed=seed, name=f"prefill-{length}")
        config = EngineConfig(max_num_seqs=1, max_num_batched_tokens=max(length, 16),
                              num_kv_blocks=cdiv(length + 1, EngineConfig.block_size) + 1)
        return bench.run(workload, config, model=sides.model).steps[0].duration
    budget = min(batch * length, max_tokens)
    # with a budget below B x C the prompts go in over several steps and start decoding at different steps;
    # extra output tokens keep every request running until `decode_tokens` steps decode all B at once
    extra = 0 if budget == batch * length else 2 * cdiv(batch * length, budget)
    output_len = decode_tokens + extra
    workload = Workload.synthetic(batch, prompt_len=length, output_len=output_len, seed=seed,
                                  name=f"decode-{batch}x{length}")
    config = EngineConfig(max_num_seqs=batch, max_num_batched_tokens=max(budget, 16),
                          num_kv_blocks=batch * (cdiv(length + output_len, EngineConfig.block_size) + 1) + 1)
    steps = bench.run(workload, config, model=sides.model).steps
    full = [s.duration for s in steps if s.num_seqs == batch and s.num_tokens == batch]
    if not full:
        raise RuntimeError(f"no step decoded all {batch} requests at once; raise decode_tokens")
    return median(full)


def static_vs_continuous(caps: Iterable[int], sides: Sides, *, num_requests: int = 16, prompt_len: int = 64,
                         mean_output: int = 32, max_num_seqs: int = 8, seed: int = 0) -> list[dict[str, Any]]:
    """Fixed prompts, exponential output lengths (mean `mean_output`) capped at each cap, all at once; both
    schedulers. The continuous/static ratio grows with the spread of output lengths (Anyscale, Orca).

    Each (cap, scheduling) gives a measured and a simulated row (just a simulated one without `measure`);
    `throughput_ratios(rows)` turns them into continuous / static per cap and side."""
    rows = []
    for cap in caps:
        workload = Workload.synthetic(num_requests, prompt_len=prompt_len, output_len=Exponential(mean_output, cap),
                                      seed=seed, name=f"exp-{mean_output}-cap-{cap}")
        for scheduling in ("static", "continuous"):
            config = EngineConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max(512, prompt_len * max_num_seqs),
                                  num_kv_blocks=max_num_seqs * cdiv(prompt_len + cap, EngineConfig.block_size) + 16,
                                  scheduling=scheduling)
            rows += run_pair(workload, config, sides, cap=cap, scheduling=scheduling)
    return rows


def throughput_ratios(rows: Iterable[dict[str, Any]], by: str = "cap", metric: str = "output_throughput"
                      ) -> list[dict[str, Any]]:
    """Continuous over static `metric`, for each value of the label `by` and each side, in row order."""
    table: dict[tuple[Any, str], dict[str, float]] = {}
    for row in rows:
        table.setdefault((row[by], row["side"]), {})[row["scheduling"]] = row[metric]
    return [{by: key, "side": side, "static": v["static"], "continuous": v["continuous"],
             "ratio": v["continuous"] / v["static"]}
            for (key, side), v in table.items() if "static" in v and "continuous" in v]


def _longest(spec: LengthSpec) -> int:
    """The largest length a length spec can produce."""
    if isinstance(spec, Exponential):
        return spec.cap
    return spec[1] if isinstance(spec, tuple) else spec


def _load_config(prompt_len: LengthSpec, output_len: LengthSpec, scheduling: str, max_num_seqs: int,
                 max_num_batched_tokens: int) -> EngineConfig:
    """Enough KV blocks for `max_num_seqs` of the longest requests, so memory never limits the batch."""
    longest = _longest(prompt_len) + _longest(output_len)
    return EngineConfig(max_num_seqs=max_num_seqs,
                        max_num_batched_tokens=max(max_num_batched_tokens, _longest(prompt_len)),
                        num_kv_blocks=max_num_seqs * cdiv(longest, EngineConfig.block_size) + 16,
                        scheduling=scheduling)


def capacity(sides: Sides, *, num_requests: int = 24, prompt_len: LengthSpec = (32, 128),
             output_len: LengthSpec = (16, 48), scheduling: str = "continuous", max_num_seqs: int = 8,
             max_num_batched_tokens: int = 512, seed: int = 0) -> float:
    """Requests per second the simulated server completes while it is saturated: the highest arrival
    rate it can sustain. `load_sweep` rates are best given as fractions of it.

    Every request arrives at once; while some are still queued, the server runs flat out, so capacity is
    (requests finished by the time the last one is admitted) / (that time). The drain at the end, when
    the last few requests run in a half-empty batch, is left out. Needs `num_requests` well above
    `max_num_seqs`."""
    workload = Workload.synthetic(num_requests, prompt_len=prompt_len, output_len=output_len, seed=seed,
                                  name="saturated")
    config = _load_config(prompt_len, output_len, scheduling, max_num_seqs, max_num_batched_tokens)
    simulator = sides.simulator(config)
    env = simpy.Environment()
    executor = simulator.make_executor(env)
    env.process(executor.feed(workload.make_requests(simulator.arch.vocab_size)))
    env.run()
    last_admitted = max(r.first_scheduled_time for r in executor.requests)
    done = sum(r.finish_time <= last_admitted for r in executor.requests)
    if done == 0:
        raise ValueError(f"capacity needs more requests than max_num_seqs ({max_num_seqs}) so that some "
                         f"queue; got num_requests={num_requests}")
    return done / last_admitted


def load_sweep(rates: Iterable[float], sides: Sides, *, num_requests: int = 24, prompt_len: LengthSpec = (32, 128),
               output_len: LengthSpec = (16, 48), scheduling: str | Iterable[str] = "continuous",
               max_num_seqs: int = 8, max_num_batched_tokens: int = 512, seed: int = 0) -> list[dict[str, Any]]:
    """Poisson arrivals at rising rates (requests/s), for one scheduling policy or several: latency is flat,
    then climbs steeply at capacity. The same seed gives the same lengths at every rate; only the arrival
    times are compressed. Arrivals depend on the clock, so batch compositions may differ between the
    engine and the simulator (`same_policy` need not hold), and near capacity small timing differences
    turn into large queueing differences."""
    policies = [scheduling] if isinstance(scheduling, str) else list(scheduling)
    rows = []
    for policy in policies:
        for rate in rates:
            workload = Workload.synthetic(num_requests, prompt_len=prompt_len, output_len=output_len, arrival=rate,
                                          seed=seed, name=f"poisson-{rate}")
            config = _load_config(prompt_len, output_len, policy, max_num_seqs, max_num_batched_tokens)
            rows += run_pair(workload, config, sides, rate=rate, scheduling=policy)
    return rows


def plot_timeline(ax: Any, metrics: RunMetrics, label: str | None = None, **style: Any) -> None:
    """Draw how many requests each step ran, against time (seconds): static batching's staircase of
    emptying batches against continuous batching's full plateau. `ax` is a matplotlib Axes."""
    steps = metrics.steps
    if not steps:
        return
    edges = [s.start for s in steps] + [steps[-1].start + steps[-1].duration]
    ax.stairs([s.num_seqs for s in steps], edges, label=label, **style)
    ax.set_xlabel("time (s)")
    ax.set_ylabel("requests in the step")


def idle_share(metrics: RunMetrics, max_num_seqs: int) -> float:
    """The share of a run's slot-steps (`max_num_seqs` seats in each of its steps) that no request used. The
    core decides every step's batch, so engine and simulator give the same share on any machine."""
    return 1 - sum(s.num_seqs for s in metrics.steps) / (max_num_seqs * len(metrics.steps))


def plot_occupancy(ax: Any, metrics: RunMetrics, max_num_seqs: int, label: str, color: str) -> None:
    """Slots busy in each step, against the step number, with the idle slots above them shaded: static
    batching's emptying batches leave a wedge of idle seats that continuous batching refills."""
    busy = [s.num_seqs for s in metrics.steps]
    edges = range(len(busy) + 1)
    ax.stairs(busy, edges, color=color, label=f"{label}: {len(busy)} steps, "
              f"{idle_share(metrics, max_num_seqs):.0%} of slots idle")
    ax.stairs([max_num_seqs] * len(busy), edges, baseline=busy, fill=True, color=color, alpha=0.15)
    ax.set(xlabel="step", ylabel="slots busy", ylim=(0, max_num_seqs + 0.5))


# ---- the diagram ----


def step_loop():
    """Lesson 1: the engine loop. Every step the scheduler re-forms the batch (iteration-level scheduling)."""
    fig, ax = canvas(9, 5, (0, 10), (0, 6))
    waiting = box(ax, 1.4, 3, "waiting queue\n(new requests arrive)", COLORS[3])
    schedule = box(ax, 5, 5.1, "Scheduler.schedule()\nrunning first, then waiting,\nwithin max_num_batched_tokens,\n"
                   "max_num_seqs and free KV blocks", COLORS[0])
    forward = box(ax, 8.4, 3, "ModelRunner.execute_model()\none forward pass over\nevery scheduled token", COLORS[1])
    sample = box(ax, 5, 0.9, "Sampler: one token per\nrequest that finished its prompt", COLORS[2])
    update = box(ax, 5, 3, "update_from_output()\nappend tokens; finished\nrequests free their blocks", "white")
    arrow(ax, waiting, schedule, "admit", rad=-0.2)
    arrow(ax, schedule, forward, "SchedulerOutput", rad=-0.2)
    arrow(ax, forward, sample, "logits", rad=-0.2)
    arrow(ax, sample, update, "", rad=0)
    arrow(ax, update, schedule, "next step", rad=0, offset=(0.55, -0.1))
    arrow(ax, update, waiting, "preempted\n(recompute)", rad=0.0, offset=(0, -0.55))
    ax.text(8.4, 1.0, "finished -> client\n(TTFT, ITL measured here)", ha="center", fontsize=8, color="#555")
    ax.set_title("One engine step: schedule, forward, sample, update; repeat", fontsize=11)
    fig.tight_layout()
    return fig


# ---- the demo (serving-lab demo) ----

DEMO_PRESETS = {  # on the GPU profile, notebook 01's caps (outputs Exp(128), 64-token prompts, max_num_seqs 64)
    "full": dict(caps=(16, 96), num_requests=16, prompt_len=64, mean_output=32, max_num_seqs=8,
                 gpu_caps=(32, 128, 512, 1536), gpu_requests=512),
    "fast": dict(caps=(12,), num_requests=6, prompt_len=8, mean_output=6, max_num_seqs=3, gpu_caps=(32, 512),
                 gpu_requests=96),
}


def demo(context: DemoContext) -> DemoReport:
    """Static vs continuous batching on the engine and in the simulator (`static_vs_continuous`), the
    occupancy timeline of the largest cap (slots busy per step: the idle slots static batching pays for, even
    where this CPU's throughput gain is small), then the same question on a simulated H100, where the gain
    grows with the spread of output lengths."""
    p = context.preset(DEMO_PRESETS)
    rows = static_vs_continuous(p["caps"], context.sides(), num_requests=p["num_requests"],
                                prompt_len=p["prompt_len"], mean_output=p["mean_output"],
                                max_num_seqs=p["max_num_seqs"])
    ratios = {(r["cap"], r["side"]): r["ratio"] for r in throughput_ratios(rows)}
    gpu = throughput_ratios(static_vs_continuous(p["gpu_caps"], GPU, num_requests=p["gpu_requests"], prompt_len=64,
                                                 mean_output=128, max_num_seqs=64))
    labels = ("cap", "scheduling")
    comparison = side_by_side(rows, labels, ("output_throughput", "mean_ttft_ms"))
    figure, (occupancy, what_if) = plot_comparison(comparison, labels, "static vs continuous batching, engine and "
                                                   "simulator", extra_panels=2)
    cap, seats = p["caps"][-1], p["max_num_seqs"]
    runs = {r["scheduling"]: r["metrics"] for r in rows if r["cap"] == cap and r["side"] == "measured"}
    for scheduling, color in (("static", "tab:red"), ("continuous", "tab:blue")):
        plot_occupancy(occupancy, runs[scheduling], seats, scheduling, color)
    occupancy.set_title(f"cap {cap}: slots busy per step (shaded: idle), the same on both sides", fontsize=9)
    occupancy.legend(fontsize=7, loc="lower left")
    what_if.plot([r["cap"] for r in gpu], [r["ratio"] for r in gpu], "s--", label=gpu_name())
    for side, style in (("measured", "o-"), ("simulated", "x:")):
        what_if.plot(p["caps"], [ratios[(cap, side)] for cap in p["caps"]], style, label=f"this machine, {side}")
    what_if.set(xscale="log", xlabel="output-length cap (tokens)", ylabel="continuous / static throughput")
    what_if.legend(fontsize=7)
    return DemoReport(comparison, labels, figure, notes=[
        f"occupancy at cap {cap}, {seats} slots: static batching ran {len(runs['static'].steps)} steps with "
        f"{idle_share(runs['static'], seats):.0%} of its slot-steps idle, continuous "
        f"{len(runs['continuous'].steps)} steps with {idle_share(runs['continuous'], seats):.0%} idle (the core's "
        "decisions, identical in the simulator)",
        "continuous / static output throughput: " + "; ".join(
            f"cap {cap}: measured {ratios[(cap, 'measured')]:.2f}x, simulated {ratios[(cap, 'simulated')]:.2f}x"
            for cap in p["caps"]),
        f"GPU what-if, {gpu_name()}: continuous / static "
        + ", ".join(f"{r['ratio']:.2f}x at cap {r['cap']}" for r in gpu)
        + f" ({p['gpu_requests']} requests, outputs Exp(128), max_num_seqs 64)",
    ])
