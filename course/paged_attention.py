"""Lesson 2: PagedAttention.

Four experiments (lessons/02-paged-attention.md): KV arithmetic per model (`kv_cache_sizes`,
`engine_kv_bytes`); the same KV budget under three allocators (`allocation_modes`); the block-size U-shape
(`block_size_sweep`); recompute vs swap on a squeezed pool (`preemption_modes`) and what one preemption
costs at each block size (`preemption_cost`). Memory numbers (live tokens, reserved slots, preemptions,
recomputed tokens, swapped blocks) are decided by the shared core, so they are identical on both sides
for all-at-once workloads; only times differ.

`block_table` draws a block table; `demo` is `serving-lab demo paging`.

Lesson: lessons/02-paged-attention.md.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from statistics import fmean
from typing import Any

from core.arch_config import ArchConfig
from core.config import EngineConfig
from core.math_utils import cdiv
from core.metrics import RunMetrics, relative_error
from core.workload import LengthSpec, Workload
from course.demo import GPU, DemoContext, DemoReport, gpu_name, plot_comparison, side_by_side
from course.drawing import COLORS, arrow, canvas, cell_row
from serving_lab.pairing import Job, Sides, paired_rows, pairs, same_policy
from sim.cost_model import BatchShape, kv_cache_num_blocks
from sim.executor import CostModelTimer
from sim.hardware import HardwareProfile, dtype_bytes
from sim.simulator import Simulator, resolve_hardware

KV_MODELS = ("smollm2-135m", "llama-2-7b", "llama-3.1-8b", "llama-3.1-70b")
ALLOCATION_MODES = ("contiguous", "contiguous_exact", "paged")


def kv_cache_sizes(models: Iterable[str] = KV_MODELS, *, hardware: HardwareProfile | str = "h100-sxm",
                   dtype: str = "bfloat16", seq_len: int = 2048, block_size: int = EngineConfig.block_size,
                   gpu_memory_utilization: float = 0.9, kv_cache_memory: int | None = None) -> list[dict[str, Any]]:
    """KV arithmetic, one row per model: bytes per token (2 x layers x KV heads x head_dim x bytes), per
    `seq_len`-token sequence (whole blocks), and how many such sequences fit at once.

    The pool is `kv_cache_memory` bytes when given, else what one device of `hardware` has left after the
    weights and activations (`kv_cache_num_blocks`, vLLM's sizing); a model whose weights do not fit one
    device is sharded over the smallest tensor-parallel degree (1, 2, 4, 8) that leaves room, and `tp` says
    which. Pure arithmetic: no engine, no simulation."""
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
        blocks_per_seq = cdiv(seq_len, block_size)
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


def engine_kv_bytes(model: Any, *, block_size: int = EngineConfig.block_size, num_kv_blocks: int = 4
                    ) -> dict[str, Any]:
    """What the real engine allocates for its KV cache, against the arithmetic: builds an `LLMEngine` on
    `model` (a `LoadedModel`) with a pool of `num_kv_blocks` blocks and sums the bytes of its KV tensors."""
    # The engine (torch) is imported only where a measured side needs it: simulator-only sweeps run without.
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


def allocation_modes(sides: Sides, *, modes: Iterable[str] = ALLOCATION_MODES, num_requests: int = 8,
                     prompt_len: LengthSpec = (48, 80), output_len: LengthSpec = (8, 40), num_kv_blocks: int = 64,
                     block_size: int = EngineConfig.block_size, max_model_len: int = 256,
                     max_num_seqs: int = 16, max_num_batched_tokens: int = 512, seed: int = 0
                     ) -> list[dict[str, Any]]:
    """The same KV budget (`num_kv_blocks` blocks of `block_size` slots) and the same all-at-once workload
    under each allocator: "contiguous" reserves `max_model_len` slots per request up front (pre-vLLM
    servers), "contiguous_exact" reserves prompt + output (an oracle that knows the output length), "paged"
    takes a block when the tokens reach it (vLLM). One measured and one simulated row per mode, with
    `memory_stats` columns and, on simulated rows, `same_policy` and `same_memory`."""
    workload = Workload.synthetic(num_requests, prompt_len=prompt_len, output_len=output_len, seed=seed,
                                  name="allocation-modes")
    jobs = [Job(workload, EngineConfig(block_size=block_size, num_kv_blocks=num_kv_blocks,
                                        max_model_len=max_model_len, kv_allocation=mode, max_num_seqs=max_num_seqs,
                                        max_num_batched_tokens=max_num_batched_tokens, seed=seed),
                 {"allocation": mode})
            for mode in modes]
    return _with_memory(paired_rows(jobs, sides))


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
    measure = set(measure_block_sizes)
    jobs = []
    for name, workload in workloads.items():
        for bs in block_sizes:
            if kv_cache_memory is not None:
                pool = EngineConfig(block_size=bs, kv_cache_memory=kv_cache_memory)
                num_blocks = sides.simulator(pool).num_kv_blocks  # the engine's rule, in the simulator's dtype
            else:
                num_blocks = kv_cache_tokens // bs
            config = EngineConfig(block_size=bs, num_kv_blocks=num_blocks, max_num_seqs=max_num_seqs,
                                  max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len)
            jobs.append(Job(workload, config, {"trace": name, "block_size": bs, "num_kv_blocks": num_blocks},
                             measure=bs in measure))
    rows = paired_rows(jobs, sides)
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


def pcie_link(hardware: HardwareProfile | str, *, batched: bool = False, per_transfer_s: float = 5e-6) -> SwapLink:
    """The host link of a GPU profile as a `SwapLink`: its `host_link_bandwidth` (PCIe 5.0 x16 at ~50 GB/s on
    an H100, H200 or B200; PCIe 4.0 at ~25 GB/s on an A100 or L40S, sim/hardware.py), so the swap what-if
    uses the same link as the simulator, plus the assumed fixed cost of one copy call."""
    hw = resolve_hardware(hardware)
    if not hw.host_link_bandwidth:
        raise ValueError(f"{hw.name} has no host link (host_link_bandwidth 0): use host_copy_link")
    how = "batched" if batched else "one copy per block"
    return SwapLink(f"PCIe x16 at {hw.host_link_bandwidth / 1e9:g} GB/s, {how}", hw.host_link_bandwidth,
                    per_transfer_s, batched=batched)


def host_copy_link(hardware: HardwareProfile, per_transfer_s: float = 20e-6) -> SwapLink:
    """A swap on a CPU, as our runner does it: per layer, gather the blocks into a temporary tensor, then
    scatter them into the other pool. Each byte is read and written twice, and the profile's memory
    bandwidth counts bytes read plus bytes written, so the copy moves at a quarter of it.
    `per_transfer_s` is a guess at one layer's fixed cost (two indexed copies)."""
    return SwapLink("DRAM copy (CPU, batched)", hardware.memory_bandwidth / 4, per_transfer_s, batched=True)


class SwapPricingTimer(CostModelTimer):
    """The simulator's default timer with the swaps (`SchedulerOutput.swap_out` / `swap_in`) priced over
    `link` instead of the profile's host link, copy calls included, and the blocks moved counted."""

    def __init__(self, cost_model: Any, link: SwapLink, bytes_per_block: int, num_layers: int) -> None:
        super().__init__(cost_model)
        self.link = link
        self.bytes_per_block = bytes_per_block
        self.num_layers = num_layers
        self.swapped_blocks = 0
        self.swap_s = 0.0

    def copy_time(self, output: Any) -> float:
        swap_s = sum(self.link.seconds(len(plan), self.bytes_per_block, self.num_layers)
                     for plan in (output.swap_out, output.swap_in))
        self.swapped_blocks += len(output.swap_out) + len(output.swap_in)
        self.swap_s += swap_s
        return swap_s + self.cost_model.block_copy_time(0, len(output.copy_blocks))


def _swap_priced_simulator(sides: Sides, config: EngineConfig, link: SwapLink | None) -> tuple[Simulator,
                                                                                               SwapPricingTimer]:
    sim = sides.simulator(config)
    if link is None:
        hw = sim.hardware
        link = (host_copy_link(hw) if hw.source == "calibrated"
                else pcie_link(hw) if hw.host_link_bandwidth else PCIE4_PER_BLOCK)
    timer = SwapPricingTimer(sim.cost_model, link, sim.arch.kv_bytes_per_block(config.block_size,
                                                                               dtype_bytes(sim.dtype)),
                             sim.arch.num_layers)
    sim.step_timer = timer
    return sim, timer


def preemption_modes(sides: Sides, *, modes: Iterable[str] = ("recompute", "swap"), num_requests: int = 8,
                     prompt_len: LengthSpec = (24, 40), output_len: LengthSpec = (24, 56), num_kv_blocks: int = 24,
                     block_size: int = EngineConfig.block_size, max_num_seqs: int = 8,
                     max_num_batched_tokens: int = 512, link: SwapLink | None = None, seed: int = 0
                     ) -> list[dict[str, Any]]:
    """A pool too small for the admitted requests' growth, under each preemption mode: paging admits on
    the prompts, the outputs grow, and the most recently admitted request is preempted (recompute: free
    and re-run later; swap: copy to the host pool and back). One measured and one simulated row per mode.

    The simulator prices each step's swap copies with `link` (default: a DRAM copy on a calibrated CPU
    profile, `pcie_link` of the profile on a GPU); the engine pays its real copies. Columns add
    `memory_stats` (`recomputed_tokens` among them), and on simulated rows `swapped_blocks` (out + in; the
    engine moves the same blocks, since the policy is the same), `swap_s` (simulated seconds of copies),
    `same_policy` and `same_memory`."""
    workload = Workload.synthetic(num_requests, prompt_len=prompt_len, output_len=output_len, seed=seed,
                                  name="squeezed-pool")

    def simulate(job: Job) -> tuple[RunMetrics, dict[str, Any]]:
        sim, timer = _swap_priced_simulator(sides, job.config, link)
        metrics = sim.run(job.workload)
        return metrics, {"swapped_blocks": timer.swapped_blocks, "swap_s": timer.swap_s}

    jobs = [Job(workload, EngineConfig(block_size=block_size, num_kv_blocks=num_kv_blocks, preemption_mode=mode,
                                        max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                                        seed=seed),
                 {"preemption_mode": mode, "num_kv_blocks": num_kv_blocks, "block_size": block_size})
            for mode in modes]
    return _with_memory(paired_rows(jobs, sides, simulate))


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
    (`ModelRunner.copy_blocks`) out and back in on real KV tensors, best of 5."""
    rows = []
    for bs in block_sizes:
        config = EngineConfig(block_size=bs, num_kv_blocks=cdiv(num_tokens, bs) + 1,
                              max_num_batched_tokens=max(num_tokens, 16), max_num_seqs=1)
        sim, timer = _swap_priced_simulator(sides, config, link)
        num_blocks = cdiv(num_tokens, bs)
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
        ModelRunner.copy_blocks(plan, src=device_kv, dst=host_kv)
        ModelRunner.copy_blocks(plan, src=host_kv, dst=device_kv)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - start)
    return best


# ---- the diagram ----


def block_table():
    """Lesson 2: two requests' logical blocks, their block tables, and the physical blocks of the pool."""
    fig, ax = canvas(11, 4.6, (0, 13), (0, 6))
    ax.text(0.1, 5.5, "logical blocks (block_size 4)", fontsize=9, weight="bold")
    ax.text(5.0, 5.5, "block tables", fontsize=9, weight="bold")
    ax.text(8.2, 5.5, "block pool (physical KV blocks)", fontsize=9, weight="bold")
    tables = {"A": (["The cat sat on", "the mat and", "purred"], [7, 1, 4], COLORS[0], 4.2),
              "B": (["Once upon a time", "there was"], [2, 9], COLORS[1], 1.8)}
    owner = {}
    for name, (chunks, table, color, y) in tables.items():
        ax.text(0.1, y + 0.7, f"request {name}", fontsize=9)
        cell_row(ax, 0.1, y, chunks, [color] * len(chunks), width=1.5, fontsize=7)
        cells = cell_row(ax, 5.0, y, [str(b) for b in table], [color] * len(table))
        for (cx, cy), block in zip(cells, table):
            owner[block] = (color, (cx, cy))
    pool = cell_row(ax, 8.2, 2.6, [str(b) for b in range(6)], [owner.get(b, ("white",))[0] for b in range(6)])
    pool += cell_row(ax, 8.2, 1.9, [str(b) for b in range(6, 12)], [owner.get(b, ("white",))[0] for b in range(6, 12)])
    for block, (_, (cx, cy)) in owner.items():
        px, py = pool[block]
        arrow(ax, (cx, cy - 0.25 if cy > py else cy + 0.25), (px, py + 0.25 if cy > py else py - 0.25),
              color="#888", rad=0.15)
    ax.text(8.2, 1.2, "white: free (in the free queue); a block holds 4 tokens' K and V in every layer\n"
            "slot of token t = table[t // 4] * 4 + t % 4", fontsize=7.5, color="#555")
    ax.set_title("PagedAttention: a block table maps each request's logical blocks to any free physical block",
                 fontsize=11)
    fig.tight_layout()
    return fig


# ---- the demo (serving-lab demo) ----

DEMO_PRESETS = {
    "full": dict(repeats=2, alloc=dict(num_requests=8, prompt_len=(56, 88), output_len=(4, 24), num_kv_blocks=40,
                                       max_model_len=256)),
    "fast": dict(repeats=1, alloc=dict(num_requests=4, prompt_len=(8, 16), output_len=(2, 6), num_kv_blocks=6,
                                       max_model_len=64)),
}
# notebook 02's full sizes, on the GPU profile
GPU_ALLOC = dict(num_requests=64, prompt_len=(200, 400), output_len=(16, 256), num_kv_blocks=1024, max_model_len=2048,
                 max_num_seqs=64)


def demo(context: DemoContext) -> DemoReport:
    """The same KV pool and workload under contiguous (max_model_len reserved up front),
    contiguous-exact (an oracle) and paged allocation (`allocation_modes`): the core decides the same steps on
    both sides, so requests per step match exactly and only times differ; then the simulated H100 picture."""
    p = context.preset(DEMO_PRESETS)
    rows = allocation_modes(context.sides(p["repeats"]), **p["alloc"])
    gpu = {r["allocation"]: r for r in allocation_modes(GPU, **GPU_ALLOC)}
    (fit,) = kv_cache_sizes([GPU.arch], hardware=GPU.hardware, seq_len=2048)
    labels = ("allocation",)
    comparison = side_by_side(rows, labels, ("mean_batch", "output_throughput"))
    figure, (memory,) = plot_comparison(comparison, labels, f"one KV pool of {p['alloc']['num_kv_blocks']} blocks, "
                                        "three allocators (requests per step: decided by the core, equal on both sides)")
    for row in rows:
        if row["side"] == "measured":
            plot_memory(memory, row["metrics"], label=row["allocation"])
    memory.set_title("measured: live tokens (solid) vs reserved slots (dashed)", fontsize=9)
    memory.legend(fontsize=6)
    live = ", ".join(f"{r['allocation']} {r['live_fraction']:.0%}" for r in rows if r["side"] == "measured")
    return DemoReport(comparison, labels, figure, notes=[
        f"share of reserved KV slots holding a live token (both sides alike): {live}",
        f"GPU what-if, {gpu_name()}: paged / contiguous throughput "
        f"{gpu['paged']['output_throughput'] / gpu['contiguous']['output_throughput']:.2f}x, mean batch "
        f"{gpu['paged']['mean_batch']:.1f} vs {gpu['contiguous']['mean_batch']:.1f} in the same "
        f"{GPU_ALLOC['num_kv_blocks']}-block pool ({GPU_ALLOC['num_requests']} requests, prompts "
        f"{'-'.join(map(str, GPU_ALLOC['prompt_len']))}, outputs {'-'.join(map(str, GPU_ALLOC['output_len']))})",
        f"  the KV room of {fit['where']}: {fit['seqs_that_fit']} 2048-token sequences of {fit['model']} in "
        f"{fit['dtype']} ({fit['kv_mib_per_seq']:.0f} MiB of KV each)",
    ])
