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

The client's words are the contract: every value of the client's own manifest is accepted as written
(`framework: vLLM`, `protocol: openai_compatible_http`, `stream: incremental_tokens`, `block_table:
per_sequence`, `scheduler.type: chunked_prefill`); where the project offers more (`continuous` without
chunking and `static`, lesson 3's baselines; `whole_response` to turn streaming off; the older `openai`,
`paged`, booleans), those are extra names beside the client's, never replacements.

Some errors come later than parsing, because they depend on where the manifest runs: the engine
(`llm_kwargs`) cannot run a tensor-parallel degree that does not split the model's heads, a model that is not
on this machine, or a context beyond the model's, and says so in one line per key with the flag that
overrides it (measured runs, `measured_llm_kwargs`, take degree 1 only); the simulator
(`simulator_kwargs`) prices any degree but only a model whose dimensions it knows (a `KNOWN_MODELS` name, a
checkpoint, or a `config.json`). Nothing is silently substituted.

The optional `tenants:` section gives each tenant a `TenantPolicy` (weight, running cap, pending cap, token
budget): the weights and running caps go into the `EngineConfig`, the rest to the server's admission control.

Lesson: lessons/03-chunked-prefill-and-disaggregation.md#budget-knobs (the manifest's prefill and decode
budgets, and their vLLM counterparts).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, Field, PlainValidator, ValidationError, field_validator
from pydantic_core import PydanticCustomError

from core.arch_config import DEFAULT_MODEL_NAME, KNOWN_MODELS, ArchConfig
from core.config import EngineConfig, tensor_parallel_sizes
from core.metrics import RunMetrics
from ref_engine.entrypoints.openai.tenants import TenantPolicy

# The engine's default model (a Q4_1 GGUF of these weights, ref_engine/model/store.py), under the name
# Hugging Face and vLLM know it by, so the same manifest means the same model on both.
DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
NGRAM_DRAFT = "[ngram]"  # speculative_decoding.draft_model for prompt lookup (vLLM's old spelling)
EXAMPLE_MANIFEST = Path(__file__).parent / "manifests" / "smollm2.yaml"


class ManifestError(ValueError):
    """A manifest the engine or simulator cannot run; the message names the dotted key."""


PositiveInt = Annotated[int, Field(ge=1)]
PositiveFloat = Annotated[float, Field(gt=0)]
NonEmptyStr = Annotated[str, Field(min_length=1)]
MetricName = Literal["time_to_first_token", "inter_token_latency", "output_tokens_per_second",
                     "time_to_decode_per_output_token", "preempted_sequences", "kv_cache_utilization"]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


def _not_one_of(expected: str) -> PydanticCustomError:
    """The error a `Literal` gives, for a value checked by hand: `_describe` words both alike."""
    return PydanticCustomError("literal_error", "Input should be {expected}", {"expected": expected})


def _framework(value: Any) -> str:
    """`vLLM`, `vllm` or any other case, kept as written (the client's spelling)."""
    if isinstance(value, str) and value.lower() == "vllm":
        return value
    raise _not_one_of("'vllm' in any case (vLLM, vllm)")


STREAM_ON, STREAM_OFF = "incremental_tokens", "whole_response"


def _stream(value: Any) -> str | bool:
    """`incremental_tokens` (the client's name: stream each step's new tokens), `whole_response` (streaming
    off: one JSON body), or a boolean."""
    if isinstance(value, bool) or value in (STREAM_ON, STREAM_OFF):
        return value
    raise _not_one_of(f"{STREAM_ON!r}, {STREAM_OFF!r}, true or false")


class EngineSection(_Section):
    # the serving framework the manifest is written for (ours mirrors it), in any case
    framework: Annotated[str, PlainValidator(_framework)]
    model: NonEmptyStr  # DEFAULT_MODEL, a GGUF file, a Hugging Face folder, or (simulator) a KNOWN_MODELS name
    tensor_parallel_size: PositiveInt
    trust_remote_code: bool  # vLLM's flag; our engine runs no model code from a repository either way
    served_model_name: NonEmptyStr | None  # the name clients send as "model" (None: engine.model)
    # The engine's numerics. None: float32, the reference that matches transformers token for token (vLLM's
    # own default is "auto", the checkpoint's dtype). int8 and int4 are weight-only (int4: a GGUF's own Q4_1
    # blocks); both on CPU kernels, computed in float32 around them.
    dtype: Literal["float32", "bfloat16", "float16"] | None = None
    quantization: Literal["int8", "int4"] | None = None
    # What the KV cache stores K/V in (vLLM's --kv-cache-dtype). None or "auto": the engine's dtype.
    kv_cache_dtype: Literal["auto", "float32", "bfloat16", "float16"] | None = None
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
    protocol: Literal["openai_compatible_http", "openai"]  # the OpenAI-compatible HTTP API ("openai": extra name)
    stream: Annotated[str | bool, PlainValidator(_stream)]  # incremental_tokens / true: deltas as they come
    request_limits: RequestLimits
    admission: Admission

    @property
    def streaming(self) -> bool:
        """Whether `"stream": true` requests are served (`serve` answers them with a 400 when not)."""
        return self.stream is True or self.stream == STREAM_ON


class CacheSection(_Section):
    block_size_tokens: PositiveInt
    # per_sequence: each sequence's table of fixed-size blocks (PagedAttention; "paged": extra name), the only
    # layout the engine has
    block_table: Literal["per_sequence", "paged"]
    # "on_demand": a block when tokens need one (paged, as vLLM); the two reservations are lesson 2's
    # pre-vLLM baselines: max_model_len tokens up front, or exactly prompt + max_tokens (an oracle)
    allocation: Literal["on_demand", "reserve_max_model_len", "reserve_exact"]


class SchedulerSection(_Section):
    # chunked_prefill: continuous batching, long prompts cut into chunks under the budgets; continuous: the
    # same without chunking (a prompt runs whole in one step: lesson 3's baseline); static: lesson 1's baseline
    type: Literal["chunked_prefill", "continuous", "static"]
    prefill_budget_tokens: PositiveInt | None  # most prefill tokens in one step (None: no separate cap)
    # most decode tokens in one step: a decode row is 1 token, 1 + k with k speculative drafts (None: no cap
    # beyond max_num_seqs rows)
    decode_batch_max_tokens: PositiveInt | None


class SpeculativeDecoding(_Section):
    draft_model: NonEmptyStr  # a model as engine.model, "self:L" (the target's first L layers) or "[ngram]"
    speculative_tokens: PositiveInt


class OptionalSection(_Section):
    speculative_decoding: SpeculativeDecoding | None = None


class TenantSection(_Section):
    """One tenant's share and limits, `TenantPolicy`'s fields (None: no limit of that kind)."""

    weight: PositiveFloat = 1.0  # its share under fairness: per_tenant_budgets
    max_num_seqs: PositiveInt | None = None  # most of its requests running at once (the engine's scheduler)
    max_pending_requests: PositiveInt | None = None  # most of its requests open in the server (429 past it)
    token_budget: PositiveInt | None = None  # prompt + max_tokens per window (429 with Retry-After past it)
    budget_window_s: PositiveFloat = 60.0  # the window token_budget counts over


class Manifest(_Section):
    """One deployment, validated. Build it with `load_manifest`."""

    service: NonEmptyStr
    engine: EngineSection
    api: ApiSection
    cache: CacheSection
    scheduler: SchedulerSection
    optional: OptionalSection = OptionalSection()
    metrics: list[MetricName] = Field(min_length=1)
    tenants: dict[NonEmptyStr, TenantSection] | None = None  # tenant name -> its policy (optional)

    @field_validator("metrics")
    @classmethod
    def _distinct(cls, names: list[str]) -> list[str]:
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"each metric once; repeated: {', '.join(repeated)}")
        return names

    def engine_config(self) -> EngineConfig:
        """The knobs both sides run. The step's token budget (`max_num_batched_tokens`, which the manifest
        does not name) is the prefill budget plus the decode budget, so both fit in one step; without
        chunking (`scheduler.type: continuous`) the prefill budget is a whole prompt, `max_model_len`."""
        scheduler, limits = self.scheduler, self.api.request_limits
        scheduling, chunked = _SCHEDULER_TYPES[scheduler.type]
        knobs: dict[str, Any] = dict(
            block_size=self.cache.block_size_tokens,
            kv_allocation=_KV_ALLOCATION[self.cache.allocation],
            max_num_seqs=limits.max_num_seqs,
            max_model_len=limits.max_model_len,
            preemption_mode=self.api.admission.preempt,
            scheduling_policy=_SCHEDULING_POLICY[self.api.admission.fairness],
            scheduling=scheduling,
            enable_chunked_prefill=chunked,
            prefill_budget_tokens=scheduler.prefill_budget_tokens,
            decode_batch_max_tokens=scheduler.decode_batch_max_tokens,
        )
        if scheduler.type == "continuous":
            if scheduler.prefill_budget_tokens is not None:
                raise ManifestError(
                    f"scheduler.prefill_budget_tokens: {scheduler.prefill_budget_tokens} cuts prompts into chunks, "
                    "and scheduler.type: continuous runs each prompt whole; use chunked_prefill, or null here")
            if limits.max_model_len is None:
                raise ManifestError(
                    "api.request_limits.max_model_len: scheduler.type: continuous runs each prompt whole in one "
                    "step, so the step's budget is max_model_len tokens; give it (null leaves it to the model), "
                    "or use chunked_prefill")
            knobs["max_num_batched_tokens"] = step_token_budget(
                limits.max_model_len, scheduler.decode_batch_max_tokens, limits.max_num_seqs)
        elif scheduler.prefill_budget_tokens is not None:
            knobs["max_num_batched_tokens"] = step_token_budget(
                scheduler.prefill_budget_tokens, scheduler.decode_batch_max_tokens, limits.max_num_seqs)
        spec = self.optional.speculative_decoding
        if spec is not None:
            knobs["num_speculative_tokens"] = spec.speculative_tokens
            if spec.draft_model == NGRAM_DRAFT:
                knobs["speculative_method"] = "ngram"
            else:
                knobs.update(speculative_method="draft_model", speculative_model=spec.draft_model)
        policies = self.tenant_policies()
        if policies and self.api.admission.fairness == "per_tenant_budgets":
            knobs["tenant_weights"] = {tenant: policy.weight for tenant, policy in policies.items()}
        caps = {tenant: policy.max_num_seqs for tenant, policy in policies.items() if policy.max_num_seqs}
        if caps:
            knobs["tenant_max_num_seqs"] = caps
        with naming_keys():
            return EngineConfig(**knobs)

    def tenant_policies(self) -> dict[str, TenantPolicy]:
        """The `tenants:` section as the server's `TenantPolicy` per tenant (empty without the section)."""
        return {tenant: TenantPolicy(**section.model_dump()) for tenant, section in (self.tenants or {}).items()}

    def llm_kwargs(self) -> dict[str, Any]:
        """`LLM(**manifest.llm_kwargs())`: the engine's model (None: the default), numerics, config and
        tensor-parallel degree. Every key the engine cannot run here is one line of the `ManifestError`, with
        its override (a degree the model's heads forbid is one; more ranks than cores the engine refuses)."""
        engine, spec = self.engine, self.optional.speculative_decoding
        problems = []
        if engine.quantization is not None and engine.dtype not in (None, "float32"):
            problems.append(f"engine.quantization: {engine.quantization} computes in float32 around its "
                            f"quantized products; engine.dtype must be float32 or null, got {engine.dtype!r}")
        model_found = _found_locally(engine.model)
        if not model_found:
            problems.append(f"engine.model: the engine loads {DEFAULT_MODEL!r}, a GGUF file or a Hugging Face "
                            f"folder; {engine.model!r} is none of them on this machine; override with --model "
                            f"PATH or --model {DEFAULT_MODEL}")
        arch = simulated_arch(engine.model if model_found else DEFAULT_MODEL, "engine.model")
        whose = "" if model_found else f", {DEFAULT_MODEL}'s: engine.model is not here"
        tp, allowed = engine.tensor_parallel_size, tensor_parallel_sizes(arch)
        if tp not in allowed:
            problems.append(f"engine.tensor_parallel_size: {tp} does not split the model's "
                            f"{arch.num_attention_heads} attention heads, {arch.num_kv_heads} KV heads and MLP width "
                            f"{arch.intermediate_size} into equal shares{whose}; allowed: {', '.join(map(str, allowed))}; "
                            "override with --tensor-parallel-size 1 (`serving-lab simulate` prices any degree)")
        elif tp > 1 and engine.quantization is not None:
            problems.append(f"engine.tensor_parallel_size: {engine.quantization} projections run on one rank "
                            f"only; got {tp}; override with --tensor-parallel-size 1 or --quantization null")
        max_model_len = self.api.request_limits.max_model_len
        context = arch.max_position_embeddings
        if max_model_len is not None and max_model_len > context:
            problems.append(f"api.request_limits.max_model_len: max_model_len ({max_model_len}) exceeds the "
                            f"model's max_position_embeddings ({context}{whose}); override with "
                            f"--max-model-len {context} or less")
        if (spec is not None and spec.draft_model != NGRAM_DRAFT and not spec.draft_model.startswith("self:")
                and not _found_locally(spec.draft_model)):
            problems.append(f"optional.speculative_decoding.draft_model: {spec.draft_model!r} is no model on this "
                            "machine; override with --speculative-model PATH, 'self:L' (the model's first L "
                            "layers) or '[ngram]', or serve without speculation: --speculative-decoding null")
        if len(problems) == 1:
            raise ManifestError(problems[0])
        if problems:
            raise ManifestError(f"{len(problems)} keys the engine cannot run on this machine:\n  "
                                + "\n  ".join(problems))
        return {"model": None if engine.model == DEFAULT_MODEL else engine.model, "config": self.engine_config(),
                "dtype": engine.dtype or "float32", "quantization": engine.quantization,
                "kv_cache_dtype": engine.kv_cache_dtype or "auto", "enforce_eager": engine.enforce_eager is not False,
                "tensor_parallel_size": tp}

    def measured_llm_kwargs(self) -> dict[str, Any]:
        """`llm_kwargs` for the sweep's and the report's measured runs, whose runner (ref_engine/bench.py)
        runs the engine in one process and the model eagerly: a manifest asking for otherwise is refused,
        not ignored. (The KV cache's dtype it takes as given.)"""
        kwargs = self.llm_kwargs()
        if kwargs["tensor_parallel_size"] != 1:
            raise ManifestError(f"engine.tensor_parallel_size: measured runs run the engine in one process; got "
                                f"{kwargs['tensor_parallel_size']} (use 1, or simulate only; `serving-lab serve` and "
                                "`generate` run it)")
        if not kwargs["enforce_eager"]:
            raise ManifestError("engine.enforce_eager: measured runs run the model eagerly; got false (use true "
                                "or null; `serving-lab serve` compiles it)")
        return kwargs

    def simulator_kwargs(self, speculation: bool = True) -> dict[str, Any]:
        """`Simulator(hardware=..., **manifest.simulator_kwargs())`: the priced model (known names too),
        the config, the tensor-parallel degree, a draft model's dimensions, and the dtype the linear layers
        run in when the manifest names one (int8 or int4 under `engine.quantization`; None: the simulator's choice,
        a calibrated profile's own dtype or bfloat16), which the hardware profile must know how to price.
        `speculation=False` prices the deployment without its speculative decoding (`simulate` does so, and
        says so, when it has no acceptance rate to price the drafts with)."""
        config = self.engine_config()
        spec = self.optional.speculative_decoding if speculation else None
        if not speculation:
            config = config.replace(speculative_method=None, speculative_model=None)
        kwargs: dict[str, Any] = dict(model=simulated_arch(self.engine.model, "engine.model"), config=config,
                                      tensor_parallel_size=self.engine.tensor_parallel_size,
                                      dtype=self.engine.quantization or self.engine.dtype)
        if self.engine.kv_cache_dtype not in (None, "auto"):
            kwargs["kv_cache_dtype"] = self.engine.kv_cache_dtype
        if spec is not None and spec.draft_model != NGRAM_DRAFT and not spec.draft_model.startswith("self:"):
            kwargs["draft_arch"] = simulated_arch(spec.draft_model, "optional.speculative_decoding.draft_model")
        return kwargs


def step_token_budget(prefill_budget_tokens: int, decode_batch_max_tokens: int | None, max_num_seqs: int) -> int:
    """`max_num_batched_tokens` for a manifest's budgets: the prefill budget plus the decode budget (None:
    `max_num_seqs`), so a full prefill and a full decode batch fit in one step."""
    return prefill_budget_tokens + (decode_batch_max_tokens or max_num_seqs)


def _found_locally(model: str) -> bool:
    """Whether the engine can load `model` here: the default model (the cache fetches it) or a path."""
    return model == DEFAULT_MODEL or Path(model).exists()


_KV_ALLOCATION = {"on_demand": "paged", "reserve_max_model_len": "contiguous", "reserve_exact": "contiguous_exact"}
_SCHEDULING_POLICY = {"none": "fcfs", "per_tenant_budgets": "fair"}
# scheduler.type -> (EngineConfig.scheduling, enable_chunked_prefill)
_SCHEDULER_TYPES = {"chunked_prefill": ("continuous", True), "continuous": ("continuous", False),
                    "static": ("static", True)}

# EngineConfig knob -> the manifest key that sets it, to name the key when EngineConfig refuses a value.
KNOB_KEYS = {
    "block_size": "cache.block_size_tokens",
    "kv_allocation": "cache.allocation",
    "max_num_seqs": "api.request_limits.max_num_seqs",
    "max_model_len": "api.request_limits.max_model_len",
    "preemption_mode": "api.admission.preempt",
    "scheduling_policy": "api.admission.fairness",
    "scheduling": "scheduler.type",
    "enable_chunked_prefill": "scheduler.type",
    "prefill_budget_tokens": "scheduler.prefill_budget_tokens",
    "max_num_batched_tokens": "scheduler.prefill_budget_tokens",
    "decode_batch_max_tokens": "scheduler.decode_batch_max_tokens",
    "speculative_method": "optional.speculative_decoding.draft_model",
    "speculative_model": "optional.speculative_decoding.draft_model",
    "num_speculative_tokens": "optional.speculative_decoding.speculative_tokens",
    "tenant_weights": "tenants",
    "tenant_max_num_seqs": "tenants",
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
    name, a model's `config.json`, or a checkpoint path (read without its weights)."""
    if model == DEFAULT_MODEL:
        return ArchConfig.named(DEFAULT_MODEL_NAME)
    if model.lower() in KNOWN_MODELS:
        return ArchConfig.named(model)
    path = Path(model)
    if path.is_file() and path.suffix == ".json":  # a Hugging Face config.json alone: no weights needed
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
            return ArchConfig.from_hf_config(config, name=path.parent.name or path.stem)
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise ManifestError(f"{key}: {model} is no model's config.json the simulator can read ({error})") from None
    if path.exists():
        from ref_engine.model.loader import read_arch  # imports torch: only for a checkpoint

        with naming_keys():
            return read_arch(model)
    flag = next(flag for flag, dotted in OVERRIDE_FLAGS.items() if dotted == key)
    raise ManifestError(f"{key}: the simulator does not know {model!r}; override with {flag} NAME, a known "
                        f"architecture ({', '.join(sorted(KNOWN_MODELS))}), or {flag} PATH, a model's config.json "
                        "(or its GGUF file or Hugging Face folder)")


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
    "--speculative-model": "optional.speculative_decoding.draft_model",  # vLLM's flag before --speculative-config
    "--speculative-decoding": "optional.speculative_decoding",  # null: no speculation
}
# Overrides taken as written rather than read as YAML: a model is a name or a path, and "[ngram]" is no list.
TEXT_OVERRIDES = ("engine.model", "optional.speculative_decoding.draft_model")


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
    """The model class that holds the keys at `loc` (a path of section names from the top; in a mapping
    of sections, such as `tenants`, the entry's name follows the mapping's)."""
    section: type[BaseModel] = Manifest
    names = iter(loc)
    for name in names:
        annotation = section.model_fields[name].annotation
        candidates = (annotation, *get_args(annotation))
        mapping = next((a for a in candidates if get_origin(a) is dict), None)
        if mapping is not None:
            next(names, None)  # the entry's name, e.g. the tenant's
            candidates = get_args(mapping)
        section = next(a for a in candidates if isinstance(a, type) and issubclass(a, BaseModel))
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
