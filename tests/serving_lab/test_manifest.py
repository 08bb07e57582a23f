"""The deployment manifest: the shipped file builds the expected configuration, every mistake names its key,
flags win over the file, `--to-vllm` speaks only vLLM's real flags, and `simulate --config` runs."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any, get_args

import pytest
import yaml

from ref_engine.core.config import EngineConfig
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
# (vllm/engine/arg_utils.py, github.com/vllm-project/vllm at commit 99d7eb5d6a512cfcc5a2b104f24ebf2d6cda772b),
# with the choices of those that take a fixed set (`SchedulerPolicy = Literal["fcfs", "priority"]`).
VLLM_SERVE_FLAGS = {
    "--served-model-name", "--trust-remote-code", "--tensor-parallel-size", "--max-model-len", "--max-num-seqs",
    "--block-size", "--enable-chunked-prefill", "--max-num-batched-tokens", "--long-prefill-token-threshold",
    "--scheduling-policy", "--speculative-config", "--dtype", "--enforce-eager",
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
                                     "kv_cache_dtype": "auto", "enforce_eager": True}  # null: the engine's eager


def test_numerics_reach_the_engine_the_simulator_and_vllm(tmp_path, capsys):
    bf16 = load_manifest(EXAMPLE_MANIFEST, {"engine.dtype": "bfloat16"})
    assert bf16.llm_kwargs()["dtype"] == "bfloat16" and bf16.simulator_kwargs()["dtype"] == "bfloat16"
    assert Simulator(hardware="h100-sxm", **bf16.simulator_kwargs()).dtype == "bfloat16"
    int8 = load_manifest(EXAMPLE_MANIFEST, {"engine.quantization": "int8"})
    assert (int8.llm_kwargs()["dtype"], int8.llm_kwargs()["quantization"]) == ("float32", "int8")
    assert int8.simulator_kwargs()["dtype"] == "int8"  # 8-bit weights: what the simulator prices
    with pytest.raises(ManifestError, match=r"engine\.quantization: int8 computes in float32.*'bfloat16'"):
        load_manifest(EXAMPLE_MANIFEST, {"engine.quantization": "int8", "engine.dtype": "bfloat16"}).llm_kwargs()
    with pytest.raises(ManifestError, match=r"engine\.quantization: got 'int4'; allowed: 'int8'"):
        load_manifest(EXAMPLE_MANIFEST, {"engine.quantization": "int4"})
    out = run_cli(["manifest", "--to-vllm", str(EXAMPLE_MANIFEST), "--dtype", "bfloat16", "--quantization", "int8"],
                  capsys)
    assert vllm_flags(out)[1]["--dtype"] == "bfloat16"
    assert any(line.startswith("# engine.quantization: int8") for line in out.splitlines())
    bf16_kv = load_manifest(EXAMPLE_MANIFEST, {"engine.kv_cache_dtype": "bfloat16"})
    assert bf16_kv.llm_kwargs()["kv_cache_dtype"] == bf16_kv.simulator_kwargs()["kv_cache_dtype"] == "bfloat16"
    assert Simulator(hardware="h100-sxm", **bf16_kv.simulator_kwargs()).kv_cache_dtype == "bfloat16"
    assert "kv_cache_dtype" not in load_manifest(EXAMPLE_MANIFEST).simulator_kwargs()  # auto: the priced dtype's
    with pytest.raises(ManifestError, match=r"engine\.kv_cache_dtype: got 'fp4'; allowed: 'auto', 'float32' or 'bfloat16'"):
        load_manifest(EXAMPLE_MANIFEST, {"engine.kv_cache_dtype": "fp4"})
    with pytest.raises(ManifestError, match=r"engine\.kv_cache_dtype: measured runs keep the KV cache in the model"):
        bf16_kv.measured_llm_kwargs()  # the sweep's and the report's runner: refused, not ignored
    out = run_cli(["manifest", "--to-vllm", str(EXAMPLE_MANIFEST), "--kv-cache-dtype", "bfloat16"], capsys)
    assert vllm_flags(out)[1]["--kv-cache-dtype"] == "bfloat16"


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
    (lambda m: m["api"].update(stream="yes please"), ["api.stream", "boolean"]),
    (lambda m: m["api"]["admission"].update(preempt="pause"),  # an unsupported value, with the allowed ones
     ["api.admission.preempt: got 'pause'", "'recompute' or 'swap'"]),
    (lambda m: m["cache"].update(block_table="radix"), ["cache.block_table: got 'radix'", "'paged'"]),
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
    with pytest.raises(ManifestError, match=r"engine\.tensor_parallel_size: .*allowed: 1, got 4"):
        manifest.llm_kwargs()
    assert Simulator(hardware="h100-sxm", **manifest.simulator_kwargs()).tensor_parallel_size == 4
    with pytest.raises(ManifestError, match=r"engine\.model: .*'llama-3.1-8b' is none of them"):
        load_manifest(EXAMPLE_MANIFEST, {"engine.model": "llama-3.1-8b"}).llm_kwargs()  # dims only: no weights
    with pytest.raises(ManifestError, match=r"engine\.model: the simulator prices"):
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
    assert "--acceptance-rate A" in capsys.readouterr().err
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
])
def test_a_bad_workload_spec_shows_the_expected_form(spec, error):
    with pytest.raises(ValueError, match=error.replace("[", r"\[")):
        parse_workload(spec)


def test_a_workload_spec_names_its_lengths_and_rate():
    workload = parse_workload("synthetic:5:64:16:2.5")
    assert [(r.prompt_len, r.output_len) for r in workload.requests] == [(64, 16)] * 5
    assert 0 < workload.requests[-1].arrival_time and parse_workload("synthetic:5:64:16").requests[-1].arrival_time == 0
    mixed = parse_workload("synthetic:50:32-1024:16-512:20")
    assert all(32 <= r.prompt_len <= 1024 and 16 <= r.output_len <= 512 for r in mixed.requests)
    assert len({r.prompt_len for r in mixed.requests}) > 10


def test_the_readme_maps_the_six_metrics_onto_vllm_series():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## The deployment manifest", 1)[1].split("\n## ", 1)[0]
    rows = {line.split("|")[1].strip(" `"): line for line in section.splitlines() if line.startswith("| `")}
    for name, metric in MANIFEST_METRICS.items():
        assert metric.vllm_series.removeprefix("rate(").removesuffix(")") in rows[name], name


def test_the_engine_runs_a_manifest_on_a_model_folder(make_tiny_hf_model):
    from ref_engine import LLM, SamplingParams

    folder = make_tiny_hf_model("llama")
    manifest = load_manifest(EXAMPLE_MANIFEST, {"engine.model": str(folder), "api.request_limits.max_model_len": 128})
    llm = LLM(**manifest.llm_kwargs())
    assert llm.llm_engine.config == manifest.engine_config().replace(max_model_len=128)
    out = llm.generate(["hello"], SamplingParams(max_tokens=4, temperature=0), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 4
    assert manifest.simulator_kwargs()["model"] == llm.llm_engine.arch  # the simulator prices the same dims
