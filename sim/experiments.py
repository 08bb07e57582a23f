"""Every lesson experiment, once: the same workload through the simulator and the real engine, as a table.

Each function returns a list of rows (plain dicts, one per configuration and side) that a notebook prints,
plots and asserts on. The columns are `RunMetrics` fields plus `side` ("measured" | "simulated") and, on
simulated rows, `*_err_pct`: the simulated number's error relative to the measured one. The engine is only
imported when a measured side is asked for, so simulator-only sweeps run without torch.

Rule of the house (shared/CURRICULUM.md): numbers the shared core decides (steps, batch composition,
preemptions) must be identical on both sides for workloads whose arrivals do not depend on timing; only
times may differ, and every table shows by how much.

Lesson: lessons/01-continuous-batching.md (experiment protocol); lessons/02-paged-attention.md.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from statistics import fmean, median
from typing import Any

import simpy

from ref_engine.core.config import EngineConfig
from ref_engine.core.metrics import RunMetrics, relative_error
from ref_engine.core.workload import Exponential, LengthSpec, Workload
from ref_engine.model.arch_config import ArchConfig
from sim.cost_model import BatchShape, CostModel
from sim.hardware import HardwareProfile
from sim.simulator import Simulator, resolve_model

COMPARED = ("output_throughput", "mean_ttft_ms", "mean_itl_ms", "mean_e2el_ms", "duration")
POLICY_COUNTS = ("num_steps", "num_preemptions", "completed")


@dataclass(frozen=True)
class Sides:
    """Which model the engine serves and which profile the simulator prices it with.

    `model`: a `LoadedModel` (or None to load the default), used only for measured rows; `hardware`: a
    profile or name (None: this machine's calibrated profile); `measure=False` skips the engine.
    `arch`: the model the simulator prices (an `ArchConfig` or a name such as "llama-3.1-8b"; None: the
    engine's model, or SmolLM2-135M); `dtype`: None lets the simulator choose (a calibrated profile's own
    dtype, else bfloat16). A GPU what-if is `Sides(arch="llama-3.1-8b", hardware="h100-sxm", measure=False)`."""

    model: Any = None
    hardware: HardwareProfile | str | None = None
    measure: bool = True
    repeats: int = 1
    arch: ArchConfig | str | None = None
    dtype: str | None = None

    def simulated_arch(self) -> ArchConfig:
        """The model the simulator prices: `arch`, else the engine's model, else the default."""
        if self.arch is None and getattr(self.model, "arch", None) is not None:
            return self.model.arch
        return resolve_model(self.arch)

    def simulator(self, config: EngineConfig) -> Simulator:
        return Simulator(self.simulated_arch(), self.hardware, config, dtype=self.dtype)

    def cost_model(self, block_size: int = 16) -> CostModel:
        """The step-time model the simulator of these sides uses (same model, profile and dtype)."""
        return self.simulator(EngineConfig(block_size=block_size, num_kv_blocks=1)).cost_model


def run_pair(workload: Workload, config: EngineConfig, sides: Sides, *, warmup: Workload | None = None,
             **labels: Any) -> list[dict[str, Any]]:
    """Run one workload and config on both sides; returns [measured row, simulated row] (or just simulated).

    `warmup`, when given, is served first on the same engine and not measured (a warm prefix cache). The
    engine runs `sides.repeats` times and the fastest run is kept, as calibration keeps the fastest step:
    on a shared machine other processes only ever slow a run down."""
    return _paired_rows([_Job(workload, config, labels, warmup=(warmup,) if warmup else ())], sides)


def machine_slowdown(measured: RunMetrics, sides: Sides) -> float:
    """How much slower the machine ran than its profile says: the median, over a measured run's steps, of
    (measured step time / the cost model's price of that very batch shape). About 1 when the machine is in
    the state it was calibrated in; clearly above 1 when other programs were using the cores meanwhile,
    clearly below 1 when the machine now runs faster than when it was calibrated. Either way absolute
    simulated-vs-measured errors then say nothing about the simulator. (Every row of a step is priced as
    needing logits: a mid-prompt chunk is priced one lm_head row too high, a small bias.)"""
    cost_model = sides.cost_model()
    return median(s.duration / cost_model.step_time(BatchShape(s.query_lens, s.context_lens))
                  for s in measured.steps)


def drift_note(slowdown: float, busy: float = 1.15) -> str | None:
    """Why a measurement cannot be judged against the profile (None when it can): the engine ran more than
    `busy` times slower than the profile predicts (a busy machine), or more than `busy` times faster (the
    profile is stale)."""
    if slowdown > busy:
        return f"the engine ran {slowdown:.2f}x slower than its profile predicts (a busy machine)"
    if slowdown < 1 / busy:
        return (f"the engine ran {1 / slowdown:.2f}x faster than its profile predicts (the profile is stale: "
                "recalibrate with sim.calibrate.calibrate(model))")
    return None


def error_check(rows: Iterable[dict[str, Any]], fields: Iterable[str], tolerance_pct: float = 35.0,
                busy: float = 1.15) -> tuple[list[str], list[str]]:
    """Check every (measured, simulated) pair: each `field` simulated within `tolerance_pct` of measured.

    Returns (problems, skipped). A pair whose measured run has a `slowdown` beyond `busy` either way (see
    `drift_note`) is skipped and listed, not judged. Notebooks assert `not problems` and print `skipped`."""
    fields = list(fields)
    problems, skipped = [], []
    for measured, simulated in pairs(rows):
        label = ", ".join(f"{k}={v}" for k, v in measured.items() if k not in _NOT_LABELS and not _is_metric(k))
        note = drift_note(measured.get("slowdown", 1.0), busy)
        if note:
            skipped.append(f"{label}: skipped, {note}")
            continue
        for field in fields:
            error = simulated[f"{field}_err_pct"]
            if not abs(error) <= tolerance_pct:
                problems.append(f"{label}: {field} simulated {simulated[field]:.4g} vs measured "
                                f"{measured[field]:.4g} ({error:+.1f}%, tolerance {tolerance_pct:g}%)")
    return problems, skipped


_NOT_LABELS = {"side", "metrics", "slowdown", "repeat_spread_pct"}


def _is_metric(key: str) -> bool:
    return key in RunMetrics.__dataclass_fields__ or key.endswith("_err_pct")


def _row(metrics: RunMetrics, side: str, labels: dict[str, Any], reference: RunMetrics | None = None
         ) -> dict[str, Any]:
    row = {**labels, "side": side, **metrics.to_dict(), "metrics": metrics}
    if reference is not None:
        for key in COMPARED:
            row[f"{key}_err_pct"] = relative_error(getattr(metrics, key), getattr(reference, key))
    return row


def pairs(rows: Iterable[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(measured, simulated) row pairs, in order."""
    rows = list(rows)
    return [(m, s) for m, s in zip(rows, rows[1:]) if m["side"] == "measured" and s["side"] == "simulated"]


def same_policy(measured: RunMetrics, simulated: RunMetrics) -> bool:
    """True when the shared core made the same decisions on both sides: same steps, same batch shapes in
    the same order, same preemptions. Holds whenever arrivals do not depend on timing (all at once)."""
    return (all(getattr(measured, k) == getattr(simulated, k) for k in POLICY_COUNTS)
            and [(s.query_lens, s.context_lens) for s in measured.steps]
            == [(s.query_lens, s.context_lens) for s in simulated.steps])


# ---- lesson 1: the cost of a step, static vs continuous batching, load and capacity ----


def step_cost(batch_sizes: Iterable[int], contexts: Iterable[int], prefill_lens: Iterable[int], sides: Sides, *,
              decode_tokens: int = 5, max_num_batched_tokens: int = 16384, seed: int = 0) -> list[dict[str, Any]]:
    """The cost of one step (CURRICULUM row 0): a decode step of B requests at context C, and a prefill step
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
                              num_kv_blocks=-(-(length + 1) // 16) + 1)
        return bench.run(workload, config, model=sides.model).steps[0].duration
    budget = min(batch * length, max_tokens)
    # with a budget below B x C the prompts go in over several steps and start decoding at different steps;
    # extra output tokens keep every request running until `decode_tokens` steps decode all B at once
    extra = 0 if budget == batch * length else 2 * -(-(batch * length) // budget)
    output_len = decode_tokens + extra
    workload = Workload.synthetic(batch, prompt_len=length, output_len=output_len, seed=seed,
                                  name=f"decode-{batch}x{length}")
    config = EngineConfig(max_num_seqs=batch, max_num_batched_tokens=max(budget, 16),
                          num_kv_blocks=batch * (-(-(length + output_len) // 16) + 1) + 1)
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
                                  num_kv_blocks=max_num_seqs * -(-(prompt_len + cap) // 16) + 16,
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
                        num_kv_blocks=max_num_seqs * -(-longest // 16) + 16, scheduling=scheduling)


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


# ---- lesson 1: tables and plots for the notebook ----


def format_table(rows: Iterable[dict[str, Any]], columns: Iterable[str]) -> str:
    """A plain-text table of `columns` (missing values blank; `*_err_pct` columns as signed percents)."""
    columns = list(columns)
    cells = [[_cell(row.get(c), c) for c in columns] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(columns, widths)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(v.rjust(w) for v, w in zip(r, widths)) for r in cells]
    return "\n".join(lines)


def _cell(value: Any, column: str) -> str:
    if value is None:
        return ""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if column.endswith("_err_pct"):
        return f"{value:+.1f}%"
    if isinstance(value, int):
        return str(value)
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"


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


# ---- lesson 2: PagedAttention ----
#
# Four experiments (lessons/02-paged-attention.md): KV arithmetic per model (`kv_cache_sizes`,
# `engine_kv_bytes`); the same KV budget under three allocators (`allocation_modes`); the block-size U-shape
# (`block_size_sweep`); recompute vs swap on a squeezed pool (`preemption_modes`) and what one preemption
# costs at each block size (`preemption_cost`). Memory numbers (live tokens, reserved slots, preemptions,
# recomputed tokens, swapped blocks) are decided by the shared core, so they are identical on both sides
# for all-at-once workloads; only times differ.

KV_MODELS = ("smollm2-135m", "llama-2-7b", "llama-3.1-8b", "llama-3.1-70b")
ALLOCATION_MODES = ("contiguous", "contiguous_exact", "paged")


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def kv_cache_sizes(models: Iterable[str] = KV_MODELS, *, hardware: HardwareProfile | str = "h100-sxm",
                   dtype: str = "bfloat16", seq_len: int = 2048, block_size: int = 16,
                   gpu_memory_utilization: float = 0.9, kv_cache_memory: int | None = None) -> list[dict[str, Any]]:
    """KV arithmetic, one row per model: bytes per token (2 x layers x KV heads x head_dim x bytes), per
    `seq_len`-token sequence (whole blocks), and how many such sequences fit at once.

    The pool is `kv_cache_memory` bytes when given, else what one device of `hardware` has left after the
    weights and activations (`kv_cache_num_blocks`, vLLM's sizing); a model whose weights do not fit one
    device is sharded over the smallest tensor-parallel degree (1, 2, 4, 8) that leaves room, and `tp` says
    which. Pure arithmetic: no engine, no simulation."""
    from ref_engine.model.arch_config import ArchConfig
    from sim.cost_model import kv_cache_num_blocks
    from sim.hardware import dtype_bytes
    from sim.simulator import resolve_hardware

    hw = resolve_hardware(hardware)
    b = dtype_bytes(dtype)
    rows = []
    for name in models:
        arch = ArchConfig.named(name)
        tp, num_blocks = 1, 0
        if kv_cache_memory is not None:
            num_blocks = kv_cache_memory // arch.kv_bytes_per_block(block_size, b)
            kv_memory = kv_cache_memory
        else:
            for tp in (1, 2, 4, 8):
                try:
                    num_blocks = kv_cache_num_blocks(arch, hw, dtype, block_size, gpu_memory_utilization, tp)
                    break
                except ValueError:
                    continue
            kv_memory = num_blocks * arch.kv_bytes_per_block(block_size, b, tp) * tp  # over all tp devices
        per_token = arch.kv_bytes_per_token(b)
        blocks_per_seq = _cdiv(seq_len, block_size)
        rows.append({
            "model": arch.name, "dtype": dtype, "num_layers": arch.num_layers,
            "num_attention_heads": arch.num_attention_heads, "num_kv_heads": arch.num_kv_heads,
            "head_dim": arch.head_dim, "kv_bytes_per_token": per_token, "kv_kib_per_token": per_token / 1024,
            "kv_mib_per_seq": blocks_per_seq * block_size * per_token / 2**20,
            "weights_gb": arch.weight_bytes(b) / 1e9, "tp": tp, "kv_cache_gib": kv_memory / 2**30,
            "seqs_that_fit": num_blocks // blocks_per_seq,
            "where": f"{kv_cache_memory / 2**30:g} GiB KV" if kv_cache_memory is not None else f"{tp} x {hw.name}",
        })
    return rows


def engine_kv_bytes(model: Any, *, block_size: int = 16, num_kv_blocks: int = 4) -> dict[str, Any]:
    """What the real engine allocates for its KV cache, against the arithmetic: builds an `LLMEngine` on
    `model` (a `LoadedModel`) with a pool of `num_kv_blocks` blocks and sums the bytes of its KV tensors."""
    from ref_engine.engine import LLMEngine

    engine = LLMEngine(model, config=EngineConfig(block_size=block_size, num_kv_blocks=num_kv_blocks))
    allocated = sum(t.numel() * t.element_size() for t in engine.runner.kv_caches)
    element = engine.runner.kv_caches[0].element_size()
    return {"model": engine.arch.name, "dtype": str(engine.dtype).removeprefix("torch."),
            "block_size": block_size, "num_kv_blocks": num_kv_blocks, "allocated_bytes": allocated,
            "allocated_bytes_per_token": allocated // (num_kv_blocks * block_size),
            "arithmetic_bytes_per_token": engine.arch.kv_bytes_per_token(element)}


def memory_stats(metrics: RunMetrics) -> dict[str, Any]:
    """Memory columns of one run, from its step log (policy numbers, identical on both sides):
    live_fraction = sum of live tokens / sum of reserved slots over all steps (vLLM Fig 2's "token states"
    share of the KV memory in use), mean and peak live tokens and reserved slots, mean and peak batch size
    (requests per step), and recomputed_tokens: tokens computed beyond prompt + output - 1 per request
    (what recompute preemption redoes)."""
    from statistics import fmean

    nan = float("nan")
    steps = metrics.steps
    reserved = sum(s.num_reserved_slots for s in steps)
    computed = sum(s.num_tokens for s in steps)
    return {
        "live_fraction": sum(s.num_live_tokens for s in steps) / reserved if reserved else nan,
        "mean_live_tokens": fmean(s.num_live_tokens for s in steps) if steps else nan,
        "mean_reserved_slots": fmean(s.num_reserved_slots for s in steps) if steps else nan,
        "max_reserved_slots": max((s.num_reserved_slots for s in steps), default=0),
        "mean_batch": fmean(s.num_seqs for s in steps) if steps else nan,
        "max_batch": max((s.num_seqs for s in steps), default=0),
        "recomputed_tokens": computed - (metrics.total_input_tokens + metrics.total_output_tokens
                                         - metrics.completed),
    }


def same_memory(measured: RunMetrics, simulated: RunMetrics) -> bool:
    """True when both sides held the same live tokens and reserved slots at every step."""
    return ([(s.num_live_tokens, s.num_reserved_slots) for s in measured.steps]
            == [(s.num_live_tokens, s.num_reserved_slots) for s in simulated.steps])


def _with_memory(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Add `memory_stats` to every row, and to each simulated row paired with a measured one the policy
    checks `same_policy` and `same_memory`."""
    for row in rows:
        row.update(memory_stats(row["metrics"]))
    for measured, simulated in pairs(rows):
        simulated["same_policy"] = same_policy(measured["metrics"], simulated["metrics"])
        simulated["same_memory"] = same_memory(measured["metrics"], simulated["metrics"])
    return rows


@dataclass(frozen=True)
class _Job:
    """One configuration of a lesson-2 experiment: what to run, how to label its rows, whether to measure."""

    workload: Workload
    config: EngineConfig
    labels: dict[str, Any]
    measure: bool = True
    warmup: tuple[Workload, ...] = ()  # served first on the same engine (not measured): a warm prefix cache

    def run_measured(self, model: Any) -> RunMetrics:
        from ref_engine import bench

        return bench.run_rounds([*self.warmup, self.workload], self.config, model=model)[-1]

    def run_simulated(self, sides: Sides) -> RunMetrics:
        return sides.simulator(self.config).run_rounds([*self.warmup, self.workload])[-1]


def _paired_rows(jobs: list[_Job], sides: Sides, simulate: Any = None) -> list[dict[str, Any]]:
    """[measured row, simulated row] per job, as `run_pair` makes them, with the engine's repeats
    interleaved: every job once, then every job again, and the fastest run of each kept. A burst of load
    from another process then slows one run of a job rather than all of them. `simulate(job)` returns
    (RunMetrics, extra columns for the simulated row); by default the sides' simulator runs the workload."""
    runs: dict[int, list[RunMetrics]] = {}
    if sides.measure:
        for _ in range(sides.repeats):
            for i, job in enumerate(jobs):
                if job.measure:
                    runs.setdefault(i, []).append(job.run_measured(sides.model))
    rows = []
    for i, job in enumerate(jobs):
        simulated, extra = simulate(job) if simulate else (job.run_simulated(sides), {})
        fastest = min(runs[i], key=lambda m: m.duration) if i in runs else None
        if fastest is not None:
            slowest = max(m.duration for m in runs[i])
            rows.append({**_row(fastest, "measured", job.labels), "slowdown": machine_slowdown(fastest, sides),
                         "repeat_spread_pct": 100.0 * (slowest / fastest.duration - 1)})  # the runs' disagreement
        rows.append({**_row(simulated, "simulated", job.labels, reference=fastest), **extra})
    return rows


def allocation_modes(sides: Sides, *, modes: Iterable[str] = ALLOCATION_MODES, num_requests: int = 8,
                     prompt_len: LengthSpec = (48, 80), output_len: LengthSpec = (8, 40), num_kv_blocks: int = 64,
                     block_size: int = 16, max_model_len: int = 256, max_num_seqs: int = 16,
                     max_num_batched_tokens: int = 512, seed: int = 0) -> list[dict[str, Any]]:
    """The same KV budget (`num_kv_blocks` blocks of `block_size` slots) and the same all-at-once workload
    under each allocator: "contiguous" reserves `max_model_len` slots per request up front (pre-vLLM
    servers), "contiguous_exact" reserves prompt + output (an oracle that knows the output length), "paged"
    takes a block when the tokens reach it (vLLM). One measured and one simulated row per mode, with
    `memory_stats` columns and, on simulated rows, `same_policy` and `same_memory`."""
    workload = Workload.synthetic(num_requests, prompt_len=prompt_len, output_len=output_len, seed=seed,
                                  name="allocation-modes")
    jobs = [_Job(workload, EngineConfig(block_size=block_size, num_kv_blocks=num_kv_blocks,
                                        max_model_len=max_model_len, kv_allocation=mode, max_num_seqs=max_num_seqs,
                                        max_num_batched_tokens=max_num_batched_tokens, seed=seed),
                 {"allocation": mode})
            for mode in modes]
    return _with_memory(_paired_rows(jobs, sides))


def plot_memory(ax: Any, metrics: RunMetrics, label: str = "", **style: Any) -> None:
    """Live tokens (solid) and reserved slots (dashed) at every step: the gap is the memory held but not
    used. `ax` is a matplotlib Axes; steps, not seconds, so both sides draw the same curve."""
    steps = range(len(metrics.steps))
    line, = ax.plot(steps, [s.num_live_tokens for s in metrics.steps], label=f"{label} live", **style)
    ax.plot(steps, [s.num_reserved_slots for s in metrics.steps], "--", color=line.get_color(),
            label=f"{label} reserved")
    ax.set_xlabel("step")
    ax.set_ylabel("token slots")


def block_size_sweep(block_sizes: Iterable[int], sides: Sides, *, workloads: dict[str, Workload],
                     kv_cache_tokens: int, measure_block_sizes: Iterable[int] = (),
                     kv_cache_memory: int | None = None, max_num_seqs: int = 256,
                     max_num_batched_tokens: int = 2048, max_model_len: int | None = None) -> list[dict[str, Any]]:
    """Each workload (all at once) at each block size, with the KV memory held fixed: the pool has
    `kv_cache_tokens // block_size` blocks (or `kv_cache_memory` bytes cut into blocks when given), so a
    bigger block means fewer, larger blocks, never more memory.

    Simulated rows for every block size; measured rows too (first) for the sizes in `measure_block_sizes`
    when `sides.measure`. Columns add `block_size`, `trace` (the workload's key), `num_kv_blocks`,
    `relative_duration` (the duration over the shortest simulated duration of that workload: 1 at the
    bottom of the U) and `memory_stats`. Expect a U: tiny blocks pay the cost model's per-block overhead, big ones waste their
    tail and fit fewer sequences, worst for short sequences (vLLM Fig 18b)."""
    from sim.hardware import dtype_bytes

    measure = set(measure_block_sizes)
    jobs = []
    for name, workload in workloads.items():
        for bs in block_sizes:
            if kv_cache_memory is not None:
                sim = sides.simulator(EngineConfig(block_size=bs, num_kv_blocks=1))
                num_blocks = kv_cache_memory // sim.arch.kv_bytes_per_block(bs, dtype_bytes(sim.dtype))
            else:
                num_blocks = kv_cache_tokens // bs
            config = EngineConfig(block_size=bs, num_kv_blocks=num_blocks, max_num_seqs=max_num_seqs,
                                  max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len)
            jobs.append(_Job(workload, config, {"trace": name, "block_size": bs, "num_kv_blocks": num_blocks},
                             measure=bs in measure))
    rows = _paired_rows(jobs, sides)
    for name in workloads:
        group = [r for r in rows if r["trace"] == name]
        best = min(r["duration"] for r in group if r["side"] == "simulated")
        for r in group:
            r["relative_duration"] = r["duration"] / best
    return _with_memory(rows)


@dataclass(frozen=True)
class SwapLink:
    """How long moving KV blocks between device and host memory takes, one direction:

        seconds = transfers x per_transfer_s + bytes / bandwidth
        transfers = num_layers                       if batched (one gather per layer for the whole plan)
                  = blocks x num_layers x 2          otherwise (one copy per block for K and one for V)

    Our runner copies a step's whole plan with one indexed copy per layer (batched); a swap done with one
    copy call per block pays the fixed cost per block, which is what makes small blocks slow to swap."""

    name: str
    bandwidth: float  # bytes/s, one direction
    per_transfer_s: float  # fixed cost of one copy call
    batched: bool = False

    def seconds(self, num_blocks: int, bytes_per_block: int, num_layers: int) -> float:
        if num_blocks == 0:
            return 0.0
        transfers = num_layers if self.batched else num_blocks * num_layers * 2
        return transfers * self.per_transfer_s + num_blocks * bytes_per_block / self.bandwidth


# Assumptions, not measurements: PCIe 4.0 x16 moves ~32 GB/s per direction on paper and ~25 GB/s in
# practice for large pinned copies; a copy call costs a few microseconds of driver and launch overhead.
PCIE4_PER_BLOCK = SwapLink("PCIe 4.0 x16, one copy per block", bandwidth=25e9, per_transfer_s=5e-6)
PCIE4_BATCHED = SwapLink("PCIe 4.0 x16, batched", bandwidth=25e9, per_transfer_s=5e-6, batched=True)


def host_copy_link(hardware: HardwareProfile, per_transfer_s: float = 20e-6) -> SwapLink:
    """A swap on a CPU, as our runner does it: per layer, gather the blocks into a temporary tensor, then
    scatter them into the other pool. Each byte is read and written twice, and the profile's memory
    bandwidth counts bytes read plus bytes written, so the copy moves at a quarter of it.
    `per_transfer_s` is a guess at one layer's fixed cost (two indexed copies)."""
    return SwapLink("DRAM copy (CPU, batched)", hardware.memory_bandwidth / 4, per_transfer_s, batched=True)


class SwapPricingTimer:
    """A step timer that adds the swap copies of each step (`SchedulerOutput.swap_out` / `swap_in`) to the
    cost model's price of its batch, and counts the blocks moved. The simulator's default timer prices the
    batch only, as if copies were free."""

    def __init__(self, cost_model: Any, link: SwapLink, bytes_per_block: int, num_layers: int) -> None:
        from sim.executor import CostModelTimer

        self.batch_timer = CostModelTimer(cost_model)
        self.link = link
        self.bytes_per_block = bytes_per_block
        self.num_layers = num_layers
        self.swapped_blocks = 0
        self.swap_s = 0.0

    def step_time(self, output: Any) -> float:
        swap_s = sum(self.link.seconds(len(plan), self.bytes_per_block, self.num_layers)
                     for plan in (output.swap_out, output.swap_in))
        self.swapped_blocks += len(output.swap_out) + len(output.swap_in)
        self.swap_s += swap_s
        return self.batch_timer.step_time(output) + swap_s


def _swap_priced_simulator(sides: Sides, config: EngineConfig, link: SwapLink | None) -> tuple[Simulator,
                                                                                               SwapPricingTimer]:
    from sim.hardware import dtype_bytes

    sim = sides.simulator(config)
    link = link or (host_copy_link(sim.hardware) if sim.hardware.source == "calibrated" else PCIE4_PER_BLOCK)
    timer = SwapPricingTimer(sim.cost_model, link, sim.arch.kv_bytes_per_block(config.block_size,
                                                                               dtype_bytes(sim.dtype)),
                             sim.arch.num_layers)
    sim.step_timer = timer
    return sim, timer


def preemption_modes(sides: Sides, *, modes: Iterable[str] = ("recompute", "swap"), num_requests: int = 8,
                     prompt_len: LengthSpec = (24, 40), output_len: LengthSpec = (24, 56), num_kv_blocks: int = 24,
                     block_size: int = 16, max_num_seqs: int = 8, max_num_batched_tokens: int = 512,
                     link: SwapLink | None = None, seed: int = 0) -> list[dict[str, Any]]:
    """A pool too small for the admitted requests' growth, under each preemption mode: paging admits on
    the prompts, the outputs grow, and the most recently admitted request is preempted (recompute: free
    and re-run later; swap: copy to the host pool and back). One measured and one simulated row per mode.

    The simulator prices each step's swap copies with `link` (default: a DRAM copy on a calibrated CPU
    profile, `PCIE4_PER_BLOCK` on a GPU profile); the engine pays its real copies. Columns add
    `memory_stats` (`recomputed_tokens` among them), and on simulated rows `swapped_blocks` (out + in; the
    engine moves the same blocks, since the policy is the same), `swap_s` (simulated seconds of copies),
    `same_policy` and `same_memory`."""
    workload = Workload.synthetic(num_requests, prompt_len=prompt_len, output_len=output_len, seed=seed,
                                  name="squeezed-pool")

    def simulate(job: _Job) -> tuple[RunMetrics, dict[str, Any]]:
        sim, timer = _swap_priced_simulator(sides, job.config, link)
        metrics = sim.run(job.workload)
        return metrics, {"swapped_blocks": timer.swapped_blocks, "swap_s": timer.swap_s}

    jobs = [_Job(workload, EngineConfig(block_size=block_size, num_kv_blocks=num_kv_blocks, preemption_mode=mode,
                                        max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                                        seed=seed),
                 {"preemption_mode": mode, "num_kv_blocks": num_kv_blocks, "block_size": block_size})
            for mode in modes]
    return _with_memory(_paired_rows(jobs, sides, simulate))


def pool_squeeze(pool_sizes: Iterable[int], sides: Sides, **kwargs: Any) -> list[dict[str, Any]]:
    """`preemption_modes` at each pool size (`num_kv_blocks`), from roomy to squeezed: preemptions climb
    and throughput falls as the pool shrinks. Same keyword arguments as `preemption_modes`."""
    rows = []
    for num_kv_blocks in pool_sizes:
        rows += preemption_modes(sides, num_kv_blocks=num_kv_blocks, **kwargs)
    return rows



def preemption_cost(block_sizes: Iterable[int], sides: Sides, *, num_tokens: int = 512,
                    link: SwapLink | None = None) -> list[dict[str, Any]]:
    """What preempting one request holding `num_tokens` tokens costs, at each block size (vLLM §7.3, Fig 19):
    recompute = one prefill of those tokens; swap = copying its blocks out and back in.

    Simulated rows: the cost model prices the prefill (`BatchShape.prefill`), `link` prices the copies
    (default as in `preemption_modes`). Measured rows (when `sides.measure`): the engine's own prefill step
    of a `num_tokens` prompt (fastest of `sides.repeats`), and the runner's own swap copy
    (`ModelRunner._copy_blocks`) out and back in on real KV tensors, best of 5."""
    from sim.cost_model import BatchShape
    from sim.hardware import dtype_bytes

    rows = []
    for bs in block_sizes:
        config = EngineConfig(block_size=bs, num_kv_blocks=_cdiv(num_tokens, bs) + 1,
                              max_num_batched_tokens=max(num_tokens, 16), max_num_seqs=1)
        sim, timer = _swap_priced_simulator(sides, config, link)
        num_blocks = _cdiv(num_tokens, bs)
        labels = {"block_size": bs, "num_tokens": num_tokens, "num_blocks": num_blocks}
        recompute_s = sim.cost_model.step_time(BatchShape.prefill(num_tokens))
        swap_s = 2 * timer.link.seconds(num_blocks, timer.bytes_per_block, timer.num_layers)
        simulated = {**labels, "side": "simulated", "recompute_ms": recompute_s * 1e3, "swap_ms": swap_s * 1e3,
                     "link": timer.link.name,
                     "kv_mib": num_blocks * sim.arch.kv_bytes_per_block(bs, dtype_bytes(sim.dtype)) / 2**20}
        if sides.measure:
            measured = {**labels, "side": "measured", "recompute_ms": 1e3 * _measure_prefill(num_tokens, config, sides),
                        "swap_ms": 1e3 * _measure_swap(sides.model, bs, num_blocks)}
            simulated["recompute_ms_err_pct"] = relative_error(simulated["recompute_ms"], measured["recompute_ms"])
            simulated["swap_ms_err_pct"] = relative_error(simulated["swap_ms"], measured["swap_ms"])
            rows.append(measured)
        rows.append(simulated)
    return rows


def _measure_prefill(num_tokens: int, config: EngineConfig, sides: Sides) -> float:
    from ref_engine import bench

    workload = Workload.synthetic(1, prompt_len=num_tokens, output_len=1, name=f"prefill-{num_tokens}")
    return min(bench.run(workload, config, model=sides.model).steps[0].duration for _ in range(sides.repeats))


def _measure_swap(model: Any, block_size: int, num_blocks: int, repeats: int = 5) -> float:
    """Seconds for the runner to copy `num_blocks` blocks device -> host and back (on a CPU: DRAM to DRAM)."""
    import time

    import torch

    from ref_engine.attention import allocate_kv_cache
    from ref_engine.runner import ModelRunner

    dtype = next(model.model.parameters()).dtype
    device = next(model.model.parameters()).device
    device_kv = allocate_kv_cache(model.arch, num_blocks, block_size, dtype, device)
    host_kv = allocate_kv_cache(model.arch, num_blocks, block_size, dtype, torch.device("cpu"))
    plan = [(i, i) for i in range(num_blocks)]
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        ModelRunner._copy_blocks(plan, src=device_kv, dst=host_kv)
        ModelRunner._copy_blocks(plan, src=host_kv, dst=device_kv)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - start)
    return best


# ---- lesson 4: prefix caching ----


def _prefix_config(block_size: int, caching: bool, num_kv_blocks: int, max_num_seqs: int = 16,
                   max_num_batched_tokens: int = 2048) -> EngineConfig:
    return EngineConfig(block_size=block_size, enable_prefix_caching=caching, num_kv_blocks=num_kv_blocks,
                        max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens)


def _warmup(num_groups: int, prefix_len: int, suffix_len: LengthSpec, seed: int) -> Workload:
    """One request per group of `Workload.shared_prefix(num_groups, ..., seed=seed)`: the group's prefix,
    another suffix, one output token. Served first, it leaves the prefixes cached for the measured run."""
    return Workload.shared_prefix(num_groups, 1, prefix_len, suffix_len, 1, seed=seed + 1, prefix_seed=seed,
                                  name="warm-up")


def _with_hits(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mark each simulated row paired with a measured one: did both sides hit the same number of tokens?"""
    for measured, simulated in pairs(rows):
        simulated["same_hits"] = measured["prefix_cache_hits"] == simulated["prefix_cache_hits"]
    return rows


def shared_prefix_ttft(prefix_lens: Iterable[int], sides: Sides, *, num_groups: int = 1,
                       requests_per_group: int = 8, suffix_len: LengthSpec = 50, output_len: LengthSpec = 16,
                       block_size: int = 16, num_kv_blocks: int = 512, max_num_batched_tokens: int = 2048,
                       seed: int = 0) -> list[dict[str, Any]]:
    """A shared system prompt of each length in `prefix_lens`, cache off vs on (CURRICULUM row 4).

    One request per group warms the cache first (not measured); then `requests_per_group` requests per
    group, each the group's prefix plus its own `suffix_len`-token question, arrive at once. With caching
    they skip the prefix's full blocks, so TTFT falls and throughput rises in proportion to the prefill
    skipped. Rows: (prefix_len, caching) x (measured, simulated), with `prefix_cache_hit_rate` and, on
    simulated rows, `same_hits` (the core decides hits, so they must be equal)."""
    jobs = []
    for prefix_len in prefix_lens:
        warmup = _warmup(num_groups, prefix_len, suffix_len, seed)
        workload = Workload.shared_prefix(num_groups, requests_per_group, prefix_len, suffix_len, output_len,
                                          seed=seed, name=f"prefix-{prefix_len}")
        for caching in (False, True):
            config = _prefix_config(block_size, caching, num_kv_blocks,
                                    max_num_batched_tokens=max_num_batched_tokens)
            jobs.append(_Job(workload, config, {"prefix_len": prefix_len, "caching": caching},
                             warmup=(warmup,)))
    return _with_hits(_paired_rows(jobs, sides))


def hit_rate_sweep(prefix_lens: Iterable[int], block_sizes: Iterable[int], *, requests_per_group: int = 8,
                   suffix_len: int = 50, seed: int = 0) -> list[dict[str, Any]]:
    """Simulated hit rate after a warm-up, for each shared-prefix length and block size, next to the
    formula: only whole blocks hit, so hits = min(floor(prefix_len / block_size) * block_size, prompt_len - 1)
    per request. A prefix shorter than one block never hits. (The core decides hits: no engine run is needed
    to know them.)"""
    rows = []
    for block_size in block_sizes:
        for prefix_len in prefix_lens:
            warmup = _warmup(1, prefix_len, suffix_len, seed)
            workload = Workload.shared_prefix(1, requests_per_group, prefix_len, suffix_len, 4, seed=seed)
            config = _prefix_config(block_size, True, num_kv_blocks=4096 // block_size + 64)
            metrics = Sides(measure=False).simulator(config).run_rounds([warmup, workload])[-1]
            prompt_len = prefix_len + suffix_len  # the last token is always computed (its block copied)
            predicted = min((prefix_len // block_size) * block_size, prompt_len - 1) / prompt_len
            rows.append({"block_size": block_size, "prefix_len": prefix_len,
                         "hit_rate": metrics.prefix_cache_hit_rate, "predicted_hit_rate": predicted})
    return rows


def eviction_sweep(num_groups_list: Iterable[int], sides: Sides, *, prefix_len: int = 64, suffix_len: int = 8,
                   num_rounds: int = 3, num_kv_blocks: int = 32, block_size: int = 16,
                   measure_groups: Iterable[int] = (), seed: int = 0) -> list[dict[str, Any]]:
    """Eviction under memory pressure: `num_groups` prefixes take turns (one request each per round) in a
    pool of `num_kv_blocks` blocks. While every prefix fits, rounds after the first hit; once they do not,
    least-recently-used eviction throws out each prefix just before it is needed again, and the hit rate of
    the last round collapses to zero: LRU's cliff. Measured only for groups in `measure_groups`."""
    measure = set(measure_groups)
    jobs = []
    for num_groups in num_groups_list:
        # the same seed every round: each group sends the same prompt again, one round after another
        rounds = [Workload.shared_prefix(num_groups, 1, prefix_len, suffix_len, 4, seed=seed)] * num_rounds
        config = _prefix_config(block_size, True, num_kv_blocks, max_num_seqs=1)
        jobs.append(_Job(rounds[-1], config, {"num_groups": num_groups,
                                              "prefix_blocks": num_groups * (prefix_len // block_size)},
                         measure=num_groups in measure, warmup=tuple(rounds[:-1])))
    return _with_hits(_paired_rows(jobs, sides))


def tenant_isolation(sides: Sides, *, prefix_len: int = 512, suffix_len: int = 16, output_len: int = 8,
                     block_size: int = 16, num_kv_blocks: int = 256, seed: int = 0) -> list[dict[str, Any]]:
    """Tenant A sends a prompt; then the same prompt arrives from A again, from tenant B, and from A with a
    `cache_salt`. Only A's unsalted repeat may hit: B must see a cold TTFT, or B could learn from timing
    alone that someone already sent that prompt (the side channel)."""
    warmup = _warmup(1, prefix_len, suffix_len, seed).with_tenant("A")
    probe = Workload.shared_prefix(1, 1, prefix_len, suffix_len, output_len, seed=seed, name="probe")
    config = _prefix_config(block_size, True, num_kv_blocks)
    senders = {"A": ("A", None), "B": ("B", None), "A, salted": ("A", "s1")}
    jobs = [_Job(probe.with_tenant(*who), config, {"sender": label}, warmup=(warmup,))
            for label, who in senders.items()]
    return _with_hits(_paired_rows(jobs, sides))


def chat_replay(sides: Sides, *, num_conversations: int = 4, num_turns: int = 3, first_prompt_len: int = 128,
                turn_len: int = 96, output_len: int = 16, block_size: int = 16, num_kv_blocks: int = 512,
                seed: int = 0) -> list[dict[str, Any]]:
    """Multi-turn chat: turn k of every conversation, after turns 1..k-1 ran on the same engine, cache off
    vs on. Each turn resends the whole history, so without caching TTFT grows with the conversation; with
    it, only the new message (and the partial block before it) is prefilled."""
    rounds = Workload.chat_rounds(num_conversations, num_turns, first_prompt_len, turn_len, output_len, seed=seed)
    jobs = [_Job(rounds[k], _prefix_config(block_size, caching, num_kv_blocks), {"turn": k + 1, "caching": caching},
                 warmup=tuple(rounds[:k]))
            for k in range(num_turns) for caching in (False, True)]
    return _with_hits(_paired_rows(jobs, sides))


# ---- lesson 5: speculative decoding ----

CHAT_TEMPLATE = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"  # SmolLM2's, for one user turn

# Input-grounded tasks: the answer copies the prompt, which is what prompt lookup exploits. The texts are
# fixed here (not read from this repository's files, which change), so measurements stay comparable.
GROUNDED_TEXTS = (
    "The cache keeps the keys and values of every token the model has already seen. When a new token arrives,\n"
    "the model only computes the keys and values of that one token and reads the rest from the cache. This is\n"
    "why generating each new token is cheap compared with reading the whole prompt, and why the cache grows by\n"
    "one entry per layer for every token that the model produces.",
    "def fibonacci(n: int) -> list[int]:\n"
    '    """The first n Fibonacci numbers."""\n'
    "    numbers = [0, 1]\n"
    "    while len(numbers) < n:\n"
    "        numbers.append(numbers[-1] + numbers[-2])\n"
    "    return numbers[:n]\n\n\n"
    "def is_prime(n: int) -> bool:\n"
    '    """True when n has no divisor between 2 and its square root."""\n'
    "    if n < 2:\n"
    "        return False\n"
    "    for d in range(2, int(n ** 0.5) + 1):\n"
    "        if n % d == 0:\n"
    "            return False\n"
    "    return True\n",
    "A library lends books to its members. Each member may borrow up to five books at a time, for three\n"
    "weeks each. A book that comes back late costs ten cents for every day it is late. Members can renew a\n"
    "book once, online or at the desk, unless another member has reserved it. Reserved books wait at the desk\n"
    "for one week before they go back to the shelf.",
    "def word_counts(text: str) -> dict[str, int]:\n"
    '    """How often each word occurs in text, ignoring case."""\n'
    "    counts: dict[str, int] = {}\n"
    "    for word in text.lower().split():\n"
    "        counts[word] = counts.get(word, 0) + 1\n"
    "    return counts\n",
)
COPY_INSTRUCTIONS = ("Copy the following text exactly:", "Repeat the following exactly, line by line:")


def grounded_prompts(tokenizer: Any, n: int) -> list[list[int]]:
    """`n` chat prompts asking the model to copy a fixed text (texts, then wordings, cycle), as token ids."""
    return [tokenizer.encode(CHAT_TEMPLATE.format(
        f"{COPY_INSTRUCTIONS[(i // len(GROUNDED_TEXTS)) % len(COPY_INSTRUCTIONS)]}\n\n"
        f"{GROUNDED_TEXTS[i % len(GROUNDED_TEXTS)]}")) for i in range(n)]


def speculation(prompts: list[list[int]], configs: dict[str, EngineConfig], sides: Sides, *, output_len: int = 64,
                acceptance: Any = None, **labels: Any) -> list[dict[str, Any]]:
    """Each configuration on the same greedy prompts: [measured, simulated] rows (or only simulated).

    A measured speculative run is simulated with its own per-step counts replayed (`AcceptanceReplay`), so
    the two sides make the same decisions and differ only in time; without the engine, `acceptance` (an
    `AcceptanceModel`) stands in for the proposer. Rows carry `config` (the label) and, when measured, the
    engine's output token ids under "token_ids" so a notebook can check greedy outputs are unchanged."""
    from sim.spec_decode import AcceptanceReplay

    workload = Workload.from_token_ids(prompts, output_len, name="speculation")
    rows = []
    for label, config in configs.items():
        row_labels = {**labels, "config": label, "batch": len(prompts)}

        def simulate(acc: Any, cfg: EngineConfig = config) -> RunMetrics:
            return Simulator(sides.simulated_arch(), sides.hardware, cfg, dtype=sides.dtype,
                             acceptance=acc if cfg.speculative_method else None).run(workload)

        if not sides.measure:
            rows.append(_row(simulate(acceptance), "simulated", row_labels))
            continue
        from ref_engine import bench

        runs = [bench.run(workload, config, model=sides.model) for _ in range(sides.repeats)]
        measured = min(runs, key=lambda m: m.duration)
        rows.append(_row(measured, "measured", row_labels))
        rows.append(_row(simulate(AcceptanceReplay(measured.steps)), "simulated", row_labels, measured))
    return rows


def speedups(rows: Iterable[dict[str, Any]], baseline: str = "off", by: tuple[str, ...] = ("side",)
             ) -> dict[tuple[Any, ...], float]:
    """output_throughput of each (config, *by) row over the `baseline` config's with the same `by` values."""
    rows = list(rows)
    base = {tuple(r[k] for k in by): r["output_throughput"] for r in rows if r["config"] == baseline}
    return {(r["config"], *(r[k] for k in by)): r["output_throughput"] / base[tuple(r[k] for k in by)]
            for r in rows if r["config"] != baseline}


def speculation_batch_sweep(batch_sizes: Iterable[int], acceptance_rate: float, sides: Sides, *, k: int = 5,
                            prompt_len: int = 128, output_len: int = 128) -> list[dict[str, Any]]:
    """Simulated speed-up of speculation (threshold off) over plain decoding as the batch grows, at a fixed
    acceptance rate: where memory-bound decode turns compute-bound, verifying k drafts stops being free.

    Each row also carries `verify_cost`, a mean verify step's time over a mean plain decode step's: the
    speed-up is about tokens_per_step / verify_cost, so the two columns say why it falls."""
    from sim.spec_decode import AcceptanceRate

    rows = []
    for batch in batch_sizes:
        workload = Workload.synthetic(batch, prompt_len, output_len, seed=batch)
        config = EngineConfig(max_num_seqs=batch, max_num_batched_tokens=max(512, batch * (k + 1)),
                              num_kv_blocks=batch * _cdiv(prompt_len + output_len + k, 16) + 1)
        plain = sides.simulator(config).run(workload)
        spec_config = config.replace(speculative_method="ngram", num_speculative_tokens=k,
                                     speculative_disable_by_batch_size=None)
        spec = Simulator(sides.simulated_arch(), sides.hardware, spec_config, dtype=sides.dtype,
                         acceptance=AcceptanceRate((acceptance_rate,), seed=batch)).run(workload)
        rows.append({"batch": batch, "plain_tok_s": plain.output_throughput, "spec_tok_s": spec.output_throughput,
                     "speedup": spec.output_throughput / plain.output_throughput,
                     "tokens_per_step": spec.mean_acceptance_length,
                     "verify_cost": _mean_step_s(spec) / _mean_step_s(plain)})
    return rows


def _mean_step_s(metrics: RunMetrics) -> float:
    return fmean(step.duration for step in metrics.steps)
