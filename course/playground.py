"""The lessons' playgrounds: each lesson's headline experiment, simulated only and small enough to run in the
reader's browser in a second or two, with the knobs the lesson teaches.

The course site (lessons/tools/course_site.py) packs this module with `core`, `sim` and SimPy into one archive
that Pyodide (CPython compiled to WebAssembly) loads in the page, so the playground runs this very code, not a
JavaScript copy of it: for the same knobs the browser and `run(...)` here make the same scheduling decisions
(`Result.digest`) and print the same numbers. Hence the rule for this module: it imports nothing beyond the
standard library, SimPy, `core` and `sim` (no torch, no numpy), and every run is seeded.

    from course.playground import run
    run("01-continuous-batching", hardware="a100-80gb-sxm", max_num_seqs=16)   # a JSON-ready dict

Each playground asks the reader for a prediction before it runs ("Predict, then run"): the number its
`question` names, which the result's `answer` then gives.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from core.config import EngineConfig
from core.math_utils import cdiv
from core.metrics import RunMetrics
from core.workload import Exponential, Workload, WorkloadRequest
from sim.dashboard_replay import Recording, Replay, record_simulation
from sim.simulator import Simulator
from sim.spec_decode import AcceptanceRate

MODEL = "llama-3.1-8b"  # every playground serves this model; the GPU is a knob
GPUS = ("h100-sxm", "a100-80gb-sxm", "l40s", "h200", "b200")


@dataclass(frozen=True)
class Knob:
    """One control on the page, offering `choices` only: a slider over numbers, a list of names."""

    name: str  # the keyword of the experiment it sets
    label: str
    choices: tuple[Any, ...]
    default: Any


@dataclass
class Series:
    label: str
    values: list[float | None]  # one per x; None where this series has no point
    right_axis: bool = False  # drawn against the chart's second y axis


@dataclass
class Chart:
    """What the page draws (uPlot): every series over one shared, increasing x."""

    title: str
    x_label: str
    y_label: str
    x: list[float]
    series: list[Series]
    y2_label: str = ""
    log_x: bool = False


@dataclass
class Result:
    answer: float  # what the question asked for, in its unit
    lines: list[str]  # the result in words, one finding a line
    chart: Chart
    digest: str  # the runs' scheduling decisions, hashed: equal digests, equal simulations


@dataclass(frozen=True)
class Playground:
    lesson: str  # the lesson's stem
    title: str
    question: str  # what the reader predicts before running
    unit: str  # the answer's unit, shown after the prediction box
    knobs: tuple[Knob, ...]
    experiment: Callable[..., Result] = field(repr=False)

    def defaults(self) -> dict[str, Any]:
        return {k.name: k.default for k in self.knobs}


GPU_KNOB = Knob("hardware", "GPU", GPUS, "h100-sxm")  # every playground's first knob


def decision_digest(runs: Sequence[RunMetrics]) -> str:
    """sha256 of every step's decisions in each run: who ran with how many tokens at which context, and how
    many were preempted. Timing-free: two simulators that agree here made the same schedule."""
    steps = [[[s.query_lens, s.context_lens, s.num_preempted] for s in m.steps] for m in runs]
    return hashlib.sha256(json.dumps(steps, separators=(",", ":")).encode()).hexdigest()[:16]


def aligned(curves: dict[str, list[tuple[float, float]]]) -> tuple[list[float], list[Series]]:
    """Curves with their own x values on one shared x (the union, sorted), None where a curve has no point."""
    xs = sorted({x for points in curves.values() for x, _ in points})
    index = {x: i for i, x in enumerate(xs)}
    series = []
    for label, points in curves.items():
        values: list[float | None] = [None] * len(xs)
        for x, y in points:
            values[index[x]] = y
        series.append(Series(label, values))
    return xs, series


def simulator(hardware: str, config: EngineConfig, **options: Any) -> Simulator:
    return Simulator(MODEL, hardware, config, **options)


def running_curve(metrics: RunMetrics) -> list[tuple[float, float]]:
    """(step start in s, requests in the step) for each step: the batch's occupancy over time."""
    return [(round(s.start, 6), s.num_seqs) for s in metrics.steps]


# ---- lesson 1: static vs continuous batching ------------------------------------------------------------------

OUTPUT_LENGTHS = {"all 128": 128, "16 to 512": (16, 512), "long tail (mean 128)": Exponential(128, 1024, 8)}


def continuous_batching(hardware: str = "h100-sxm", max_num_seqs: int = 32,
                        output_lengths: str = "long tail (mean 128)") -> Result:
    """96 requests at once, both schedulers: static batching waits for a batch's longest output before it
    admits anyone, continuous batching refills each freed slot on the next step."""
    output_len = OUTPUT_LENGTHS[output_lengths]
    workload = Workload.synthetic(96, (64, 512), output_len, seed=0)
    runs = {}
    for scheduling in ("static", "continuous"):
        config = EngineConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_seqs * 512,
                              num_kv_blocks=max_num_seqs * cdiv(512 + 1024, 16) + 16, scheduling=scheduling)
        runs[scheduling] = simulator(hardware, config).run(workload)
    static, continuous = runs["static"], runs["continuous"]
    ratio = continuous.output_throughput / static.output_throughput
    xs, series = aligned({name: running_curve(m) for name, m in runs.items()})
    lines = [f"{name}: {m.output_throughput:,.0f} output tok/s, {m.duration:.2f} s, {m.num_steps} steps, "
             f"mean {sum(s.num_seqs for s in m.steps) / m.num_steps:.1f} of {max_num_seqs} slots busy"
             for name, m in runs.items()]
    lines.append(f"continuous / static: {ratio:.2f}x")
    chart = Chart("Requests in each step", "time (s)", "requests in the step", xs, series)
    return Result(ratio, lines, chart, decision_digest([static, continuous]))


# ---- lesson 2: PagedAttention and block size -------------------------------------------------------------------

ALLOCATIONS = ("paged", "contiguous_exact", "contiguous")


def paged_attention(hardware: str = "h100-sxm", block_size: int = 16, kv_cache_tokens: int = 16384) -> Result:
    """64 requests at once into a fixed KV pool of `kv_cache_tokens` slots, under each allocation mode:
    paged blocks on demand, a whole sequence reserved up front (its exact length, or max_model_len)."""
    workload = Workload.synthetic(64, (32, 512), (16, 512), seed=0)
    runs = {}
    for mode in ALLOCATIONS:
        config = EngineConfig(block_size=block_size, num_kv_blocks=kv_cache_tokens // block_size, max_num_seqs=256,
                              max_num_batched_tokens=4096, max_model_len=1024, kv_allocation=mode)
        runs[mode] = simulator(hardware, config).run(workload)
    ratio = runs["paged"].output_throughput / runs["contiguous"].output_throughput
    xs, series = aligned({mode: running_curve(m) for mode, m in runs.items()})
    lines = []
    for mode, m in runs.items():
        unused = sum(s.num_reserved_slots - s.num_live_tokens for s in m.steps) / max(
            1, sum(s.num_reserved_slots for s in m.steps))
        lines.append(f"{mode}: {m.output_throughput:,.0f} output tok/s, at most {max(s.num_seqs for s in m.steps)} "
                     f"requests at once, {unused:.0%} of reserved slots unused, {m.num_preemptions} preemptions")
    lines.append(f"paged / contiguous (max_model_len reserved): {ratio:.2f}x")
    chart = Chart(f"Requests running, {kv_cache_tokens:,} KV slots in {block_size}-token blocks", "time (s)",
                  "requests in the step", xs, series)
    return Result(ratio, lines, chart, decision_digest(list(runs.values())))


# ---- lesson 3: chunked prefill and the token budget --------------------------------------------------------------

BUDGETS = (256, 512, 1024, 2048, 4096, 8192)


def chunked_prefill(hardware: str = "h100-sxm", long_prompt_len: int = 4096, num_decodes: int = 16) -> Result:
    """`num_decodes` requests decode when four long prompts arrive together; each token budget in turn. A
    prompt that fits the budget is prefilled in one long step that every running decode waits for: the
    decodes' worst gap between two tokens grows with the budget. The prompts' mean TTFT barely gains, and can
    lose: one big step finishes two prompts together, where chunks finish the first prompt sooner."""
    decodes = tuple(WorkloadRequest(0.0, 64, 256) for _ in range(num_decodes))
    prompts = tuple(WorkloadRequest(0.05, long_prompt_len, 16) for _ in range(4))
    workload = Workload(decodes + prompts, seed=0, name="stall")
    stall, ttft = "decodes' worst ITL (ms)", "long prompts' mean TTFT (ms)"
    curves: dict[str, list[tuple[float, float]]] = {stall: [], ttft: []}
    runs, lines = [], []
    for budget in BUDGETS:
        config = EngineConfig(max_num_batched_tokens=budget, max_num_seqs=128, max_model_len=8192 + 256,
                              num_kv_blocks=cdiv(num_decodes * 320 + 4 * (long_prompt_len + 16), 16) + 64)
        m = simulator(hardware, config).run(workload)
        gaps = [b - a for r in m.requests if r.num_prompt_tokens == 64 for a, b in zip(r.token_times, r.token_times[1:])]
        firsts = [r.ttft for r in m.requests if r.num_prompt_tokens == long_prompt_len]
        curves[stall].append((budget, 1000 * max(gaps)))
        curves[ttft].append((budget, 1000 * sum(firsts) / len(firsts)))
        runs.append(m)
        lines.append(f"budget {budget}: decodes' worst ITL {curves[stall][-1][1]:.1f} ms (median "
                     f"{m.median_itl_ms:.1f}), long prompts' mean TTFT {curves[ttft][-1][1]:.0f} ms")
    worst = [y for _, y in curves[stall]]
    ratio = worst[-1] / worst[0]
    lines.append(f"worst ITL at budget {BUDGETS[-1]} / at {BUDGETS[0]}: {ratio:.2f}x")
    xs, series = aligned(curves)
    series[1].right_axis = True
    chart = Chart("The token-budget dial", "max_num_batched_tokens", stall, xs, series, y2_label=ttft, log_x=True)
    return Result(ratio, lines, chart, decision_digest(runs))


# ---- lesson 4: prefix caching -----------------------------------------------------------------------------------

def prefix_caching(hardware: str = "h100-sxm", prefix_len: int = 1000, block_size: int = 16) -> Result:
    """32 requests sharing a `prefix_len`-token system prompt, after one warm-up request left it in the cache;
    with prefix caching on and off. Only whole blocks hit."""
    suffix_len, output_len = (16, 64), 32
    warmup = Workload.shared_prefix(1, 1, prefix_len, 8, 4, seed=1, prefix_seed=0)
    workload = Workload.shared_prefix(1, 32, prefix_len, suffix_len, output_len, arrival=20.0, seed=0)
    runs = {}
    for caching in (True, False):
        config = EngineConfig(block_size=block_size, enable_prefix_caching=caching, max_num_seqs=64,
                              max_num_batched_tokens=4096, num_kv_blocks=cdiv(40 * (prefix_len + 128), block_size))
        runs["on" if caching else "off"] = simulator(hardware, config).run_rounds([warmup, workload])[-1]
    on, off = runs["on"], runs["off"]
    hit_rate = 100 * on.prefix_cache_hit_rate
    whole_blocks = (prefix_len // block_size) * block_size
    mean_prompt = sum(r.prompt_len for r in workload.requests) / len(workload.requests)
    curves = {f"caching {name}": [(i, 1000 * r.ttft) for i, r in enumerate(m.requests)] for name, m in runs.items()}
    xs, series = aligned(curves)
    lines = [f"hit rate {hit_rate:.1f}% of prompt tokens (whole blocks of the prefix: {whole_blocks} of "
             f"{mean_prompt:.0f} tokens a prompt on average, {100 * whole_blocks / mean_prompt:.1f}%)",
             f"mean TTFT {on.mean_ttft_ms:.1f} ms with caching, {off.mean_ttft_ms:.1f} ms without "
             f"({off.mean_ttft_ms / on.mean_ttft_ms:.2f}x)",
             f"output {on.output_throughput:,.0f} vs {off.output_throughput:,.0f} tok/s"]
    chart = Chart("Time to first token, request by request", "request", "TTFT (ms)", xs, series)
    return Result(hit_rate, lines, chart, decision_digest([on, off]))


# ---- lesson 5: speculative decoding ------------------------------------------------------------------------------

SPEC_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128)


def speculative_decoding(hardware: str = "h100-sxm", acceptance_rate: float = 0.7,
                         num_speculative_tokens: int = 4) -> Result:
    """Speed-up of prompt-lookup speculation (each draft token accepted with `acceptance_rate`, drafts free to
    propose) over plain decoding, at each batch size: verifying k drafts is nearly free while decode is
    memory-bound and costs k+1 tokens of compute once it is not."""
    k, prompt_len, output_len = num_speculative_tokens, 128, 64
    curve, runs, lines = [], [], []
    for batch in SPEC_BATCHES:
        workload = Workload.synthetic(batch, prompt_len, output_len, seed=batch)
        config = EngineConfig(max_num_seqs=batch, max_num_batched_tokens=max(512, batch * (k + 1)),
                              num_kv_blocks=batch * cdiv(prompt_len + output_len + k, 16) + 1)
        plain = simulator(hardware, config).run(workload)
        spec_config = config.replace(speculative_method="ngram", num_speculative_tokens=k,
                                     speculative_disable_by_batch_size=None)
        spec = simulator(hardware, spec_config, acceptance=AcceptanceRate((acceptance_rate,), seed=batch)).run(workload)
        speedup = spec.output_throughput / plain.output_throughput
        curve.append((batch, speedup))
        runs += [plain, spec]
        lines.append(f"batch {batch}: {plain.output_throughput:,.0f} -> {spec.output_throughput:,.0f} output tok/s "
                     f"({speedup:.2f}x, {spec.mean_acceptance_length:.2f} tokens per verify)")
    xs, series = aligned({"speculation / plain": curve, "break-even": [(b, 1.0) for b in SPEC_BATCHES]})
    chart = Chart(f"Speed-up at acceptance {acceptance_rate}, k = {k}", "batch size (requests)", "speed-up (x)",
                  xs, series, log_x=True)
    return Result(curve[0][1], lines, chart, decision_digest(runs))


# ---- lesson 7: the tuning knobs ----------------------------------------------------------------------------------

MAX_NUM_SEQS = (4, 8, 16, 32, 64, 128)


def tuning_knobs(hardware: str = "h100-sxm", request_rate: float = 16.0, max_num_batched_tokens: int = 2048) -> Result:
    """A small sweep: max_num_seqs from 4 to 128 under a Poisson load of `request_rate` requests/s. Too few
    seats queue the load (TTFT climbs); past the point the load needs, more buys nothing."""
    workload = Workload.synthetic(96, (64, 1024), (16, 256), arrival=request_rate, seed=0)
    curves: dict[str, list[tuple[float, float]]] = {"output tok/s": [], "p99 TTFT (ms)": []}
    runs, lines = [], []
    for seqs in MAX_NUM_SEQS:
        config = EngineConfig(max_num_seqs=seqs, max_num_batched_tokens=max_num_batched_tokens)
        m = simulator(hardware, config).run(workload)
        curves["output tok/s"].append((seqs, m.output_throughput))
        curves["p99 TTFT (ms)"].append((seqs, m.p99_ttft_ms))
        runs.append(m)
        lines.append(f"max_num_seqs {seqs}: {m.output_throughput:,.0f} output tok/s, p99 TTFT {m.p99_ttft_ms:,.0f} ms, "
                     f"p99 ITL {m.p99_itl_ms:.1f} ms")
    ttft = dict(curves["p99 TTFT (ms)"])
    best = next(seqs for seqs in MAX_NUM_SEQS if ttft[seqs] <= 1.05 * min(ttft.values()))
    lines.append(f"smallest max_num_seqs within 5% of the best p99 TTFT: {best}")
    xs, series = aligned(curves)
    series[1].right_axis = True
    chart = Chart(f"max_num_seqs at {request_rate:g} requests/s", "max_num_seqs", "output tok/s", xs, series,
                  y2_label="p99 TTFT (ms)", log_x=True)
    return Result(best, lines, chart, decision_digest(runs))


PLAYGROUNDS: tuple[Playground, ...] = (
    Playground("01-continuous-batching", "Static vs continuous batching",
               "How many times the output throughput of static batching will continuous batching reach?", "x",
               (GPU_KNOB, Knob("max_num_seqs", "max_num_seqs (batch slots)", (8, 16, 32, 64), 32),
                Knob("output_lengths", "output lengths", tuple(OUTPUT_LENGTHS), "long tail (mean 128)")),
               continuous_batching),
    Playground("02-paged-attention", "Paged vs contiguous KV allocation",
               "How many times the throughput of reserving max_model_len per request will paging reach?", "x",
               (GPU_KNOB, Knob("block_size", "block_size", (1, 8, 16, 32, 64, 128), 16),
                Knob("kv_cache_tokens", "KV pool (token slots)", (8192, 16384, 32768, 65536), 16384)),
               paged_attention),
    Playground("03-chunked-prefill-and-disaggregation", "The token-budget dial",
               "How many times longer will the decodes' worst gap between tokens be at budget 8192 than at 256?", "x",
               (GPU_KNOB, Knob("long_prompt_len", "long prompts' length", (1024, 2048, 4096, 8192), 4096),
                Knob("num_decodes", "requests decoding", (4, 16, 64), 16)),
               chunked_prefill),
    Playground("04-prefix-caching", "Shared system prompt, cache on and off",
               "What share of prompt tokens will the prefix cache serve?", "%",
               (GPU_KNOB, Knob("prefix_len", "shared prefix (tokens)", (8, 100, 1000, 4000), 1000),
                Knob("block_size", "block_size", (16, 32, 64, 128), 16)),
               prefix_caching),
    Playground("05-speculative-decoding", "Speculation's speed-up as the batch grows",
               "What speed-up will speculation give a single request (batch 1)?", "x",
               (GPU_KNOB, Knob("acceptance_rate", "acceptance rate per draft token", (0.3, 0.5, 0.7, 0.9), 0.7),
                Knob("num_speculative_tokens", "num_speculative_tokens (k)", (2, 4, 8), 4)),
               speculative_decoding),
    Playground("07-tuning-knobs", "A small sweep of max_num_seqs",
               "Which is the smallest max_num_seqs that keeps p99 TTFT within 5% of its best?", "",
               (GPU_KNOB, Knob("request_rate", "request rate (requests/s)", (4.0, 16.0, 64.0), 16.0),
                Knob("max_num_batched_tokens", "max_num_batched_tokens", (512, 2048, 8192), 2048)),
               tuning_knobs),
)
BY_LESSON = {p.lesson: p for p in PLAYGROUNDS}


# ---- the course site's dashboard, fed by the simulator in the browser -------------------------------------------

DASHBOARD_SPEEDS = (0.5, 1.0, 2.0, 4.0, 8.0)


def dashboard_recording(hardware: str = "h100-sxm", speed: float = 1.0) -> Recording:
    """What the site's dashboard replays: two tenants, one sending three times the other's load under the fair
    policy (equal weights), with four shared system prompts, into a pool of 1,024 blocks small enough to
    preempt. A choice of `GPUS` and of `DASHBOARD_SPEEDS` only, as a playground's knobs."""
    if hardware not in GPUS or speed not in DASHBOARD_SPEEDS:
        raise ValueError(f"hardware must be one of {list(GPUS)} and speed one of {list(DASHBOARD_SPEEDS)}, "
                         f"got {hardware!r} and {speed!r}")
    workload = Workload.shared_prefix(4, 40, 256, (16, 512), (16, 384), arrival=25.0, seed=0)
    config = EngineConfig(max_num_seqs=64, max_num_batched_tokens=2048, num_kv_blocks=1024,
                          scheduling_policy="fair", tenant_weights=(("a", 1.0), ("b", 1.0)))
    title = (f"simulated in your browser: {MODEL} on {hardware}, tenants a and b (a sends 3x b's load, equal "
             f"weights), at {speed:g}x")
    return record_simulation(simulator(hardware, config), workload.with_tenant_mix({"a": 3, "b": 1}), speed, title)


def dashboard_frames(hardware: str = "h100-sxm", speed: float = 1.0) -> list[dict[str, Any]]:
    """The whole replay of `dashboard_recording`, a frame per tenth of a second of replay."""
    return Replay(dashboard_recording(hardware, speed), speed).all_frames()


def catalog() -> list[dict[str, Any]]:
    """Each playground's lesson, title, question, unit and knobs: what the page builds its form from."""
    return [{"lesson": p.lesson, "title": p.title, "question": p.question, "unit": p.unit,
             "knobs": [asdict(k) for k in p.knobs]} for p in PLAYGROUNDS]


def run(lesson: str, **knobs: Any) -> dict[str, Any]:
    """Run a lesson's playground with these knobs (the rest at their defaults); the result as a JSON-ready dict.
    A knob the playground has not, or a value it does not offer, is a ValueError naming the choices."""
    if lesson not in BY_LESSON:
        raise ValueError(f"no playground for lesson {lesson!r}; there are: {', '.join(BY_LESSON)}")
    playground = BY_LESSON[lesson]
    offered = {k.name: k for k in playground.knobs}
    for name, value in knobs.items():
        if name not in offered:
            raise ValueError(f"{lesson} has no knob {name!r}; it has: {', '.join(offered)}")
        if value not in offered[name].choices:
            raise ValueError(f"{name}={value!r} is not offered; choose one of {list(offered[name].choices)}")
    return asdict(playground.experiment(**{**playground.defaults(), **knobs}))
