"""The deployment manifest: one YAML file that describes a deployment, read once into a validated object.

An operator writes what to serve and how (`service`, `engine`, `api`, `cache`, `scheduler`, `optional`,
`metrics`); this module turns that file into the `EngineConfig` that the reference engine and the simulator
both run, and into the arguments each side needs besides (the model, the tensor-parallel degree, a
speculative draft). `serving_lab/vllm_command.py` turns the same object into a `vllm serve` command line.

Why pydantic: the file comes from a person, so every mistake must come back as one line that names the
dotted key (`engine.tensor_parallel_size`) and what it accepts. The models below forbid unknown keys and
coerce nothing (`strict`), so `max_num_seqs: "32"` or `stream: yes please` fail instead of guessing;
`load_manifest` turns pydantic's errors into one `ManifestError` (a `ValueError`), so no stack trace of
the library reaches the user. Command-line flags (`OVERRIDE_FLAGS`) are written into the file's keys
before validation, so an overridden value is checked, and named, exactly like one from the file.

Two kinds of error come later than parsing, because they depend on where the manifest runs:
`tensor_parallel_size > 1` is honoured by the simulator (which prices the all-reduces on a hardware
profile) but not by the one-device engine (`llm_kwargs`), and a model name the simulator knows only by
its dimensions (`llama-3.1-8b`) is no file the engine could load.

Lesson: lessons/03-chunked-prefill-and-disaggregation.md#budget-knobs (the manifest's prefill and decode
budgets, and their vLLM counterparts).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ref_engine.core.config import EngineConfig
from ref_engine.core.metrics import RunMetrics
from ref_engine.model.arch_config import DEFAULT_MODEL_NAME, KNOWN_MODELS, ArchConfig

# The engine's default model (a Q4_1 GGUF of these weights, ref_engine/model/store.py), under the name
# Hugging Face and vLLM know it by, so the same manifest means the same model on both.
DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
NGRAM_DRAFT = "[ngram]"  # speculative_decoding.draft_model for prompt lookup (vLLM's old spelling)
EXAMPLE_MANIFEST = Path(__file__).parent / "manifests" / "smollm2.yaml"


class ManifestError(ValueError):
    """A manifest the engine or simulator cannot run; the message names the dotted key."""


PositiveInt = Annotated[int, Field(ge=1)]
NonEmptyStr = Annotated[str, Field(min_length=1)]
MetricName = Literal["time_to_first_token", "inter_token_latency", "output_tokens_per_second",
                     "time_to_decode_per_output_token", "preempted_sequences", "kv_cache_utilization"]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class EngineSection(_Section):
    framework: Literal["vllm"]  # the serving framework the manifest is written for (ours mirrors it)
    model: NonEmptyStr  # DEFAULT_MODEL, a GGUF file, a Hugging Face folder, or (simulator) a KNOWN_MODELS name
    tensor_parallel_size: PositiveInt
    trust_remote_code: bool  # vLLM's flag; our engine runs no model code from a repository either way
    served_model_name: NonEmptyStr | None  # the name clients send as "model" (None: engine.model)
    # The engine's numerics. None: float32, the reference that matches transformers token for token (vLLM's
    # own default is "auto", the checkpoint's dtype). int8: W8A8 on torch's x86 CPU kernels, computed in float32.
    dtype: Literal["float32", "bfloat16"] | None = None
    quantization: Literal["int8"] | None = None
    # What the KV cache stores K/V in (vLLM's --kv-cache-dtype). None or "auto": the engine's dtype.
    kv_cache_dtype: Literal["auto", "float32", "bfloat16"] | None = None
    # vLLM's --enforce-eager: true (or None, our engine's default) runs the model eagerly; false compiles it
    # (ref_engine/model/compile.py). vLLM's own default is false (compile, and CUDA graphs on a GPU).
    enforce_eager: bool | None = None


class RequestLimits(_Section):
    max_model_len: PositiveInt | None  # None: the model's max_position_embeddings
    max_num_seqs: PositiveInt


class Admission(_Section):
    preempt: Literal["recompute", "swap"]  # -> EngineConfig.preemption_mode
    fairness: Literal["none", "per_tenant_budgets"]  # -> scheduling_policy "fcfs" / "fair"


class ApiSection(_Section):
    protocol: Literal["openai"]
    stream: bool
    request_limits: RequestLimits
    admission: Admission


class CacheSection(_Section):
    block_size_tokens: PositiveInt
    block_table: Literal["paged"]  # a per-request table of fixed-size blocks: the only layout the engine has
    # "on_demand": a block when tokens need one (paged, as vLLM); the two reservations are lesson 2's
    # pre-vLLM baselines: max_model_len tokens up front, or exactly prompt + max_tokens (an oracle)
    allocation: Literal["on_demand", "reserve_max_model_len", "reserve_exact"]


class SchedulerSection(_Section):
    type: Literal["continuous", "static"]
    prefill_budget_tokens: PositiveInt | None  # most prefill tokens in one step (None: no separate cap)
    decode_batch_max_tokens: PositiveInt | None  # most decode rows in one step (None: max_num_seqs)


class SpeculativeDecoding(_Section):
    draft_model: NonEmptyStr  # a model as engine.model, "self:L" (the target's first L layers) or "[ngram]"
    speculative_tokens: PositiveInt


class OptionalSection(_Section):
    speculative_decoding: SpeculativeDecoding | None = None


class Manifest(_Section):
    """One deployment, validated. Build it with `load_manifest`."""

    service: NonEmptyStr
    engine: EngineSection
    api: ApiSection
    cache: CacheSection
    scheduler: SchedulerSection
    optional: OptionalSection = OptionalSection()
    metrics: list[MetricName] = Field(min_length=1)

    @field_validator("metrics")
    @classmethod
    def _distinct(cls, names: list[str]) -> list[str]:
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"each metric once; repeated: {', '.join(repeated)}")
        return names

    def engine_config(self) -> EngineConfig:
        """The knobs both sides run. The step's token budget (`max_num_batched_tokens`, which the
        manifest does not name) is the prefill budget plus the decode budget, so both fit in one step."""
        scheduler, limits = self.scheduler, self.api.request_limits
        knobs: dict[str, Any] = dict(
            block_size=self.cache.block_size_tokens,
            kv_allocation=_KV_ALLOCATION[self.cache.allocation],
            max_num_seqs=limits.max_num_seqs,
            max_model_len=limits.max_model_len,
            preemption_mode=self.api.admission.preempt,
            scheduling_policy=_SCHEDULING_POLICY[self.api.admission.fairness],
            scheduling=scheduler.type,
            prefill_budget_tokens=scheduler.prefill_budget_tokens,
            decode_batch_max_tokens=scheduler.decode_batch_max_tokens,
        )
        if scheduler.prefill_budget_tokens is not None:
            knobs["max_num_batched_tokens"] = step_token_budget(
                scheduler.prefill_budget_tokens, scheduler.decode_batch_max_tokens, limits.max_num_seqs)
        spec = self.optional.speculative_decoding
        if spec is not None:
            knobs["num_speculative_tokens"] = spec.speculative_tokens
            if spec.draft_model == NGRAM_DRAFT:
                knobs["speculative_method"] = "ngram"
            else:
                knobs.update(speculative_method="draft_model", speculative_model=spec.draft_model)
        with naming_keys():
            return EngineConfig(**knobs)

    def llm_kwargs(self) -> dict[str, Any]:
        """`LLM(**manifest.llm_kwargs())`: the engine's model (None: the default), numerics and config, after
        the checks only the one-device engine needs."""
        if self.engine.quantization is not None and self.engine.dtype not in (None, "float32"):
            raise ManifestError(f"engine.quantization: {self.engine.quantization} computes in float32 around its "
                                f"int8 products; engine.dtype must be float32 or null, got {self.engine.dtype!r}")
        if self.engine.tensor_parallel_size != 1:
            raise ManifestError(
                f"engine.tensor_parallel_size: the reference engine runs on one device; allowed: 1, got "
                f"{self.engine.tensor_parallel_size} (`serving-lab simulate` prices larger degrees)")
        model = self.engine.model
        if model != DEFAULT_MODEL and not Path(model).exists():
            raise ManifestError(f"engine.model: the engine loads {DEFAULT_MODEL!r}, a GGUF file or a Hugging "
                                f"Face folder; {model!r} is none of them")
        return {"model": None if model == DEFAULT_MODEL else model, "config": self.engine_config(),
                "dtype": self.engine.dtype or "float32", "quantization": self.engine.quantization,
                "kv_cache_dtype": self.engine.kv_cache_dtype or "auto",
                "enforce_eager": self.engine.enforce_eager is not False}

    def measured_llm_kwargs(self) -> dict[str, Any]:
        """`llm_kwargs` for the sweep's and the report's measured runs, whose runner (ref_engine/bench.py)
        keeps the KV cache in the model's dtype and runs it eagerly: a manifest asking for otherwise is refused,
        not ignored."""
        kwargs = self.llm_kwargs()
        if kwargs["kv_cache_dtype"] != "auto":
            raise ManifestError(f"engine.kv_cache_dtype: measured runs keep the KV cache in the model's dtype; "
                                f"got {kwargs['kv_cache_dtype']!r} (use auto, or simulate only; `serving-lab "
                                "serve` and `generate` run it)")
        if not kwargs["enforce_eager"]:
            raise ManifestError("engine.enforce_eager: measured runs run the model eagerly; got false (use true "
                                "or null; `serving-lab serve` compiles it)")
        return kwargs

    def simulator_kwargs(self) -> dict[str, Any]:
        """`Simulator(hardware=..., **manifest.simulator_kwargs())`: the priced model (known names too),
        the config, the tensor-parallel degree, a draft model's dimensions, and the dtype the linear layers
        run in when the manifest names one (int8 under `engine.quantization`; None: the simulator's choice,
        a calibrated profile's own dtype or bfloat16), which the hardware profile must know how to price."""
        kwargs: dict[str, Any] = dict(model=simulated_arch(self.engine.model, "engine.model"),
                                      config=self.engine_config(),
                                      tensor_parallel_size=self.engine.tensor_parallel_size,
                                      dtype=self.engine.quantization or self.engine.dtype)
        if self.engine.kv_cache_dtype not in (None, "auto"):
            kwargs["kv_cache_dtype"] = self.engine.kv_cache_dtype
        spec = self.optional.speculative_decoding
        if spec is not None and spec.draft_model != NGRAM_DRAFT and not spec.draft_model.startswith("self:"):
            kwargs["draft_arch"] = simulated_arch(spec.draft_model, "optional.speculative_decoding.draft_model")
        return kwargs


def step_token_budget(prefill_budget_tokens: int, decode_batch_max_tokens: int | None, max_num_seqs: int) -> int:
    """`max_num_batched_tokens` for a manifest's budgets: the prefill budget plus the decode budget (None:
    `max_num_seqs`), so a full prefill and a full decode batch fit in one step."""
    return prefill_budget_tokens + (decode_batch_max_tokens or max_num_seqs)


_KV_ALLOCATION = {"on_demand": "paged", "reserve_max_model_len": "contiguous", "reserve_exact": "contiguous_exact"}
_SCHEDULING_POLICY = {"none": "fcfs", "per_tenant_budgets": "fair"}

# EngineConfig knob -> the manifest key that sets it, to name the key when EngineConfig refuses a value.
KNOB_KEYS = {
    "block_size": "cache.block_size_tokens",
    "kv_allocation": "cache.allocation",
    "max_num_seqs": "api.request_limits.max_num_seqs",
    "max_model_len": "api.request_limits.max_model_len",
    "preemption_mode": "api.admission.preempt",
    "scheduling_policy": "api.admission.fairness",
    "scheduling": "scheduler.type",
    "prefill_budget_tokens": "scheduler.prefill_budget_tokens",
    "max_num_batched_tokens": "scheduler.prefill_budget_tokens",
    "decode_batch_max_tokens": "scheduler.decode_batch_max_tokens",
    "speculative_method": "optional.speculative_decoding.draft_model",
    "speculative_model": "optional.speculative_decoding.draft_model",
    "num_speculative_tokens": "optional.speculative_decoding.speculative_tokens",
}


@contextmanager
def naming_keys() -> Iterator[None]:
    """Re-raise a `ValueError` from EngineConfig, the engine or the simulator as a `ManifestError` that
    starts with the manifest key of the first knob the message names (`max_model_len (9000) exceeds the
    model's ...` -> `api.request_limits.max_model_len: ...`); one that names no knob passes unchanged."""
    try:
        yield
    except ManifestError:
        raise
    except ValueError as error:
        message = str(error)
        found = [(match.start(), knob) for knob in KNOB_KEYS
                 if (match := re.search(rf"\b{knob}\b", message))]
        if not found:
            raise
        raise ManifestError(f"{KNOB_KEYS[min(found)[1]]}: {message}") from None


def simulated_arch(model: str, key: str) -> ArchConfig:
    """The dimensions the simulator prices for a manifest's model: the default model, a `KNOWN_MODELS`
    name, or a checkpoint path (read without its weights)."""
    if model == DEFAULT_MODEL:
        return ArchConfig.named(DEFAULT_MODEL_NAME)
    if model.lower() in KNOWN_MODELS:
        return ArchConfig.named(model)
    if Path(model).exists():
        from ref_engine.model.loader import read_arch  # imports torch: only for a path

        with naming_keys():
            return read_arch(model)
    raise ManifestError(f"{key}: the simulator prices {DEFAULT_MODEL!r}, a known model "
                        f"({', '.join(sorted(KNOWN_MODELS))}) or a GGUF file or Hugging Face folder; "
                        f"{model!r} is none of them")


# ---- reading a file ----------------------------------------------------------------------------------

# Command-line flag -> the manifest key it overrides (vLLM's flag names where vLLM has the knob).
OVERRIDE_FLAGS = {
    "--model": "engine.model",
    "--served-model-name": "engine.served_model_name",
    "--tensor-parallel-size": "engine.tensor_parallel_size",
    "--dtype": "engine.dtype",
    "--quantization": "engine.quantization",
    "--kv-cache-dtype": "engine.kv_cache_dtype",
    "--enforce-eager": "engine.enforce_eager",
    "--max-model-len": "api.request_limits.max_model_len",
    "--max-num-seqs": "api.request_limits.max_num_seqs",
    "--preemption-mode": "api.admission.preempt",
    "--fairness": "api.admission.fairness",
    "--block-size": "cache.block_size_tokens",
    "--scheduler-type": "scheduler.type",
    "--prefill-budget-tokens": "scheduler.prefill_budget_tokens",
    "--decode-batch-max-tokens": "scheduler.decode_batch_max_tokens",
    "--num-speculative-tokens": "optional.speculative_decoding.speculative_tokens",
}


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a key given twice in one mapping is an error: plain YAML keeps the
    last one, so a pasted-in second `max_num_seqs:` would silently win."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def load_manifest(path: str | Path, overrides: Mapping[str, Any] | None = None) -> Manifest:
    """Read and validate a manifest file; `overrides` maps dotted keys to values that replace the file's
    (the command line's flags). Any problem is one `ManifestError` naming the file and the keys."""
    path = Path(path)
    try:
        with path.open(encoding="utf-8") as stream:  # a stream, so YAML's errors name the file and line
            data = yaml.load(stream, Loader=_UniqueKeyLoader)
    except OSError as error:
        raise ManifestError(f"{path}: cannot read the manifest ({error.strerror})") from None
    except yaml.YAMLError as error:
        raise ManifestError(f"{path}: not valid YAML: {error}") from None
    if not isinstance(data, dict):
        raise ManifestError(f"{path}: a manifest is a mapping of sections (service, engine, ...), "
                            f"got {type(data).__name__}")
    for key, value in (overrides or {}).items():
        _set_key(data, key, value)
    try:
        return Manifest.model_validate(data)
    except ValidationError as error:
        if error.error_count() == 1:
            raise ManifestError(f"{path}: {_describe(error.errors()[0])}") from None
        problems = "\n".join(f"  {_describe(e)}" for e in error.errors())
        raise ManifestError(f"{path}: {error.error_count()} problem(s):\n{problems}") from None


def _set_key(data: dict[str, Any], dotted: str, value: Any) -> None:
    """data["a"]["b"] = value for "a.b", creating (or replacing a non-mapping with) sections on the way."""
    *sections, last = dotted.split(".")
    for section in sections:
        if not isinstance(data.get(section), dict):
            data[section] = {}
        data = data[section]
    data[last] = value


def _describe(error: Mapping[str, Any]) -> str:
    """One pydantic error as `dotted.key: what is wrong; what is allowed`."""
    loc = error["loc"]
    key = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc).lstrip(".")
    kind = error["type"]
    if kind == "extra_forbidden":
        return f"{key}: unknown key; allowed here: {', '.join(_section_of(loc[:-1]).model_fields)}"
    if kind == "missing":
        return f"{key}: missing (required)"
    if kind == "model_type":  # a section given as a scalar or a list
        return f"{key}: expected a section (keys: {', '.join(_section_of(loc).model_fields)}), got {error['input']!r}"
    if kind == "literal_error":
        return f"{key}: got {error['input']!r}; allowed: {error['ctx']['expected']}"
    return f"{key}: {error['msg']}, got {error['input']!r}"


def _section_of(loc: tuple[Any, ...]) -> type[BaseModel]:
    """The model class that holds the keys at `loc` (a path of section names from the top)."""
    section: type[BaseModel] = Manifest
    for name in loc:
        annotation = section.model_fields[name].annotation
        section = next(a for a in (annotation, *getattr(annotation, "__args__", ()))
                       if isinstance(a, type) and issubclass(a, BaseModel))
    return section


# ---- the six metrics ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ManifestMetric:
    """One of the manifest's metric names: the `vllm:` Prometheus series it reads off a vLLM server
    (vllm/v1/metrics/loggers.py), and how a `RunMetrics` of ours reports it."""

    vllm_series: str
    report: Callable[[RunMetrics], str]


def _distinct_preempted(run: RunMetrics) -> int:
    return sum(1 for request in run.requests if request.num_preemptions)


MANIFEST_METRICS: dict[str, ManifestMetric] = {
    "time_to_first_token": ManifestMetric(
        "vllm:time_to_first_token_seconds",
        lambda m: f"mean {m.mean_ttft_ms:.1f} ms, p99 {m.p99_ttft_ms:.1f} ms"),
    "inter_token_latency": ManifestMetric(
        "vllm:inter_token_latency_seconds",
        lambda m: f"mean {m.mean_itl_ms:.2f} ms, p99 {m.p99_itl_ms:.2f} ms"),
    "output_tokens_per_second": ManifestMetric(
        "rate(vllm:generation_tokens_total)",
        lambda m: f"{m.output_throughput:.1f} tok/s"),
    "time_to_decode_per_output_token": ManifestMetric(
        "vllm:request_time_per_output_token_seconds",
        lambda m: f"mean {m.mean_tpot_ms:.2f} ms, p99 {m.p99_tpot_ms:.2f} ms"),
    "preempted_sequences": ManifestMetric(
        "vllm:num_preemptions_total",
        lambda m: f"{_distinct_preempted(m)} sequences ({m.num_preemptions} preemptions)"),
    "kv_cache_utilization": ManifestMetric(
        "vllm:kv_cache_usage_perc",
        lambda m: f"mean {m.mean_kv_usage:.1%}, max {m.max_kv_usage:.1%}"),
}
