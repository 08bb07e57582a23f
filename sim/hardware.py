"""Hardware profiles: the handful of numbers the cost model needs to price one engine step.

This module owns `HardwareProfile`, the built-in profiles (five GPUs: datasheet peaks with fitted fractions, and one estimate
for "this machine", a 2-core CPU), their JSON form, and where calibrated profiles are saved.

What a profile holds, and why these numbers and no others
    peak_flops[dtype]       dense matrix FLOP/s per compute dtype ("float32", "bfloat16", ...)
    memory_bandwidth        bytes/s between memory and the compute units (HBM on a GPU, DRAM on a CPU)
    memory_bytes            device memory as the driver reports it (nvidia-smi's MiB x 2^20, not the marketing
                            GB); the KV-cache pool is carved out of it (core/kv_sizing.py),
                            except on a CPU (provenance device_type "cpu"), which gets the engine's fixed pool
    step_overhead_s         fixed cost of one step: scheduling, Python, kernel launches, synchronisation
    per_seq_overhead_s      cost per scheduled request: building its input rows, sampling, bookkeeping
    per_token_overhead_s    cost per token in the batch that FLOPs and bytes do not explain
    per_block_overhead_s    cost per KV block touched: block-table indexing and scattered small reads.
                            It is what makes tiny blocks slow, the left side of the block-size U-shape
    weight_packing_passes   extra passes over the weights that a matrix product of two or more rows makes:
                            a CPU GEMM first copies ("packs") its weight operand into cache-sized panels,
                            a one-row GEMV streams it once. It is why a CPU decode step jumps from batch 1
                            to batch 2 and then stays nearly flat. Fitted by calibration; 0 on datasheets
    host_link_bandwidth     bytes/s per direction between device and host memory (PCIe), which swapped-out KV
                            blocks cross (preemption by swap); 0 where the host pool is in the device's own
                            memory (a CPU: a swap is a copy within DRAM, priced like copy-on-write)
    interconnect_*          GPU-to-GPU link inside one machine (NVLink): tensor-parallel all-reduces
    measured_allreduce      tp -> [latency s, bus bandwidth bytes/s] of an all-reduce measured among tp processes
                            (calibration measures a CPU's gloo all-reduce, serving_lab/collectives.py); a tp listed
                            here is priced by its own measurement instead of interconnect_*
    cores, threads          a CPU's (0 on a GPU, where each tensor-parallel rank has a device of its own): the
                            machine's cores, which the tp ranks share, and the torch threads the rates above were
                            measured on. See `tensor_parallel_sharing`, `tensor_parallel_rate`, `lm_head_rate`
    scheduler_slice_s       a CPU's: how long the OS lets a busy process keep a core while another waits for it
                            (serving_lab/time_slice.py measures it). Tensor-parallel ranks that do not all fit the
                            cores take turns on stretches of work shorter than it (`tensor_parallel_rounds`)
    network_*               link between machines (InfiniBand/Ethernet): KV transfer in PD disaggregation

Achievable fractions. A datasheet gives peaks that real kernels never reach, so a profile also carries
    matmul_efficiency[dtype]  the fraction of peak_flops[dtype] the linear layers reach (missing dtype = 1.0)
    attention_efficiency      the fraction of the attention dtype's peak that attention reaches
    bandwidth_efficiency      the fraction of memory_bandwidth a step's reads and writes reach
    interconnect_efficiency   the fraction of interconnect_bandwidth a tensor-parallel all-reduce reaches
The built-in GPU profiles keep the vendor's peaks in peak_flops and memory_bandwidth and carry these
fractions, the overheads and the tensor-parallel link terms *fitted* to published serving measurements
(`benchmarks/published.py --fit` writes sim/data/gpu_fit.json, read below; its provenance names the
rows of benchmarks/published_rows.json in the fit and those held out). A *calibrated* profile
(source="calibrated", serving_lab/calibrate.py) stores effective numbers with every fraction at 1.0.
`profile.derated(compute=0.7, memory=0.85)` still scales the peaks explicitly, for what-ifs.

A calibrated profile is measured for one dtype, one thread count and one attention path; its
`provenance` dict records device, dtype, threads, torch version, model, attention path, date, fit
errors and how steady the machine was while it was measured (`steady`), so a notebook can print where its
simulated numbers come from, and skip the claims that rest on a fit taken on a busy machine.

Lesson: lessons/01-continuous-batching.md (the cost of a step); lessons/07-tuning-knobs.md.
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from core.config import INT4_GROUP_SIZE, INT4_GROUPED_PREFIX
from core.paths import cache_dir

# Bytes per element of each dtype name used by profiles and the cost model. "int4" is a weight format,
# priced per weight: 4 bits, plus a bfloat16 scale and zero shared by each group of g weights
# (ref_engine/model/int4.py; a Q4_1 block of 32 stores fp16 ones, the same 4 bytes). "int4" alone has groups
# of INT4_GROUP_SIZE, the engine's default; "int4-g128" names another group size, the name the engine gives
# a model quantized with `quantization_group_size=128` (`core.config.int4_name`).


def int4_bytes(group_size: int) -> float:
    """Bytes per int4 weight with its share of a 2-byte scale and a 2-byte zero per group of `group_size`."""
    return 0.5 + 2 * 2 / group_size


DTYPE_BYTES: dict[str, float] = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "fp8": 1,
    "int8": 1,
    "int4": int4_bytes(INT4_GROUP_SIZE),
}
# Formats that hold only weights: the product runs in the activation dtype (the weights dequantized in the
# kernel's tiles), at its FLOP/s unless a profile measured the format itself, and the KV cache is kept in
# the activation dtype too.
WEIGHT_ONLY_DTYPES = ("int4",)

TERA = 1e12
GIGA = 1e9

# How a step's compute and memory times combine (`HardwareProfile.combine`; the formulas are sim/cost_model.py's):
# "max" over the whole step, "sum" of the two, or "kernels": the linear layers and attention each on a roofline
# of their own, one after the other.
COMBINE_MODES = ("max", "sum", "kernels")


def dtype_bytes(dtype: str) -> float:
    """Bytes per element of `dtype` ("float32", "bfloat16", "int4-g128", ...); ValueError for an unknown name."""
    if dtype.startswith(INT4_GROUPED_PREFIX):
        return int4_bytes(int4_group_size(dtype))
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(DTYPE_BYTES)}, "
                         f"and {INT4_GROUPED_PREFIX}N (int4 in groups of N weights)") from None


def int4_group_size(dtype: str) -> int:
    """N of an "int4-gN" name (ValueError unless N is a positive integer)."""
    digits = dtype.removeprefix(INT4_GROUPED_PREFIX)
    if not digits.isdigit() or int(digits) < 1:
        raise ValueError(f"dtype {dtype!r}: {INT4_GROUPED_PREFIX}N takes a positive group size N, e.g. int4-g128")
    return int(digits)


def weight_format(dtype: str) -> str:
    """The format a dtype name is rated under: "int4-g128" is "int4" (a profile's int4 rate, weight-only);
    any other name is itself."""
    return "int4" if dtype.startswith(INT4_GROUPED_PREFIX) else dtype


@dataclass
class HardwareProfile:
    """One accelerator (or CPU) as the cost model sees it. All times in seconds, rates per second."""

    name: str
    peak_flops: dict[str, float]  # dtype -> dense FLOP/s
    memory_bandwidth: float  # bytes/s
    memory_bytes: float  # bytes of device memory
    step_overhead_s: float = 0.0
    per_seq_overhead_s: float = 0.0
    per_token_overhead_s: float = 0.0
    per_block_overhead_s: float = 0.0
    weight_packing_passes: float = 0.0
    host_link_bandwidth: float = 0.0  # bytes/s per direction, device <-> host memory (PCIe); 0 = same memory
    interconnect_bandwidth: float = 0.0  # bytes/s per direction per device (NVLink), 0 = none
    interconnect_latency_s: float = 0.0  # fixed cost of one collective / one message
    network_bandwidth: float = 0.0  # bytes/s per device between machines, 0 = none
    network_latency_s: float = 0.0
    # tp -> [latency s, bus bandwidth bytes/s] measured among tp processes (see the module docstring).
    measured_allreduce: dict[int, list[float]] = field(default_factory=dict)
    cores: int = 0  # a CPU's cores, shared by its tensor-parallel ranks; 0 = a device per rank (a GPU)
    threads: int = 0  # torch threads a CPU's rates were measured on; 0 on a GPU
    scheduler_slice_s: float = 0.0  # a CPU's: how long a busy process keeps a core another one waits for
    # Attention FLOPs run at this fraction of the peak of the attention dtype (masking, softmax and gathers
    # make attention slower than a plain matmul); fitted on the built-in GPUs and by calibration.
    attention_efficiency: float = 1.0
    # Linear layers reach this fraction of peak_flops[dtype]; a dtype not listed runs at 1.0.
    matmul_efficiency: dict[str, float] = field(default_factory=dict)
    # Memory traffic reaches this fraction of memory_bandwidth.
    bandwidth_efficiency: float = 1.0
    # A tensor-parallel all-reduce (NCCL or a custom kernel) reaches this fraction of interconnect_bandwidth.
    interconnect_efficiency: float = 1.0
    # How compute and memory time combine in a step (`COMBINE_MODES`, sim/cost_model.py prices each): "max"
    # where the device overlaps them over the whole step (GPUs, the roofline), "sum" where it does not (a
    # CPU's cores do both; calibrated CPU profiles are fitted so), "kernels" where each group of kernels, the
    # linear layers and attention, is on its own roofline and the groups run in turn.
    combine: str = "max"
    source: str = "datasheet"  # "datasheet" | "calibrated" | "datasheet-like estimate" | "derated datasheet"
    notes: str = ""
    provenance: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.peak_flops:
            raise ValueError(f"profile {self.name!r}: peak_flops needs at least one dtype")
        for dtype, rate in self.peak_flops.items():
            if rate <= 0:
                raise ValueError(f"profile {self.name!r}: peak_flops[{dtype!r}] must be > 0, got {rate}")
        if self.memory_bandwidth <= 0:
            raise ValueError(f"profile {self.name!r}: memory_bandwidth must be > 0")
        if not self.attention_efficiency > 0:  # calibration may find attention faster than its matmuls
            raise ValueError(f"profile {self.name!r}: attention_efficiency must be > 0, got {self.attention_efficiency}")
        if not 0 < self.bandwidth_efficiency <= 1:
            raise ValueError(f"profile {self.name!r}: bandwidth_efficiency must be in (0, 1], got "
                             f"{self.bandwidth_efficiency}")
        if not 0 < self.interconnect_efficiency <= 1:
            raise ValueError(f"profile {self.name!r}: interconnect_efficiency must be in (0, 1], got "
                             f"{self.interconnect_efficiency}")
        for dtype, fraction in self.matmul_efficiency.items():
            if not 0 < fraction <= 1:
                raise ValueError(f"profile {self.name!r}: matmul_efficiency[{dtype!r}] must be in (0, 1], got "
                                 f"{fraction}")
        if self.combine not in COMBINE_MODES:
            raise ValueError(f"profile {self.name!r}: combine must be one of {', '.join(map(repr, COMBINE_MODES))}, "
                             f"got {self.combine!r}")
        for knob in ("step_overhead_s", "per_seq_overhead_s", "per_token_overhead_s",
                     "per_block_overhead_s", "interconnect_bandwidth", "interconnect_latency_s",
                     "network_bandwidth", "network_latency_s", "memory_bytes", "weight_packing_passes",
                     "host_link_bandwidth", "cores", "threads", "scheduler_slice_s"):
            if getattr(self, knob) < 0:
                raise ValueError(f"profile {self.name!r}: {knob} must be >= 0, got {getattr(self, knob)}")
        if (self.cores == 0) != (self.threads == 0):
            raise ValueError(f"profile {self.name!r}: a CPU profile sets both cores and threads, a GPU neither; got "
                             f"cores={self.cores}, threads={self.threads}")
        for tp, terms in self.measured_allreduce.items():
            if tp < 2 or len(terms) != 2 or terms[0] < 0 or terms[1] <= 0:
                raise ValueError(f"profile {self.name!r}: measured_allreduce maps a tp >= 2 to [latency s >= 0, "
                                 f"bus bandwidth > 0]; got {tp}: {terms}")

    def flops_for(self, dtype: str) -> float:
        """Peak dense FLOP/s for `dtype`; ValueError naming the dtypes this profile knows."""
        try:
            return self.peak_flops[dtype]
        except KeyError:
            raise ValueError(
                f"profile {self.name!r} has no peak FLOP/s for dtype {dtype!r}; "
                f"it knows: {', '.join(self.peak_flops)}"
            ) from None

    def matmul_flops(self, dtype: str) -> float:
        """FLOP/s the linear layers reach in `dtype`: peak x matmul_efficiency (1.0 when not listed)."""
        return self.flops_for(dtype) * self.matmul_efficiency.get(dtype, 1.0)

    @property
    def allreduce_bandwidth(self) -> float:
        """Bytes/s per direction a tensor-parallel all-reduce reaches: interconnect_bandwidth x interconnect_efficiency."""
        return self.interconnect_bandwidth * self.interconnect_efficiency

    def allreduce_terms(self, tp: int) -> tuple[float, float]:
        """(latency s, bus bandwidth bytes/s) of one all-reduce among `tp` ranks: the measurement for `tp` where
        the profile has one, else the interconnect's. A CPU's is never extrapolated from other world sizes: its
        ranks share the cores, and on a 2-core VM 3 processes took 2-3.6x the latency of 2
        (benchmarks/RESULTS.md, "All-reduce on this machine")."""
        if tp in self.measured_allreduce:
            latency_s, bus_bandwidth = self.measured_allreduce[tp]
            return latency_s, bus_bandwidth
        if self.cores:
            measured = ", ".join(map(str, sorted(self.measured_allreduce))) or "no"
            raise ValueError(f"profile {self.name!r} measured all-reduces among {measured} processes, not {tp}; "
                             f"recalibrate with serving_lab.calibrate.calibrate(allreduce_world_sizes=(..., {tp}))")
        if self.interconnect_bandwidth <= 0:
            raise ValueError(f"profile {self.name!r} has no interconnect; cannot price tp={tp}")
        return self.interconnect_latency_s, self.allreduce_bandwidth

    def tensor_parallel_sharing(self, tp: int) -> float:
        """How many ranks share each core's time: 1 on GPUs, and on a CPU whose cores hold all `tp` ranks
        (max(1, cores // tp) threads each, the engine's workers); else tp / (ranks that fit), as the OS
        shares the cores out fairly (3 one-thread ranks on 2 cores: 1.5)."""
        if tp < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {tp}")
        if not self.cores or tp == 1:
            return 1.0
        return max(1.0, tp / self._ranks_at_once(tp))

    def tensor_parallel_rounds(self, tp: int) -> int:
        """How many turns `tp` ranks take to each run a stretch of work shorter than a time slice: 1 where the
        cores hold them all, else ceil(tp / ranks that fit). The ranks run in lockstep (an all-reduce after
        every attention and every MLP), and a stretch shorter than `scheduler_slice_s` runs whole, so 3
        one-thread ranks on 2 cores take 2 turns where fair sharing would take 1.5; the first wait in the
        collective, holding their cores (gloo polls)."""
        if self.tensor_parallel_sharing(tp) == 1.0:
            return 1
        return -(-tp // self._ranks_at_once(tp))

    def tensor_parallel_rate(self, tp: int) -> float:
        """How many times this profile's FLOP/s and bandwidth the decoder layers of `tp` ranks reach together.

        On GPUs, tp: each rank has a device of its own. On a CPU (`cores` set) the ranks share the machine:
        each has 1/tp of the work on max(1, cores // tp) threads (the engine's workers) against the `threads`
        the rates were measured on, and shares its core's time (`tensor_parallel_sharing`): tp * rank threads
        / (threads * sharing). One rank is the engine as measured (1.0). On a 2-core machine measured on 2
        threads, 1.0 at every tp: tensor parallelism splits the work but not the cores."""
        sharing = self.tensor_parallel_sharing(tp)  # validates tp
        if not self.cores:
            return float(tp)
        if tp == 1:
            return 1.0
        return tp * self._rank_threads(tp) / (self.threads * sharing)

    def lm_head_rate(self, tp: int) -> float:
        """How many times this profile's FLOP/s and bandwidth the LM head of `tp` ranks reaches: like the layers
        on GPUs (vLLM splits the head by vocabulary), but on a CPU the reference engine runs the whole head on
        rank 0, after the layers, while the other ranks wait: rank 0's threads against the `threads` the rates
        were measured on."""
        if not self.cores or tp == 1:
            return self.tensor_parallel_rate(tp)
        return self._rank_threads(tp) / self.threads

    def _rank_threads(self, tp: int) -> int:
        """Torch threads each of a CPU's `tp` ranks runs: the engine's rule, max(1, cores // tp)
        (ref_engine.distributed.parallel_state.worker_threads, which the simulator does not import)."""
        return max(1, self.cores // tp)

    def _ranks_at_once(self, tp: int) -> int:
        """How many of a CPU's `tp` ranks its cores run at once."""
        return max(1, self.cores // self._rank_threads(tp))

    @property
    def effective_bandwidth(self) -> float:
        """Bytes/s a step's memory traffic reaches: memory_bandwidth x bandwidth_efficiency."""
        return self.memory_bandwidth * self.bandwidth_efficiency

    def derated(self, compute: float = 1.0, memory: float = 1.0) -> HardwareProfile:
        """A copy whose FLOP/s are scaled by `compute` and bandwidth by `memory` (both in (0, 1]).

        This is the explicit way to say "real kernels reach 70% of peak": the cost model itself never
        scales a profile.
        """
        for label, factor in (("compute", compute), ("memory", memory)):
            if not 0 < factor <= 1:
                raise ValueError(f"{label} efficiency must be in (0, 1], got {factor}")
        return replace(
            self,
            name=f"{self.name} (x{compute:g} compute, x{memory:g} memory)",
            peak_flops={dtype: rate * compute for dtype, rate in self.peak_flops.items()},
            memory_bandwidth=self.memory_bandwidth * memory,
            source="derated datasheet" if self.source == "datasheet" else self.source,
            provenance={**self.provenance, "derated_from": self.name,
                        "compute_efficiency": compute, "memory_efficiency": memory},
        )

    def retimed(self, factor: float) -> HardwareProfile:
        """A copy on which every step takes `factor` times as long: overheads times `factor`, FLOP/s and
        bandwidths divided by it: the same machine in a slower (> 1) or faster (< 1) state. serving_lab/fidelity.py
        nudges a profile this way to measure how sensitive a simulated metric is to step-time errors."""
        if not factor > 0:
            raise ValueError(f"a time factor must be > 0, got {factor}")
        return replace(
            self,
            name=f"{self.name} (x{factor:.2f} time)",
            peak_flops={dtype: rate / factor for dtype, rate in self.peak_flops.items()},
            memory_bandwidth=self.memory_bandwidth / factor,
            step_overhead_s=self.step_overhead_s * factor,
            per_seq_overhead_s=self.per_seq_overhead_s * factor,
            per_token_overhead_s=self.per_token_overhead_s * factor,
            per_block_overhead_s=self.per_block_overhead_s * factor,
            interconnect_bandwidth=self.interconnect_bandwidth / factor,
            interconnect_latency_s=self.interconnect_latency_s * factor,
            network_bandwidth=self.network_bandwidth / factor,
            host_link_bandwidth=self.host_link_bandwidth / factor,
            network_latency_s=self.network_latency_s * factor,
            measured_allreduce={tp: [latency * factor, bandwidth / factor]
                                for tp, (latency, bandwidth) in self.measured_allreduce.items()},
            provenance={**self.provenance, "retimed_from": self.name, "time_factor": factor},
        )

    # ---- JSON ----

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HardwareProfile:
        known = {f.name for f in fields(cls)}
        # Read past the terms of an older fit form; such a profile's fit_form is stale, so load_or_calibrate refits it.
        data = {key: value for key, value in data.items() if key not in RETIRED_FIELDS}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown hardware profile field(s): {', '.join(sorted(unknown))}")
        if "measured_allreduce" in data:  # JSON keys are strings
            data["measured_allreduce"] = {int(tp): list(terms) for tp, terms in data["measured_allreduce"].items()}
        return cls(**data)

    def to_json(self, path: str | os.PathLike[str]) -> Path:
        """Write the profile as JSON (creating parent folders) and return the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")
        return path

    @classmethod
    def from_json(cls, path: str | os.PathLike[str]) -> HardwareProfile:
        return cls.from_dict(json.loads(Path(path).read_text()))

    def save(self, directory: str | os.PathLike[str] | None = None) -> Path:
        """Save as `<directory or profiles_dir()>/<slug of name>.json`, where `named()` finds it."""
        return self.to_json(Path(directory or profiles_dir()) / f"{_slug(self.name)}.json")

    # ---- lookup ----

    @classmethod
    def named(cls, name: str) -> HardwareProfile:
        """A built-in profile, or else one saved in `profiles_dir()`, by name (case-insensitive).

        Built-in names always win, so a saved file cannot silently change what "h100-sxm" means.
        Returns a fresh copy: changing it does not change the built-in.
        """
        key = _slug(name)
        if key in BUILTIN_PROFILES:
            return _copy(BUILTIN_PROFILES[key])
        saved = _saved_profiles()
        if key in saved:
            return cls.from_json(saved[key])
        raise ValueError(
            f"unknown hardware profile {name!r}; built-in: {', '.join(sorted(BUILTIN_PROFILES))}"
            + (f"; saved in {profiles_dir()}: {', '.join(sorted(saved))}" if saved else "")
        )


def profiles_dir() -> Path:
    """Where calibrated profiles live: `profiles` in the cache folder (`$SERVING_LAB_CACHE`, default
    `~/.cache/serving-lab`). Not created here; `HardwareProfile.save` creates it when it writes."""
    return cache_dir() / "profiles"


CALIBRATED_PREFERENCE = ("calibrated-cuda-bfloat16", "calibrated-cuda-float32", "calibrated-cpu-float32",
                         "calibrated-cpu-bfloat16")


def load_calibrated_profile() -> HardwareProfile | None:
    """This machine's saved calibration (`serving_lab/calibrate.py`), if any: a GPU's first, then the CPU's.
    A file this version cannot read (written by another version of the course) is passed over with a
    warning: `load_or_calibrate` measures a new one in its place."""
    saved = _saved_profiles()
    for name in CALIBRATED_PREFERENCE:
        if name in saved:
            try:
                return HardwareProfile.from_json(saved[name])
            except (ValueError, TypeError) as err:
                warnings.warn(f"passing over the calibrated profile {saved[name]}: {err} (another version's? "
                              "`serving-lab calibrate` measures this machine again)", stacklevel=2)
    return None


def known_profile_names() -> list[str]:
    """Built-in names followed by the names of profiles saved in `profiles_dir()`."""
    return sorted(BUILTIN_PROFILES) + sorted(set(_saved_profiles()) - set(BUILTIN_PROFILES))


def _slug(name: str) -> str:
    return "-".join(name.lower().replace("_", "-").split())


def _saved_profiles() -> dict[str, Path]:
    directory = profiles_dir()
    if not directory.is_dir():
        return {}
    return {path.stem.lower(): path for path in sorted(directory.glob("*.json"))}


def _copy(profile: HardwareProfile) -> HardwareProfile:
    return replace(profile, peak_flops=dict(profile.peak_flops), matmul_efficiency=dict(profile.matmul_efficiency),
                   measured_allreduce={tp: list(terms) for tp, terms in profile.measured_allreduce.items()},
                   provenance=dict(profile.provenance))


# ---- built-in profiles ----------------------------------------------------------------------------

_GPU_NOTE = (
    "Vendor datasheet peaks (dense, no sparsity) in peak_flops and memory_bandwidth; matmul_efficiency, "
    "attention_efficiency, bandwidth_efficiency, the overheads and the interconnect terms are fitted to "
    "published serving measurements (provenance['fit']). NVLink is stored per direction (half the "
    "datasheet's bidirectional total); all-reduces reach interconnect_efficiency of it. "
    "memory_bytes is what nvidia-smi reports (MiB x 2^20)."
)

MIB = 2**20

RETIRED_FIELDS = frozenset({"small_batch_token_overheads_s"})  # saved by calibrations before weight_packing_passes
FIT_PATH = Path(__file__).parent / "data" / "gpu_fit.json"

# Fitted terms a GPU profile takes from FIT_PATH (everything else is its datasheet). `combine` is the form the
# terms were fitted under (an entry without one was fitted under the profile's own, "max"): the fractions are
# only right priced the way they were fitted.
FITTED_FIELDS = ("matmul_efficiency", "attention_efficiency", "bandwidth_efficiency", "step_overhead_s",
                 "per_seq_overhead_s", "interconnect_latency_s", "interconnect_efficiency", "combine")


def with_fit(datasheet: HardwareProfile, fits: dict[str, Any] | None = None) -> HardwareProfile:
    """`datasheet` with the terms `benchmarks/published.py --fit` fitted for it (none fitted: unchanged,
    every efficiency 1.0, so the datasheet is an optimistic bound). `fits`: another file of FIT_PATH's form
    (benchmarks/fit_by_source.py's candidate), read instead of FIT_PATH."""
    if fits is None:
        fits = json.loads(FIT_PATH.read_text()) if FIT_PATH.is_file() else {}
    fit = fits.get(datasheet.name)
    if fit is None:
        return datasheet
    terms = {name: fit[name] for name in FITTED_FIELDS if name in fit}
    return replace(datasheet, **terms, provenance={**datasheet.provenance, "fit": fit["provenance"]})


# Overheads before a fit: ~1 ms per step, ~10 us per request, ~0.1 us per KV block.
# Host links are assumptions, not fitted: what a large pinned copy reaches over PCIe x16 per direction,
# ~25 GB/s on Gen4 (32 on paper) and ~50 GB/s on Gen5 (64 on paper).
PCIE4_X16, PCIE5_X16 = 25 * GIGA, 50 * GIGA
_GPU_OVERHEADS = dict(step_overhead_s=1.0e-3, per_seq_overhead_s=10e-6, per_token_overhead_s=0.0,
                      per_block_overhead_s=0.1e-6, interconnect_latency_s=10e-6, network_latency_s=10e-6)

A100_80GB_SXM = with_fit(HardwareProfile(
    name="A100-80GB-SXM",
    peak_flops={"float32": 19.5 * TERA, "bfloat16": 312 * TERA, "float16": 312 * TERA},
    memory_bandwidth=2039 * GIGA,
    memory_bytes=81920 * MIB,  # nvidia-smi: "81920MiB" on an A100-SXM4-80GB
    interconnect_bandwidth=300 * GIGA,  # NVLink3: 600 GB/s bidirectional
    network_bandwidth=25 * GIGA,  # one 200 Gb/s HDR InfiniBand NIC per GPU (DGX A100)
    host_link_bandwidth=PCIE4_X16,
    source="datasheet",
    notes=_GPU_NOTE,
    provenance={"reference": "NVIDIA A100 Tensor Core GPU datasheet (SXM4 80GB)"},
    **_GPU_OVERHEADS,
))

_H100_DATASHEET = HardwareProfile(
    name="H100-SXM",
    peak_flops={"float32": 67 * TERA, "bfloat16": 989 * TERA, "float16": 989 * TERA, "fp8": 1979 * TERA},
    memory_bandwidth=3350 * GIGA,
    memory_bytes=81559 * MIB,  # nvidia-smi: "81559MiB" on an H100 80GB HBM3
    interconnect_bandwidth=450 * GIGA,  # NVLink4: 900 GB/s bidirectional
    network_bandwidth=50 * GIGA,  # one 400 Gb/s NDR InfiniBand NIC per GPU (DGX H100)
    host_link_bandwidth=PCIE5_X16,
    source="datasheet",
    notes=_GPU_NOTE,
    provenance={"reference": "NVIDIA H100 Tensor Core GPU datasheet (SXM5 80GB)"},
    **_GPU_OVERHEADS,
)
H100_SXM = with_fit(_H100_DATASHEET)

# The H200 is an H100 with more and faster memory (HBM3e): same compute, same NVLink.
H200 = with_fit(replace(
    _H100_DATASHEET,
    name="H200",
    memory_bandwidth=4800 * GIGA,
    memory_bytes=143771 * MIB,  # nvidia-smi: "143771MiB" on an H200 (141 GB)
    provenance={"reference": "NVIDIA H200 Tensor Core GPU datasheet (SXM 141GB)"},
))

# Ada, PCIe only: tensor parallelism all-reduces over PCIe Gen4 x16 (64 GB/s bidirectional).
L40S = with_fit(HardwareProfile(
    name="L40S",
    peak_flops={"float32": 91.6 * TERA, "bfloat16": 362 * TERA, "float16": 362 * TERA, "fp8": 733 * TERA},
    memory_bandwidth=864 * GIGA,
    memory_bytes=46068 * MIB,  # nvidia-smi: "46068MiB" on an L40S (48 GB GDDR6 with ECC)
    interconnect_bandwidth=32 * GIGA,  # PCIe Gen4 x16, per direction
    network_bandwidth=25 * GIGA,  # a 200 Gb/s NIC per GPU, a guess
    host_link_bandwidth=PCIE4_X16,
    source="datasheet",
    notes=_GPU_NOTE,
    provenance={"reference": "NVIDIA L40S datasheet (dense Tensor Core peaks, sparsity excluded)"},
    **_GPU_OVERHEADS,
))

# Blackwell: no bf16/fp8 Llama-3.1 rows were found to fit it on; it borrows the H100's fitted fractions
# (see benchmarks/published.py), so its numbers are the least trustworthy of the built-ins.
B200 = with_fit(HardwareProfile(
    name="B200",
    peak_flops={"float32": 75 * TERA, "bfloat16": 2250 * TERA, "float16": 2250 * TERA, "fp8": 4500 * TERA},
    memory_bandwidth=8000 * GIGA,
    memory_bytes=183359 * MIB,  # nvidia-smi: "183359MiB" on a B200 (180 GB)
    interconnect_bandwidth=900 * GIGA,  # NVLink5: 1.8 TB/s bidirectional
    network_bandwidth=50 * GIGA,  # one 400 Gb/s NIC per GPU (DGX B200)
    host_link_bandwidth=PCIE5_X16,
    source="datasheet",
    notes=_GPU_NOTE,
    provenance={"reference": "NVIDIA HGX/DGX B200 datasheet (per GPU, dense, sparsity excluded)"},
    **_GPU_OVERHEADS,
))

LOCAL_CPU = HardwareProfile(
    name="local-cpu",
    peak_flops={"float32": 375 * GIGA, "bfloat16": 2.3 * TERA},
    memory_bandwidth=27 * GIGA,
    memory_bytes=16 * 2**30,
    # Python-level costs dominate a small model on a CPU: a decode step runs a few hundred operators.
    step_overhead_s=3e-3,
    per_seq_overhead_s=50e-6,
    per_token_overhead_s=2e-6,
    per_block_overhead_s=0.5e-6,
    # Tensor parallelism on one CPU: the ranks share its 2 cores (rates above measured on 2 threads), and
    # all-reduce through gloo between processes. The all-reduce was measured on the AMD EPYC VM, not the course
    # machine (the median of three runs of benchmarks/allreduce.py, RESULTS.md "All-reduce on this machine");
    # the interconnect is its 2-process fit, a point-to-point exchange.
    cores=2,
    threads=2,
    measured_allreduce={2: [550e-6, 1.4 * GIGA], 3: [1.3e-3, 1.6 * GIGA]},
    interconnect_bandwidth=1.4 * GIGA,
    interconnect_latency_s=550e-6,
    network_bandwidth=1.25 * GIGA,  # 10 Gb/s Ethernet guess, for simulated KV transfer
    network_latency_s=50e-6,
    source="datasheet-like estimate",
    notes=(
        "Measured on a 2-core AVX-512/AMX-bf16 machine (torch 2.13 CPU, 2 threads; benchmarks/RESULTS.md, "
        "'The machine'): DRAM copy ~27 GB/s, 2048^3 matmul ~375 GFLOP/s fp32 and ~2.3 TFLOP/s bf16 (AMX). "
        "At batch 1 bf16 matrix-vector products stream only ~9 GB/s, so bf16 decode is priced "
        "optimistically here. Overheads are guesses. Replace with a calibrated profile (serving_lab/calibrate.py)."
    ),
    provenance={"reference": "benchmarks/RESULTS.md#the-machine", "threads": 2, "torch": "2.13.0+cpu",
                "device_type": "cpu"},
)

DEFAULT_CPU_PROFILE = "local-cpu"

BUILTIN_PROFILES: dict[str, HardwareProfile] = {
    _slug(profile.name): profile for profile in (A100_80GB_SXM, H100_SXM, H200, L40S, B200, LOCAL_CPU)
}
