"""`Simulator`: one engine replica, simulated: `Simulator(model, hardware, config).run(workload)`.

This module owns the choices that turn "a model on a device with these knobs" into a simulated engine:
which model and hardware profile (by object or by name), how many KV blocks the pool holds, and which
step timer prices a step. The run itself is the core scheduler inside a `SimulatedExecutor`
(sim/executor.py), fed the workload's requests at their arrival times; the result is the same
`RunMetrics` the real engine fills, so a notebook compares the two field by field.

Everything beyond model, hardware and config is a `SimulatorOptions` field, passed to `Simulator` as a
keyword. Defaults
- model: SmolLM2-135M, the model the real engine runs in the lessons;
- hardware: this machine's calibrated profile if serving_lab/calibrate.py has saved one, else the built-in CPU
  estimate, with a warning (`default_hardware`);
- KV pool: `num_kv_blocks` given here, else the engine's own rule (core/kv_sizing.py):
  `config.num_kv_blocks`; `config.kv_cache_memory` bytes / bytes per block; a fixed pool on a CPU
  profile; else the profile's memory x `config.gpu_memory_utilization` - weights - activations, per device
  (weights over tensor_parallel_size x pipeline_parallel_size devices; KV blocks in `kv_cache_dtype`,
  default the weights' dtype, e.g. "fp8" KV under bf16 weights);
- swap pool (`preemption_mode="swap"`): `swap_space` GiB in blocks of one device, or `num_swap_blocks`, as the
  engine settles it (`kv_sizing.with_swap_pool`; a profile knows no host memory, so nothing is checked);
- parallelism: `tensor_parallel_size` (sim/cost_model.py) and `pipeline_parallel_size` (sim/pipeline.py)
  combine: tp x pp devices per replica; 1 x 1 is the single-device model itself;
- front end: `frontend_latency_s` (default 0) is the per-request time a server spends before the engine
  sees a request (HTTP, tokenization): the request reaches the scheduler that long after it arrives, so
  TTFT and end-to-end latency include it, as a client of `vllm serve` measures them.
- engine: `engine=None` prices the device's work as the hardware profile was fitted or calibrated (with that
  engine's own per-step costs inside); `engine="vllm"` adds vLLM V1's CPU time per step
  (sim/engine_profile.py), fitted on vLLM's published rows.

Speculative decoding (`config.speculative_method`): pass an `acceptance` model (sim/spec_decode.py: a
rate per draft position, or the engine's counts replayed); a draft model's passes are priced on its own
dims, `draft_arch` (default: the target's first L layers for `speculative_model="self:L"`, else the
known model of that name), and its KV pool, which shares the target's block ids, and its own weights count
in the pool's size as the engine counts them (`draft_footprint`).

Invariant: the same workload and configuration give the same `RunMetrics` to the last digit. Nothing
here reads a wall clock or an unseeded random source; workloads carry their own seed.

Speed: a run pauses Python's cyclic garbage collector (`gc_paused`). A run makes millions of short-lived
objects (one per scheduled request per step) that reference counting frees, while the collector would
walk the growing set of live requests again and again for cycles that hardly exist: pausing it made the
10,000-request benchmark ~13% faster with the same peak memory (benchmarks/RESULTS.md, "Simulator speed").
vLLM freezes its collector after start-up for the same reason.

Lesson: every lesson's "simulated" column; lessons/07-tuning-knobs.md (sweeping configurations fast).
"""

from __future__ import annotations

import gc
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import simpy

from core.arch_config import DEFAULT_MODEL_NAME, ArchConfig
from core.config import EngineConfig
from core.kv_sizing import DraftFootprint, num_kv_blocks, with_swap_pool
from core.metrics import RunMetrics
from core.request import Request
from core.scheduler import make_scheduler
from core.workload import Workload
from sim.cost_model import CostModel, activation_dtype, default_kv_cache_dtype, model_weight_bytes
from sim.engine_profile import EngineProfile, resolve_engine
from sim.executor import CostModelTimer, SimulatedExecutor, StepObserver, StepTimer, feed_arrivals
from sim.hardware import DEFAULT_CPU_PROFILE, HardwareProfile, dtype_bytes, load_calibrated_profile
from sim.pipeline import PipelineCostModel
from sim.spec_decode import AcceptanceModel, DraftCostTimer, SimulatedProposer


def default_hardware() -> HardwareProfile:
    """This machine's calibrated profile if one is saved, else the built-in CPU estimate (with a warning)."""
    profile = load_calibrated_profile()
    if profile is None:
        warnings.warn(
            f"no calibrated hardware profile for this machine; simulating the built-in estimate "
            f"{DEFAULT_CPU_PROFILE!r} (run serving_lab/calibrate.py to measure one)", stacklevel=4)
        profile = HardwareProfile.named(DEFAULT_CPU_PROFILE)
    return profile


def resolve_model(model: ArchConfig | str | None) -> ArchConfig:
    if model is None:
        return ArchConfig.named(DEFAULT_MODEL_NAME)
    return ArchConfig.named(model) if isinstance(model, str) else model


def resolve_hardware(hardware: HardwareProfile | str | None) -> HardwareProfile:
    if hardware is None:
        return default_hardware()
    return HardwareProfile.named(hardware) if isinstance(hardware, str) else hardware


def device_block_bytes(arch: ArchConfig, block_size: int, kv_cache_dtype: str, tensor_parallel_size: int = 1,
                       pipeline_parallel_size: int = 1) -> int:
    """Bytes of one KV block on one device: its share of the KV heads (tp) and ceil(L / pp) layers."""
    full_block = arch.kv_bytes_per_block(block_size, dtype_bytes(kv_cache_dtype), tensor_parallel_size)
    return full_block // arch.num_layers * -(-arch.num_layers // pipeline_parallel_size)


def num_kv_blocks_for(arch: ArchConfig, hardware: HardwareProfile, config: EngineConfig,
                      dtype: str = "bfloat16", tensor_parallel_size: int = 1, *, kv_cache_dtype: str | None = None,
                      pipeline_parallel_size: int = 1, draft_arch: ArchConfig | None = None) -> int:
    """The KV pool of one replica (per device), by the engine's rule (`kv_sizing.num_kv_blocks`), with the
    device memory from the profile (none on a CPU profile, as on a real CPU) and the weights from the dims
    (`model_weight_bytes`). A device of a pipeline stage holds ceil(L / pp) layers' KV and 1 / (tp x pp) of
    the weights. With `speculative_method="draft_model"`, `draft_arch`'s pool and weights count too
    (`draft_footprint`)."""
    activation_bytes = dtype_bytes(activation_dtype(dtype, hardware))
    on_cpu = hardware.provenance.get("device_type") == "cpu"
    kv_dtype = kv_cache_dtype or default_kv_cache_dtype(dtype, hardware)
    return num_kv_blocks(
        config, device_block_bytes(arch, config.block_size, kv_dtype, tensor_parallel_size, pipeline_parallel_size),
        device_memory=None if on_cpu else hardware.memory_bytes,
        weight_bytes=model_weight_bytes(arch, dtype, hardware) / (tensor_parallel_size * pipeline_parallel_size),
        activation_bytes=arch.peak_activation_bytes(config.max_num_batched_tokens, config.max_num_seqs,
                                                    activation_bytes),
        model=arch.name, draft=None if draft_arch is None else draft_footprint(draft_arch, hardware, config, dtype))


def draft_footprint(draft_arch: ArchConfig, hardware: HardwareProfile, config: EngineConfig,
                    dtype: str) -> DraftFootprint:
    """A draft model as the engine places it: whole (unsharded) beside the first device, its KV cache in the
    weights' dtype, its weights its own unless it is the target's first layers ("self:L")."""
    shares_weights = config.draft_num_layers is not None
    return DraftFootprint(draft_arch.kv_bytes_per_block(config.block_size, dtype_bytes(dtype)),
                          0 if shares_weights else model_weight_bytes(draft_arch, dtype, hardware))


@dataclass(frozen=True)
class SimulatorOptions:
    """How one replica is deployed and timed, beyond its model, hardware and engine config (the module
    docstring says what each default means). `Simulator(model, hardware, config, **options)` takes these
    fields as keywords."""

    dtype: str | None = None  # the weights' and activations' (None: a calibrated profile's, else bfloat16)
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    kv_cache_dtype: str | None = None  # None: `dtype`
    num_kv_blocks: int | None = None  # None: the engine's rule (`num_kv_blocks_for`)
    frontend_latency_s: float = 0.0  # a server's time per request before the engine sees it
    step_timer: StepTimer | None = None  # None: the cost model's prices (`CostModelTimer`)
    acceptance: AcceptanceModel | None = None  # simulated speculation (needs `config.speculative_method`)
    draft_arch: ArchConfig | str | None = None  # the draft model's dims (None: from `speculative_model`)
    engine: str | EngineProfile | None = None  # an engine's CPU time per step (sim/engine_profile.py); None: none

    def __post_init__(self) -> None:
        if self.frontend_latency_s < 0:
            raise ValueError(f"frontend_latency_s must be >= 0, got {self.frontend_latency_s}")


class Simulator:
    """One simulated engine replica. Construction resolves names and sizes; `run` may be called many times
    (except with a `ReplayTimer`, which replays one run's step times)."""

    def __init__(self, model: ArchConfig | str | None = None, hardware: HardwareProfile | str | None = None,
                 config: EngineConfig | None = None, **options: Any) -> None:
        """`options`: the fields of `SimulatorOptions` (an unknown name is a TypeError)."""
        self.options = opts = SimulatorOptions(**options)
        self.arch = resolve_model(model)
        self.hardware = resolve_hardware(hardware)
        # max_model_len settled for this model (its max_position_embeddings when unset), as the engine does
        config = config if config is not None else EngineConfig()
        self.config = config.for_model(self.arch.max_position_embeddings)
        # a calibrated profile is only valid for the dtype it was measured in; datasheets assume bf16
        dtype = opts.dtype or self.hardware.provenance.get("dtype", "bfloat16")
        self.dtype = dtype
        self.tensor_parallel_size = tensor_parallel_size = opts.tensor_parallel_size
        self.pipeline_parallel_size = pipeline_parallel_size = opts.pipeline_parallel_size
        self.kv_cache_dtype = opts.kv_cache_dtype or default_kv_cache_dtype(dtype, self.hardware)
        self.frontend_latency_s = opts.frontend_latency_s
        if pipeline_parallel_size == 1:
            self.cost_model: CostModel | PipelineCostModel = CostModel(
                self.arch, self.hardware, dtype, tensor_parallel_size, block_size=self.config.block_size,
                kv_cache_dtype=self.kv_cache_dtype)
        else:
            self.cost_model = PipelineCostModel(
                self.arch, self.hardware, dtype, tensor_parallel_size, pipeline_parallel_size,
                block_size=self.config.block_size, kv_cache_dtype=self.kv_cache_dtype)
        self.draft_arch = (self._draft_arch(opts.draft_arch) if self.config.speculative_method == "draft_model"
                           else None)
        self.num_kv_blocks = opts.num_kv_blocks if opts.num_kv_blocks is not None else num_kv_blocks_for(
            self.arch, self.hardware, self.config, dtype, tensor_parallel_size, kv_cache_dtype=self.kv_cache_dtype,
            pipeline_parallel_size=pipeline_parallel_size, draft_arch=self.draft_arch)
        self.config = with_swap_pool(self.config, device_block_bytes(
            self.arch, self.config.block_size, self.kv_cache_dtype, tensor_parallel_size, pipeline_parallel_size))
        self.engine = resolve_engine(opts.engine)
        engine_step_s = self.engine.step_overhead_s if self.engine is not None else 0.0
        if opts.step_timer is not None and self.engine is not None:
            raise ValueError("an engine profile prices steps: give it or a step_timer, not both")
        self.step_timer = opts.step_timer if opts.step_timer is not None else CostModelTimer(self.cost_model,
                                                                                             engine_step_s)
        acceptance = opts.acceptance
        if (self.config.speculative_method is None) != (acceptance is None):
            raise ValueError("an acceptance model simulates speculative decoding, so it goes with "
                             f"speculative_method, and that needs one; got {self.config.speculative_method!r} "
                             f"and acceptance={acceptance!r}")
        self.acceptance = acceptance
        if self.draft_arch is not None:
            self.step_timer = DraftCostTimer(self.step_timer, CostModel(
                self.draft_arch, self.hardware, dtype, tensor_parallel_size, block_size=self.config.block_size))

    @property
    def num_devices(self) -> int:
        """Devices one replica occupies: tensor x pipeline parallel ranks (what a GPU-hour bill counts)."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    def _draft_arch(self, draft_arch: ArchConfig | str | None) -> ArchConfig:
        if draft_arch is not None:
            return resolve_model(draft_arch)
        num_layers = self.config.draft_num_layers
        if num_layers is not None:
            return replace(self.arch, num_layers=num_layers)
        return ArchConfig.named(self.config.speculative_model)

    def make_executor(self, env: simpy.Environment, name: str = "engine", *,
                      streaming: bool = False) -> SimulatedExecutor:
        """A fresh replica (new scheduler, empty KV pool) on `env`'s clock; `streaming`: its metrics
        gathered as it runs, its requests let go as they finish (`SimulatedExecutor`)."""
        scheduler = make_scheduler(self.config, self.num_kv_blocks, cache_namespace=self.arch.name)
        proposer = SimulatedProposer(self.acceptance) if self.acceptance is not None else None
        return SimulatedExecutor(env, scheduler, self.step_timer, name, proposer, streaming=streaming)

    def run(self, workload: Workload, max_concurrency: int | None = None, *,
            on_step: StepObserver | None = None, streaming: bool = False) -> RunMetrics:
        """Serve `workload` from an empty engine at time 0 until every request finished or was refused.
        `max_concurrency`: at most that many requests open at once, as a capped client sends them
        (`feed_arrivals`). `on_step(scheduler, record)`: called after each step (`SimulatedExecutor.on_step`).
        `streaming`: requests made as they arrive and let go as they finish, metrics gathered as the run goes
        (core/metrics_stream.py): the same numbers in bounded memory, without the step log or token times."""
        return self.run_rounds([workload], max_concurrency, on_step=on_step, streaming=streaming)[0]

    def run_rounds(self, workloads: list[Workload], max_concurrency: int | None = None, *,
                   on_step: StepObserver | None = None, streaming: bool = False) -> list[RunMetrics]:
        """Serve the workloads one after another on one replica, each starting when the previous one has
        drained, so later rounds find the prefix cache the earlier ones left (as `bench.run_rounds`)."""
        env = simpy.Environment()
        executor = self.make_executor(env, streaming=streaming)
        executor.on_step = on_step
        results = []
        with gc_paused():
            for workload in workloads:
                executor.start_round()
                # made as they arrive, arrival times counted from the start of the round
                requests = arriving_after(workload.iter_requests(self.arch.vocab_size), env.now)
                env.process(feed_arrivals(env, requests, executor.add_request, delay_s=self.frontend_latency_s,
                                          max_concurrency=max_concurrency))
                env.run()
                results.append(executor.metrics())
        return results


def arriving_after(requests: Iterable[Request], start: float) -> Iterator[Request]:
    """The requests as they are read, each arriving `start` seconds later (a round that starts at `start`)."""
    for request in requests:
        request.arrival_time += start
        yield request


@contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the block, back on after it if it was on (see the module
    docstring: a simulated run makes no cycles worth the collector's passes)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
