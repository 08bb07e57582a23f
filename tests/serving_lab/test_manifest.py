"""The deployment manifest: the shipped file builds the expected configuration, every mistake names its key,
flags win over the file, `--to-vllm` speaks only vLLM's real flags, and `simulate --config` runs."""

from __future__ import annotations

import json
import re
import shlex
import statistics
from pathlib import Path
from typing import Any, get_args

import pytest
import yaml

from core.config import EngineConfig
from core.workload import Workload, trace_lengths
from serving_lab import cli
from serving_lab.manifest import (
    EXAMPLE_MANIFEST,
    MANIFEST_METRICS,
    ManifestError,
    MetricName,
    load_manifest,
    naming_keys,
)
from serving_lab.workload_spec import parse_workload
from sim.simulator import Simulator

ROOT = Path(__file__).resolve().parents[2]

# Every flag `--to-vllm` may print, as vLLM declares it in `EngineArgs.add_cli_args`
# (vllm/engine/arg_utils.py, github.com/vllm-project/vllm at commit 99d7eb5d6a512cfcc5a2b104f24ebf2d6cda772b,
# `vllm_command.VLLM_VERSION`), with the choices of those that take a fixed set (`SchedulerPolicy =
# Literal["fcfs", "priority"]`). `enable_chunked_prefill` is a `bool | None` field there, so argparse's
# BooleanOptionalAction gives it both --enable-chunked-prefill and --no-enable-chunked-prefill.
VLLM_SERVE_FLAGS = {
    "--served-model-name", "--trust-remote-code", "--tensor-parallel-size", "--max-model-len", "--max-num-seqs",
    "--block-size", "--enable-chunked-prefill", "--no-enable-chunked-prefill", "--max-num-batched-tokens",
    "--long-prefill-token-threshold", "--scheduling-policy", "--speculative-config", "--dtype", "--enforce-eager",
    "--kv-cache-dtype",
}
VLLM_CHOICES = {"--scheduling-policy": {"fcfs", "priority"},
                "--dtype": {"auto", "half", "float16", "bfloat16", "float", "float32"}}


def example() -> dict[str, Any]:
    return yaml.safe_load(EXAMPLE_MANIFEST.read_text())


def with_values(overrides: dict[str, Any]) -> dict[str, Any]:
    """The example manifest with some dotted keys set (every section exists in it)."""
    data = example()
    for dotted, value in overrides.items():
        *sections, last = dotted.split(".")
        target = data
        for section in sections:
            target = target[section]
        target[last] = value
    return data


def write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "manifest.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    cli.main(argv)
    return capsys.readouterr().out


def test_the_shipped_manifest_builds_the_engine_config_it_describes():
    manifest = load_manifest(EXAMPLE_MANIFEST)
    assert manifest.engine_config() == EngineConfig(
        block_size=16, kv_allocation="paged", max_num_seqs=32, max_model_len=2048, preemption_mode="recompute",
        scheduling_policy="fair", scheduling="continuous", prefill_budget_tokens=256, decode_batch_max_tokens=32,
        max_num_batched_tokens=256 + 32)  # the step holds the prefill budget and the decode budget
    assert manifest.metrics == list(get_args(MetricName)) == list(MANIFEST_METRICS)
    assert manifest.llm_kwargs() == {"model": None, "config": manifest.engine_config(),  # None: the default model
                                     "dtype": "float32", "quantization": None,  # the float32 reference
                                     "kv_cache_dtype": "auto", "enforce_eager": True,  # null: the engine's eager
                                     "tensor_parallel_size": 1}


def test_numerics_reach_the_engine_the_simulator_and_vllm(tmp_path, capsys):
    bf16 = load_manifest(EXAMPLE_MANIFEST, {"engine.dtype": "bfloat16"})
    assert bf16.llm_kwargs()["dtype"] == "bfloat16" and bf16.simulator_kwargs()["dtype"] == "bfloat16"
    assert Simulator(hardware="h100-sxm", **bf16.simulator_kwargs()).dtype == "bfloat16"
    int8 = load_manifest(EXAMPLE_MANIFEST, {"engine.quantization": "int8"})
    assert (int8.llm_kwargs()["dtype"], int8.llm_kwargs()["quantization"]) == ("float32", "int8")
    assert int8.simulator_kwargs()["dtype"] == "int8"  # 8-bit weights: what the simulator prices
    with pytest.raises(ManifestError, match=r"engine\.quantization: int8 computes in float32.*'bfloat16'"):
        load_manifest(EXAMPLE_MANIFEST, {"engine.quantization": "int8", "engine.dtype": "bfloat16"}).llm_kwargs()
    with pytest.raises(ManifestError, match=r"engine\.quantization: got 'int3'; allowed: 'int8' or 'int4'"):
        load_manifest(EXAMPLE_MANIFEST, {"engine.quantization": "int3"})
    int4 = load_manifest(EXAMPLE_MANIFEST, {"engine.quantization": "int4"})
    assert int4.simulator_kwargs()["dtype"] == "int4"  # 0.625 bytes a weight, products in the activations' dtype
    out = run_cli(["manifest", "--to-vllm", str(EXAMPLE_MANIFEST), "--dtype", "bfloat16", "--quantization", "int8"],
                  capsys)
    assert vllm_flags(out)[1]["--dtype"] == "bfloat16"
    assert any(line.startswith("# engine.quantization: int8") for line in out.splitlines())
    bf16_kv = load_manifest(EXAMPLE_MANIFEST, {"engine.kv_cache_dtype": "bfloat16"})
    assert bf16_kv.llm_kwargs()["kv_cache_dtype"] == bf16_kv.simulator_kwargs()["kv_cache_dtype"] == "bfloat16"
    assert Simulator(hardware="h100-sxm", **bf16_kv.simulator_kwargs()).kv_cache_dtype == "bfloat16"
    assert "kv_cache_dtype" not in load_manifest(EXAMPLE_MANIFEST).simulator_kwargs()  # auto: the priced dtype's
    with pytest.raises(ManifestError, match=r"engine\.kv_cache_dtype: got 'fp4'; allowed: 'auto', 'float32', "
                                            r"'bfloat16' or 'float16'"):
        load_manifest(EXAMPLE_MANIFEST, {"engine.kv_cache_dtype": "fp4"})
    assert bf16_kv.measured_llm_kwargs()["kv_cache_dtype"] == "bfloat16"  # the sweep's and the report's runner
    out = run_cli(["manifest", "--to-vllm", str(EXAMPLE_MANIFEST), "--kv-cache-dtype", "bfloat16"], capsys)
    assert vllm_flags(out)[1]["--kv-cache-dtype"] == "bfloat16"
    f16 = load_manifest(EXAMPLE_MANIFEST, {"engine.dtype": "float16", "engine.kv_cache_dtype": "float16"})
    assert f16.llm_kwargs()["dtype"] == f16.simulator_kwargs()["dtype"] == "float16"
    assert Simulator(hardware="h100-sxm", **f16.simulator_kwargs()).dtype == "float16"
    out = run_cli(["manifest", "--to-vllm", str(EXAMPLE_MANIFEST), "--dtype", "float16", "--kv-cache-dtype",
                   "float16"], capsys)
    assert vllm_flags(out)[1]["--dtype"] == "float16" and "--kv-cache-dtype" not in vllm_flags(out)[1]
    assert any(line.startswith("# engine.kv_cache_dtype: float16 has no --kv-cache-dtype value in vLLM")
               for line in out.splitlines())


def test_enforce_eager_reaches_the_engine_and_vllm(capsys):
    compiled = load_manifest(EXAMPLE_MANIFEST, {"engine.enforce_eager": False})
    assert compiled.llm_kwargs()["enforce_eager"] is False
    with pytest.raises(ManifestError, match=r"engine\.enforce_eager: measured runs run the model eagerly; got false"):
        compiled.measured_llm_kwargs()
    with pytest.raises(ManifestError, match=r"engine\.enforce_eager"):
        load_manifest(EXAMPLE_MANIFEST, {"engine.enforce_eager": "yes"})
    out = run_cli(["manifest", "--to-vllm", str(EXAMPLE_MANIFEST), "--enforce-eager", "true"], capsys)
    assert "--enforce-eager" in vllm_flags(out)[1]
    out = run_cli(["manifest", "--to-vllm", str(EXAMPLE_MANIFEST), "--enforce-eager", "false"], capsys)
    assert "--enforce-eager" not in vllm_flags(out)[1]  # vLLM's own default: it compiles


@pytest.mark.parametrize("overrides, knobs", [
    ({"api.admission.preempt": "swap"}, dict(preemption_mode="swap")),
    ({"api.admission.fairness": "none"}, dict(scheduling_policy="fcfs")),
    ({"scheduler.type": "static", "scheduler.prefill_budget_tokens": None, "scheduler.decode_batch_max_tokens": None,
      "api.admission.fairness": "none"}, dict(scheduling="static", max_num_batched_tokens=512)),
    ({"scheduler.decode_batch_max_tokens": None}, dict(max_num_batched_tokens=256 + 32)),  # + max_num_seqs
    ({"cache.allocation": "reserve_exact"}, dict(kv_allocation="contiguous_exact")),
    ({"cache.allocation": "reserve_max_model_len"}, dict(kv_allocation="contiguous")),
    ({"optional.speculative_decoding": {"draft_model": "self:8", "speculative_tokens": 3}},
     dict(speculative_method="draft_model", speculative_model="self:8", num_speculative_tokens=3)),
    ({"optional.speculative_decoding": {"draft_model": "[ngram]", "speculative_tokens": 4}},
     dict(speculative_method="ngram", speculative_model=None, num_speculative_tokens=4)),
])
def test_each_section_maps_onto_its_engine_knob(overrides, knobs):
    config = load_manifest(EXAMPLE_MANIFEST, overrides).engine_config()
    assert {knob: getattr(config, knob) for knob in knobs} == knobs


@pytest.mark.parametrize("change, expected", [
    (lambda m: m["engine"].update(gpu_count=2),  # an unknown key, with the keys that section takes
     ["engine.gpu_count: unknown key", "tensor_parallel_size", "served_model_name"]),
    (lambda m: m.update(observability={}), ["observability: unknown key", "scheduler", "metrics"]),
    (lambda m: m["api"]["request_limits"].update(max_num_seqs="32"),  # a wrong type: no coercion
     ["api.request_limits.max_num_seqs", "integer", "'32'"]),
    (lambda m: m["api"].update(stream="yes please"),  # a misspelled value, with every accepted one
     ["api.stream: got 'yes please'", "'incremental_tokens', 'whole_response', true or false"]),
    (lambda m: m["engine"].update(framework="vlm"), ["engine.framework: got 'vlm'", "'vllm' in any case"]),
    (lambda m: m["scheduler"].update(type="chunked-prefill"),
     ["scheduler.type: got 'chunked-prefill'", "'chunked_prefill', 'continuous' or 'static'"]),
    (lambda m: m["api"].update(protocol="grpc"), ["api.protocol: got 'grpc'", "'openai_compatible_http' or 'openai'"]),
    (lambda m: m.update(tenants={"acme": {"wieght": 2}}), ["tenants.acme.wieght: unknown key", "weight, max_num_seqs"]),
    (lambda m: m.update(tenants={"acme": {"weight": "2"}}), ["tenants.acme.weight", "'2'"]),
    (lambda m: m.update(tenants={"acme": {"weight": 0}}), ["tenants.acme.weight", "greater than 0"]),
    (lambda m: m["api"]["admission"].update(preempt="pause"),  # an unsupported value, with the allowed ones
     ["api.admission.preempt: got 'pause'", "'recompute' or 'swap'"]),
    (lambda m: m["cache"].update(block_table="radix"),
     ["cache.block_table: got 'radix'", "'per_sequence' or 'paged'"]),
    (lambda m: m["cache"].update(block_size_tokens=0), ["cache.block_size_tokens", "greater than or equal to 1"]),
    (lambda m: m["metrics"].append("gpu_temperature"), ["metrics[6]: got 'gpu_temperature'", "'kv_cache_utilization'"]),
    (lambda m: m["metrics"].append("inter_token_latency"), ["metrics", "repeated: inter_token_latency"]),
    (lambda m: m.pop("scheduler"), ["scheduler: missing"]),
    (lambda m: m.update(cache=16), ["cache: expected a section (keys: block_size_tokens,", "got 16"]),
])
def test_a_bad_manifest_fails_with_one_error_naming_the_key(tmp_path, change, expected):
    data = example()
    change(data)
    with pytest.raises(ManifestError) as error:
        load_manifest(write(tmp_path, data))
    message = str(error.value)
    assert all(part in message for part in expected), message
    assert "pydantic" not in message and error.value.__suppress_context__  # no library trace behind it


def test_values_the_engine_cannot_honour_name_their_key_and_the_simulator_prices_them():
    manifest = load_manifest(EXAMPLE_MANIFEST, {"engine.tensor_parallel_size": 4})
    with pytest.raises(ManifestError, match=r"engine\.tensor_parallel_size: 4 does not split the model's 9 "
                                            r"attention heads, 3 KV heads .*allowed: 1, 3; override with"):
        manifest.llm_kwargs()
    assert Simulator(hardware="h100-sxm", **manifest.simulator_kwargs()).tensor_parallel_size == 4
    tp3 = load_manifest(EXAMPLE_MANIFEST, {"engine.tensor_parallel_size": 3})
    assert tp3.llm_kwargs()["tensor_parallel_size"] == 3  # SmolLM2's 9 heads and 3 KV heads over 3 ranks
    with pytest.raises(ManifestError, match="measured runs run the engine in one process; got 3"):
        tp3.measured_llm_kwargs()
    with pytest.raises(ManifestError, match=r"engine\.tensor_parallel_size: int8 projections run on one rank"):
        load_manifest(EXAMPLE_MANIFEST, {"engine.tensor_parallel_size": 3, "engine.quantization": "int8"}).llm_kwargs()
    with pytest.raises(ManifestError, match=r"engine\.model: .*'llama-3.1-8b' is none of them"):
        load_manifest(EXAMPLE_MANIFEST, {"engine.model": "llama-3.1-8b"}).llm_kwargs()  # dims only: no weights
    with pytest.raises(ManifestError, match=r"engine\.model: the simulator does not know 'no/such-model'"):
        load_manifest(EXAMPLE_MANIFEST, {"engine.model": "no/such-model"}).simulator_kwargs()


def test_engine_config_refusals_name_the_manifest_key():
    static_with_budgets = load_manifest(EXAMPLE_MANIFEST, {"scheduler.type": "static", "api.admission.fairness": "none"})
    with pytest.raises(ManifestError, match=r"^scheduler\.prefill_budget_tokens: .*scheduling='continuous'"):
        static_with_budgets.engine_config()
    too_long = load_manifest(EXAMPLE_MANIFEST, {"api.request_limits.max_model_len": 9000})
    with pytest.raises(ManifestError, match=r"^api\.request_limits\.max_model_len: .*exceeds the model's"), \
            naming_keys():
        Simulator(hardware="local-cpu", **too_long.simulator_kwargs())


@pytest.mark.parametrize("text, expected", [
    ("engine: [unclosed", "not valid YAML"),
    ("- service: a list, not a mapping", "a manifest is a mapping of sections"),
    ("service: a\nengine:\n  model: x\n  model: y\n", "(?s)duplicate key 'model'.*line 4"),
])
def test_a_file_that_is_no_manifest_says_so(tmp_path, text, expected):
    path = tmp_path / "manifest.yaml"
    path.write_text(text)
    with pytest.raises(ManifestError, match=expected):
        load_manifest(path)


def test_flags_override_the_file_and_are_checked_like_it(tmp_path, capsys):
    out = run_cli(["manifest", "--to-vllm", str(EXAMPLE_MANIFEST), "--max-num-seqs", "8", "--block-size", "32",
                   "--tensor-parallel-size", "2", "--fairness", "none"], capsys)
    assert "--max-num-seqs 8 " in out and "--block-size 32 " in out and "--tensor-parallel-size 2 " in out
    assert "--scheduling-policy fcfs" in out and "--max-num-batched-tokens 288" in out
    with pytest.raises(SystemExit) as exit_:
        cli.main(["manifest", "--to-vllm", str(EXAMPLE_MANIFEST), "--max-num-seqs", "eight"])
    assert exit_.value.code == 2
    assert "api.request_limits.max_num_seqs: Input should be a valid integer, got 'eight'" in capsys.readouterr().err


def vllm_flags(command: str) -> tuple[str, dict[str, str | None]]:
    """The model and {flag: value or None} of the command's non-comment lines, parsed as a shell would."""
    lines = "\n".join(line for line in command.splitlines() if not line.startswith("#"))
    words = shlex.split(lines.replace("\\\n", ""))  # a backslash-newline continues the line
    assert words[:2] == ["vllm", "serve"]
    flags: dict[str, str | None] = {}
    for word in words[3:]:
        if word.startswith("--"):
            flags[word] = None
            last = word
        else:
            flags[last] = word
    return words[2], flags


@pytest.mark.parametrize("overrides", [
    {},
    {"api.admission.fairness": "none", "engine.trust_remote_code": True,
     "optional.speculative_decoding": {"draft_model": "[ngram]", "speculative_tokens": 4}},
    {"scheduler.type": "static", "scheduler.prefill_budget_tokens": None, "scheduler.decode_batch_max_tokens": None,
     "api.admission.fairness": "none", "api.request_limits.max_model_len": None, "engine.served_model_name": None},
    {"optional.speculative_decoding": {"draft_model": "self:8", "speculative_tokens": 4}},
])
def test_to_vllm_prints_only_vllm_flags_and_notes_what_has_no_twin(tmp_path, capsys, overrides):
    data = with_values(overrides)
    out = run_cli(["manifest", "--to-vllm", str(write(tmp_path, data))], capsys)
    model, flags = vllm_flags(out)
    assert model == data["engine"]["model"]
    assert set(flags) <= VLLM_SERVE_FLAGS, set(flags) - VLLM_SERVE_FLAGS
    for flag, choices in VLLM_CHOICES.items():
        assert flag not in flags or flags[flag] in choices
    notes = [line for line in out.splitlines() if line.startswith("# ")]
    if not overrides:  # the shipped manifest, flag for flag
        assert flags == {"--served-model-name": "smollm2", "--tensor-parallel-size": "1", "--max-model-len": "2048",
                         "--max-num-seqs": "32", "--block-size": "16", "--enable-chunked-prefill": None,
                         "--max-num-batched-tokens": "288", "--long-prefill-token-threshold": "256"}
    if data["api"]["admission"]["fairness"] == "per_tenant_budgets":
        assert any(n.startswith("# api.admission.fairness: per_tenant_budgets has no vLLM twin") for n in notes)
    if data["scheduler"]["type"] == "static":
        assert "--max-num-batched-tokens" not in flags and any("static has no vLLM twin" in n for n in notes)
    spec = data["optional"]["speculative_decoding"]
    if spec and spec["draft_model"] == "[ngram]":
        assert json.loads(flags["--speculative-config"]) == {"method": "ngram", "num_speculative_tokens": 4}
        assert "--trust-remote-code" in flags and flags["--trust-remote-code"] is None
    if spec and spec["draft_model"].startswith("self:"):
        assert "--speculative-config" not in flags and any("self:8" in n for n in notes)


def test_simulate_config_runs_a_small_workload_and_prints_the_manifest_metrics(capsys):
    out = run_cli(["simulate", "--config", str(EXAMPLE_MANIFEST), "--workload", "synthetic:8:64:16:20",
                   "--hardware", "local-cpu"], capsys)
    assert "SmolLM2-135M on local-cpu (tensor_parallel_size=1)" in out and "8 completed, 0 failed" in out
    for name, metric in MANIFEST_METRICS.items():
        assert f"  {name} " in out and metric.vllm_series in out
    tp2 = run_cli(["simulate", "--config", str(EXAMPLE_MANIFEST), "--workload", "synthetic:8:64:16",
                   "--hardware", "h100-sxm", "--model", "llama-3.1-8b", "--tensor-parallel-size", "2"], capsys)
    assert "Llama-3.1-8B on H100-SXM (tensor_parallel_size=2)" in tp2


def test_simulate_speculation_needs_an_acceptance_rate(tmp_path, capsys):
    argv = ["simulate", "--config", str(EXAMPLE_MANIFEST), "--workload", "synthetic:2:32:8", "--hardware",
            "local-cpu", "--num-speculative-tokens", "3"]
    with pytest.raises(SystemExit):  # speculative_tokens alone: the draft_model is missing
        cli.main(argv)
    assert "optional.speculative_decoding.draft_model: missing" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["simulate", "--config", str(EXAMPLE_MANIFEST), "--workload", "synthetic:2:32:8",
                  "--hardware", "local-cpu", "--acceptance-rate", "0.5"])
    assert "--acceptance-rate 0.5: prices optional.speculative_decoding" in capsys.readouterr().err
    speculating = write(tmp_path, with_values(
        {"optional.speculative_decoding": {"draft_model": "self:8", "speculative_tokens": 3}}))
    out = run_cli(["simulate", "--config", str(speculating), "--workload", "synthetic:2:32:8", "--hardware",
                   "local-cpu", "--acceptance-rate", "0.7"], capsys)
    assert "2 completed, 0 failed" in out


@pytest.mark.parametrize("spec, error", [
    ("poisson:8:64:16", "expected synthetic:NUM_REQUESTS:PROMPT_LEN:OUTPUT_LEN[:RATE]"),
    ("synthetic:8:64", "expected synthetic:"),
    ("synthetic:8:x:16", "PROMPT_LEN must be a positive integer or a range LO-HI, got 'x'"),
    ("synthetic:8:64-32:16", "PROMPT_LEN must be a positive integer or a range LO-HI, got '64-32'"),
    ("synthetic:8-9:64:16", "NUM_REQUESTS must be a positive integer, got '8-9'"),
    ("synthetic:0:64:16", "NUM_REQUESTS must be a positive integer"),
    ("synthetic:8:64:16:fast", "RATE must be a positive number"),
    ("synthetic:8:64:16:0", "RATE must be a positive number"),
    ("chat:8:3:64:32", "expected chat:NUM_CONVERSATIONS:TURNS:SYSTEM_LEN:USER_LEN:OUTPUT_LEN[:RATE] (got 4 fields"),
    ("chat:8:0:64:32:16", "TURNS must be a positive integer, got '0'"),
    ("chat:8:3:-1:32:16", "SYSTEM_LEN must be a non-negative integer, got '-1'"),
    ("chat:8:3:64:16-32:16", "USER_LEN must be a positive integer, got '16-32'"),
    ("chat:8:3:64:32:16:soon", "RATE must be a positive number"),
    ("trace:azure-conv-2023", "expected trace:NAME:NUM_REQUESTS[:RATE] (got 1 fields"),
    ("trace:sharegpt:8", "unknown trace 'sharegpt'; known: azure-conv-2023, azure-code-2023"),
    ("trace:azure-code-2023:0", "NUM_REQUESTS must be a positive integer"),
    ("copy:8:100:16", "PROMPT_LEN must be at least 128 (two 64-token passages"),
    ("copy:8:256", "expected copy:NUM_REQUESTS:PROMPT_LEN:OUTPUT_LEN[:RATE] (got 2 fields"),
    ("replay", "expected replay:TRACE[:TIME_SCALE[:NUM_REQUESTS]] (got 0 fields"),
    ("replay:azure-code-2023:10:5:1", "expected replay:TRACE[:TIME_SCALE[:NUM_REQUESTS]] (got 4 fields"),
    ("replay:sharegpt", "TRACE: unknown trace 'sharegpt': neither a file nor one of azure-conv-2023, azure-code-2023"),
    ("replay:azure-code-2023:0", "TIME_SCALE must be a positive number (10: ten times faster), got '0'"),
    ("replay:azure-code-2023:fast", "TIME_SCALE must be a positive number (10: ten times faster), got 'fast'"),
    ("replay:azure-code-2023:10:0", "NUM_REQUESTS must be a positive integer, got '0'"),
    ("replay:azure-code-2023:10:all", "NUM_REQUESTS must be a positive integer, got 'all'"),
    ("poisson:8", "or replay:TRACE[:TIME_SCALE[:NUM_REQUESTS]], each with [,tenants=NAME:SHARE,...] (unknown kind"),
])
def test_a_bad_workload_spec_shows_the_expected_form(spec, error):
    with pytest.raises(ValueError, match=re.escape(error)):
        parse_workload(spec)


def test_a_workload_spec_names_its_lengths_and_rate():
    workload = parse_workload("synthetic:5:64:16:2.5")
    assert [(r.prompt_len, r.output_len) for r in workload.requests] == [(64, 16)] * 5
    assert 0 < workload.requests[-1].arrival_time and parse_workload("synthetic:5:64:16").requests[-1].arrival_time == 0
    mixed = parse_workload("synthetic:50:32-1024:16-512:20")
    assert all(32 <= r.prompt_len <= 1024 and 16 <= r.output_len <= 512 for r in mixed.requests)
    assert len({r.prompt_len for r in mixed.requests}) > 10


def test_a_trace_spec_draws_a_published_trace_s_length_pairs():
    """Pairs, not two independent draws: every request's (prompt, output) is a row of the trace's sample,
    and over many draws the medians are the trace's (Splitwise, ISCA 2024: chat ~1,020 and ~130 tokens,
    code ~1,500 and ~13; the samples kept: 1,018 and 134, 1,399 and 14)."""
    chat = parse_workload("trace:azure-conv-2023:2000:10,tenants=a:1")
    pairs = set(trace_lengths("azure-conv-2023"))
    assert len(pairs) > 500 and all((r.prompt_len, r.output_len) in pairs for r in chat.requests)
    assert {r.tenant for r in chat.requests} == {"a"} and chat.requests[-1].arrival_time > 0
    assert 900 <= statistics.median(r.prompt_len for r in chat.requests) <= 1150
    assert 110 <= statistics.median(r.output_len for r in chat.requests) <= 160
    code = parse_workload("trace:azure-code-2023:2000")
    assert 1200 <= statistics.median(r.prompt_len for r in code.requests) <= 1600
    assert 10 <= statistics.median(r.output_len for r in code.requests) <= 18
    assert code.requests[-1].arrival_time == 0 and code == parse_workload("trace:azure-code-2023:2000")  # seeded


def test_a_replay_spec_plays_a_trace_s_arrivals_scaled_in_time():
    """By name, the whole trace at its own pace, or its first requests faster; a file in Azure's format too."""
    whole = parse_workload("replay:azure-conv-2023")
    assert len(whole) == 19_366 and whole.requests == Workload.replay("azure-conv-2023").requests
    fast = parse_workload("replay:azure-code-2023:10:1000,tenants=a:1", seed=3)
    assert fast.requests == Workload.replay("azure-code-2023", 10, 1000).with_tenant("a").requests
    assert fast.seed == 3 and 50 < fast.requests[-1].arrival_time < 55  # the first 1,000 requests: 521 s / 10
    looped = parse_workload("replay:azure-code-2023:1:9000")
    assert len(looped) == 9000 and looped.requests[8819].arrival_time > looped.requests[8818].arrival_time


def test_a_replay_spec_names_the_line_of_a_bad_trace_file(tmp_path):
    path = tmp_path / "mine.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,30,4\n2023-11-16 18:15:47.5,50,2\n")
    workload = parse_workload(f"replay:{path}:0.5")
    assert [(r.arrival_time, r.prompt_len, r.output_len) for r in workload.requests] == [(0, 30, 4), (3.0, 50, 2)]
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,30,4\n2023-11-16 18:15:47.5,50\n")
    with pytest.raises(ValueError, match=re.escape(f"workload 'replay:{path}': TRACE: {path}:3: expected 3 fields")):
        parse_workload(f"replay:{path}")


def test_a_chat_spec_replays_a_shared_system_prompt_and_growing_histories():
    workload = parse_workload("chat:3:2:40:8:4,tenants=a:1")
    assert [(r.prompt_len, r.output_len) for r in workload.requests] == [(48, 4)] * 3 + [(60, 4)] * 3
    assert {r.tenant for r in workload.requests} == {"a"} and workload.requests[-1].arrival_time == 0
    prompts = [r.prompt_token_ids for r in workload.make_requests(vocab_size=1000)]
    assert len({tuple(p[:40]) for p in prompts}) == 1  # one system prompt for every conversation
    assert len({tuple(p[:48]) for p in prompts[:3]}) == 3  # conversations differ after it
    assert all(prompts[3 + c][:48] == prompts[c] for c in range(3))  # turn 2 re-sends turn 1 as its prefix
    timed = parse_workload("chat:3:2:0:8:4:5")
    assert [r.prompt_len for r in timed.requests] == [8] * 3 + [20] * 3
    assert sorted(r.arrival_time for r in timed.requests) == [r.arrival_time for r in timed.requests] > [0.0] * 6


def test_a_copy_spec_repeats_one_passage_per_prompt():
    """Each prompt is its own 64-token passage written out again (and cut at PROMPT_LEN), so a model that copies
    gives prompt lookup drafts to accept; passages differ between prompts."""
    workload = parse_workload("copy:3:200:16:4")
    assert [(r.prompt_len, r.output_len) for r in workload.requests] == [(200, 16)] * 3
    assert 0 < workload.requests[0].arrival_time < workload.requests[-1].arrival_time
    prompts = [r.prompt_token_ids for r in workload.make_requests(vocab_size=1000)]
    assert all(len(p) == 200 and p[64:128] == p[:64] and p[192:] == p[:8] and len(set(p[:64])) > 40 for p in prompts)
    assert len({tuple(p[:64]) for p in prompts}) == 3 and workload == parse_workload("copy:3:200:16:4")


def test_the_readme_maps_the_six_metrics_onto_vllm_series():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## The deployment manifest", 1)[1].split("\n## ", 1)[0]
    rows = {line.split("|")[1].strip(" `"): line for line in section.splitlines() if line.startswith("| `")}
    for name, metric in MANIFEST_METRICS.items():
        assert metric.vllm_series.removeprefix("rate(").removesuffix(")") in rows[name], name


def test_the_engine_runs_a_manifest_on_a_model_folder(make_tiny_hf_model, device):
    from ref_engine import LLM, SamplingParams

    folder = make_tiny_hf_model("llama")
    manifest = load_manifest(EXAMPLE_MANIFEST, {"engine.model": str(folder), "api.request_limits.max_model_len": 128})
    llm = LLM(**manifest.llm_kwargs(), device=device)
    assert llm.llm_engine.config == manifest.engine_config().replace(max_model_len=128)
    out = llm.generate(["hello"], SamplingParams(max_tokens=4, temperature=0), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 4
    assert manifest.simulator_kwargs()["model"] == llm.llm_engine.arch  # the simulator prices the same dims


# ---- the client's manifest, byte for byte (issue #26) -------------------------------------------------

CLIENT = Path(__file__).parent / "data" / "client_deploy.yaml"


def test_the_client_manifest_becomes_a_complete_vllm_serve_command(capsys):
    out = run_cli(["manifest", "--to-vllm", str(CLIENT)], capsys)
    model, flags = vllm_flags(out)
    assert model == "organization/chat-model"
    assert flags == {"--served-model-name": "chat", "--tensor-parallel-size": "4", "--max-model-len": "32768",
                     "--max-num-seqs": "256", "--block-size": "16", "--enable-chunked-prefill": None,
                     "--max-num-batched-tokens": str(2048 + 256), "--long-prefill-token-threshold": "2048",
                     "--speculative-config": flags["--speculative-config"]}
    assert json.loads(flags["--speculative-config"]) == {"model": "organization/chat-draft-model",
                                                         "num_speculative_tokens": 5}
    assert set(flags) <= VLLM_SERVE_FLAGS
    notes = [line for line in out.splitlines() if line.startswith("# ")]
    assert "vLLM v0.11" in notes[0] and "99d7eb5d" in notes[0]  # the release the flags were checked against
    # every key without a flag of its own has a comment line saying what vLLM does with it
    for key in ("service", "engine.framework", "engine.trust_remote_code", "api.protocol", "api.stream",
                "api.admission.preempt", "api.admission.fairness", "cache.block_table", "cache.allocation",
                "scheduler.prefill_budget_tokens", "scheduler.decode_batch_max_tokens",
                "optional.speculative_decoding", "metrics"):
        assert any(note.startswith(f"# {key}: ") for note in notes), key
    assert any("decode tokens per step (a row with k drafts counts 1 + k)" in note for note in notes)


@pytest.mark.parametrize("overrides, expected", [
    ({}, dict(scheduling="continuous", enable_chunked_prefill=True, max_num_batched_tokens=2048 + 256,
              scheduling_policy="fair", kv_allocation="paged", speculative_method="draft_model")),
    ({"engine.framework": "vllm", "api.protocol": "openai", "cache.block_table": "paged"}, {}),  # extra names
    ({"scheduler.type": "continuous", "scheduler.prefill_budget_tokens": None},  # lesson 3's baseline
     dict(scheduling="continuous", enable_chunked_prefill=False, max_num_batched_tokens=32768 + 256)),
    ({"scheduler.type": "static", "scheduler.prefill_budget_tokens": None, "scheduler.decode_batch_max_tokens": None,
      "api.admission.fairness": "none", "optional.speculative_decoding": None},
     dict(scheduling="static", speculative_method=None)),
])
def test_the_client_values_mean_what_they_say(overrides, expected):
    config = load_manifest(CLIENT, overrides).engine_config()
    assert {knob: getattr(config, knob) for knob in expected} == expected


@pytest.mark.parametrize("stream, streaming", [("incremental_tokens", True), ("whole_response", False),
                                               (True, True), (False, False)])
def test_api_stream_takes_the_client_value_a_documented_off_value_and_booleans(stream, streaming):
    assert load_manifest(CLIENT, {"api.stream": stream}).api.streaming is streaming


def test_continuous_without_chunking_refuses_a_prefill_budget_naming_the_key():
    with pytest.raises(ManifestError, match=r"^scheduler\.prefill_budget_tokens: 2048 cuts prompts into chunks.*"
                                            r"use chunked_prefill"):
        load_manifest(CLIENT, {"scheduler.type": "continuous"}).engine_config()
    out = load_manifest(CLIENT, {"scheduler.type": "continuous", "scheduler.prefill_budget_tokens": None})
    from serving_lab.vllm_command import vllm_serve_command

    assert "--no-enable-chunked-prefill" in vllm_flags(vllm_serve_command(out))[1]


def test_the_engine_lists_every_key_it_cannot_run_with_its_override():
    with pytest.raises(ManifestError) as error:
        load_manifest(CLIENT).llm_kwargs()
    lines = str(error.value).splitlines()
    assert lines[0] == "4 keys the engine cannot run on this machine:"
    expected = {"engine.model": "--model", "engine.tensor_parallel_size": "--tensor-parallel-size 1",
                "api.request_limits.max_model_len": "--max-model-len 8192",
                "optional.speculative_decoding.draft_model": "--speculative-model"}
    assert {line.strip().split(":")[0]: line for line in lines[1:]}.keys() == expected.keys()
    for line in lines[1:]:
        key = line.strip().split(":")[0]
        assert f"override with {expected[key]}" in line, line
    honoured = load_manifest(CLIENT, {"engine.model": "HuggingFaceTB/SmolLM2-135M-Instruct",
                                      "api.request_limits.max_model_len": 2048, "engine.tensor_parallel_size": 1,
                                      "optional.speculative_decoding.draft_model": "[ngram]"})
    assert honoured.llm_kwargs()["config"].speculative_method == "ngram"


def test_simulate_names_an_unknown_model_and_offers_a_known_one_or_a_config_json(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["simulate", "--config", str(CLIENT), "--workload", "synthetic:4:64:8", "--hardware", "h100-sxm"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "engine.model: the simulator does not know 'organization/chat-model'" in err
    assert "--model NAME" in err and "llama-3.1-70b" in err and "config.json" in err


def test_simulate_names_an_unknown_model_before_any_word_on_calibration(monkeypatch, tmp_path, recwarn, capsys):
    """Without --hardware and with no calibrated profile saved, the unknown model is the one thing said."""
    monkeypatch.setenv("SERVING_LAB_CACHE", str(tmp_path))
    with pytest.raises(SystemExit) as exit_:
        cli.main(["simulate", "--config", str(CLIENT), "--workload", "synthetic:4:64:8"])
    assert exit_.value.code == 2
    assert [str(w.message) for w in recwarn] == []
    assert "engine.model: the simulator does not know" in capsys.readouterr().err


def test_simulate_runs_the_client_manifest_at_tp4_as_written(capsys):
    argv = ["simulate", "--config", str(CLIENT), "--workload", "synthetic:8:256:16", "--model", "llama-3.1-70b",
            "--hardware", "h100-sxm"]
    out = run_cli(argv, capsys)
    assert "text-generation: Llama-3.1-70B on H100-SXM (tensor_parallel_size=4)" in out
    assert "8 completed, 0 failed" in out
    assert "optional.speculative_decoding: not priced (no acceptance rate" in out  # said, not silently dropped
    with pytest.raises(SystemExit):  # an acceptance rate prices the drafts, which needs the draft's dimensions
        cli.main([*argv, "--acceptance-rate", "0.7"])
    assert "optional.speculative_decoding.draft_model: the simulator does not know" in capsys.readouterr().err
    priced = run_cli([*argv, "--acceptance-rate", "0.7", "--speculative-model", "llama-3.1-8b"], capsys)
    assert "8 completed, 0 failed" in priced and "not priced" not in priced


def test_a_config_json_names_the_dimensions_the_simulator_prices(make_tiny_hf_model, capsys):
    config_json = make_tiny_hf_model("llama", name="manifest-config-json") / "config.json"
    manifest = load_manifest(CLIENT, {"engine.model": str(config_json)})
    arch = manifest.simulator_kwargs(speculation=False)["model"]
    assert (arch.hidden_size, arch.num_layers) == (json.loads(config_json.read_text())["hidden_size"],
                                                   json.loads(config_json.read_text())["num_hidden_layers"])


def test_simulate_refuses_prompts_longer_than_max_model_len(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["simulate", "--config", str(EXAMPLE_MANIFEST), "--workload", "synthetic:64:128:8",
                  "--hardware", "local-cpu", "--max-model-len", "100"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "64 of 64 prompts have up to 128 tokens, and max_model_len (100)" in err and "nan" not in err


# ---- tenants ----------------------------------------------------------------------------------------


def with_tenants(tmp_path: Path, tenants: dict[str, Any], fairness: str = "per_tenant_budgets") -> Path:
    data = with_values({"api.admission.fairness": fairness})
    data["tenants"] = tenants
    return write(tmp_path, data)


def test_the_tenants_section_becomes_tenant_policies_and_engine_knobs(tmp_path):
    from ref_engine.entrypoints.openai.tenants import TenantPolicy

    path = with_tenants(tmp_path, {"acme": {"weight": 3, "max_num_seqs": 8, "max_pending_requests": 16,
                                            "token_budget": 100_000, "budget_window_s": 30},
                                   "beta": {}})
    manifest = load_manifest(path)
    assert manifest.tenant_policies() == {
        "acme": TenantPolicy(weight=3.0, max_num_seqs=8, max_pending_requests=16, token_budget=100_000,
                             budget_window_s=30.0),
        "beta": TenantPolicy()}
    config = manifest.engine_config()
    assert dict(config.tenant_weights) == {"acme": 3.0, "beta": 1.0}
    assert dict(config.tenant_max_num_seqs) == {"acme": 8}
    assert load_manifest(CLIENT).tenant_policies() == {}  # the client's file stays valid without the section
    unfair = load_manifest(with_tenants(tmp_path, {"acme": {"weight": 3}}, fairness="none")).engine_config()
    assert unfair.tenant_weights is None  # weights mean something only under per_tenant_budgets


def test_a_workload_spec_carries_a_tenant_mix():
    workload = parse_workload("synthetic:8:16:4,tenants=a:3,b:1")
    assert [r.tenant for r in workload.requests] == ["a", "a", "b", "a", "a", "a", "b", "a"]
    assert [r.tenant for r in parse_workload("synthetic:8:16:4:2").requests] == [None] * 8
    assert parse_workload("synthetic:8:16:4:2,tenants=x:1").requests[0].tenant == "x"


@pytest.mark.parametrize("spec, error", [
    ("synthetic:8:16:4,users=a:1", "after the lengths comes only tenants=NAME:SHARE"),
    ("synthetic:8:16:4,tenants=a:0", "each tenant is NAME:SHARE.*got 'a:0'"),
    ("synthetic:8:16:4,tenants=a:1,a:2", "distinct name.*got 'a:2'"),
    ("synthetic:8:16:4,tenants=:1", "got ':1'"),
])
def test_a_bad_tenant_mix_shows_the_expected_form(spec, error):
    with pytest.raises(ValueError, match=error):
        parse_workload(spec)


def tenant_shares(out: str) -> dict[str, float]:
    """tenant -> service share (%) from `simulate`'s per-tenant rows."""
    rows = out.split("per tenant", 1)[1].splitlines()[2:]
    return {row.split()[0]: float(row.split()[2].rstrip("%")) for row in rows if row.strip()}


def test_simulate_prints_per_tenant_rows_that_fairness_changes(tmp_path, capsys):
    argv = ["simulate", "--workload", "synthetic:48:64:32,tenants=a:3,b:1", "--hardware", "local-cpu",
            "--max-num-seqs", "2"]
    fair = run_cli([*argv, "--config", str(with_tenants(tmp_path, {"a": {"weight": 1}, "b": {"weight": 1}}))], capsys)
    assert "per tenant (api.admission.fairness: per_tenant_budgets" in fair
    assert "weight share" in fair and "mean TTFT ms" in fair
    fcfs = run_cli([*argv, "--config", str(with_tenants(tmp_path, {"a": {}, "b": {}}, fairness="none"))], capsys)
    # first come, first served hands b its traffic's quarter; equal weights hand it about half
    assert tenant_shares(fcfs)["b"] < 35 < 40 < tenant_shares(fair)["b"]


def test_simulate_with_vllms_engine_profile_adds_its_step_time(capsys):
    base = ["simulate", "--config", str(EXAMPLE_MANIFEST), "--workload", "synthetic:8:64:16", "--hardware", "h100-sxm"]
    itl = {}
    for extra in ([], ["--engine", "vllm"]):
        out = run_cli(base + extra, capsys)
        itl[bool(extra)] = float(next(line for line in out.splitlines() if "inter_token_latency" in line).split()[2])
    assert itl[True] - itl[False] == pytest.approx(1.15, abs=0.01)  # ms: sim/engine_profile.py's constant
