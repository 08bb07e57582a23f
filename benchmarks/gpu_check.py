"""The reference engine on a GPU, checked in one run for the first GPU that is lent (issue #29).

    python benchmarks/gpu_check.py [--only NAME ...] [--budget NAME=SECONDS ...] [--out DIR] [--list]

Assumes a CUDA build of torch and one GPU. On a machine without one it says so and exits 0: nothing here
can be checked on a CPU (the CPU side is what the test suite checks). The checks, in order, each a
function that returns a `CheckResult` (passed, failed or skipped, its numbers and a line of detail), each
run under a time budget (`CHECKS`; under 8 minutes in all; `--budget` gives one more, e.g. the notebooks
run alone), one that raises or overruns recorded as failed while the others still run:

- `parity`: SmolLM2's greedy outputs on CUDA equal transformers' on CUDA for the parity prompts (those of
  tests/engine/test_model_parity.py), in float32 and bfloat16; batched equals solo; CUDA graphs
  (`enforce_eager=False`) equal eager. float32 must hold token for token; bfloat16's agreement is reported
  (on the course CPU 3 of 5 prompts equal transformers', and batched and compiled runs differ from solo and eager);
- `two_engines`: two engines one after another in one process (the first's memory comes back to the second);
- `disaggregated_pair`: the prefill/decode pair on one device, 0.45 of its memory each, equals one engine;
- `calibration`: the device's copy bandwidth and matmul rates against its datasheet profile
  (sim/hardware.py), and the calibration fit's error against `MAX_FIT_MEAN_ERROR_PCT`;
- `simulator_vs_engine`: the simulator (on the calibrated profile) against measured throughput for notebook
  01's static-vs-continuous workload, notebook 04's shared-prefix workload and notebook 05's prompt-lookup
  workload, at the notebooks' full (GPU) sizes, side by side with the error;
- `decode_floor`: single-stream decode tokens/s and the batch-64 decode step time against the floor the
  device's datasheet memory bandwidth sets (every step reads the weights and the KV cache once);
- `engine_tests`: tests/engine with `--device cuda`;
- `notebooks`: the notebooks in full mode (SERVING_LAB_MODE=full) under nbval.

Writes gpu_check.json (every row) and gpu_check.md (a section for benchmarks/RESULTS.md) into `--out`
(default: $OUT when set, else benchmarks/). A check, not a benchmark of record: its numbers are one run's.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
STATUSES = ("passed", "failed", "skipped")
MEMORY_SHARE_PER_ROLE = 0.45  # of the one device, for each engine of the disaggregated pair
PARITY_TOKENS = 32  # greedy tokens per parity prompt, as tests/engine/test_model_parity.py decodes
ENGINE_TESTS_S, NOTEBOOKS_S = 80, 85  # the budgets of the two pytest runs (CHECKS)


@dataclass
class CheckResult:
    """One row of the report."""

    name: str
    status: str  # one of STATUSES
    numbers: dict[str, Any] = field(default_factory=dict)
    detail: str = ""
    seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"check {self.name!r}: status must be one of {STATUSES}, got {self.status!r}")


@dataclass(frozen=True)
class Check:
    """A named check: a function of the shared `Context` that returns its row."""

    name: str
    run: Callable[[Context], CheckResult]
    budget_s: float  # the check is stopped and recorded as failed past this


class CheckTimeout(Exception):
    """A check ran past its budget."""


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise `CheckTimeout` in this (the main) thread once `seconds` have passed, at the next Python bytecode:
    a check stuck inside one long CUDA call is stopped when it returns."""
    def expire(signum: int, frame: Any) -> None:
        raise CheckTimeout(f"ran past its budget of {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_checks(checks: Sequence[Check], context: Any) -> list[CheckResult]:
    """Each check under its budget; one that raises (or overruns) is a failed row, and the next one runs."""
    results = []
    for check in checks:
        start = time.perf_counter()
        try:
            with time_limit(check.budget_s):
                result = check.run(context)
        except Exception as error:  # noqa: BLE001 (any failure is this check's row, not the run's end)
            result = CheckResult(check.name, "failed", detail=f"{type(error).__name__}: {error}")
        result.seconds = round(time.perf_counter() - start, 1)
        results.append(result)
        print(f"{result.name}: {result.status} ({result.seconds:g} s) {result.detail}", flush=True)
        release_device_memory()
    return results


def release_device_memory() -> None:
    """What one check's engines held goes back before the next starts (a no-op without torch's CUDA)."""
    gc.collect()
    if "torch" in sys.modules and sys.modules["torch"].cuda.is_available():
        sys.modules["torch"].cuda.empty_cache()


# ---- the report ----


def report_json(results: Sequence[CheckResult], machine: dict[str, Any]) -> dict[str, Any]:
    return {"machine": machine, "results": [asdict(r) for r in results],
            "summary": {status: sum(r.status == status for r in results) for status in STATUSES}}


def report_markdown(results: Sequence[CheckResult], machine: dict[str, Any]) -> str:
    """A section for benchmarks/RESULTS.md: the machine, then one table row per check."""
    summary = ", ".join(f"{n} {status}" for status, n in report_json(results, machine)["summary"].items())
    lines = ["## The reference engine on a GPU: `gpu_check.py` (issue 29)", "",
             f"{machine.get('date', '')}, {machine.get('device', '?')}, torch {machine.get('torch', '?')}, "
             f"`python benchmarks/gpu_check.py`: {summary}.", "",
             "| check | status | seconds | numbers | detail |", "| --- | --- | --- | --- | --- |"]
    for r in results:
        numbers = "; ".join(f"{k} {_number(v)}" for k, v in r.numbers.items())
        lines.append(f"| {r.name} | {r.status} | {r.seconds:g} | {_cell(numbers)} | {_cell(r.detail)} |")
    return "\n".join(lines) + "\n"


def _number(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _cell(text: str) -> str:
    """`text` inside a Markdown table cell: a bare | would end the cell."""
    return text.replace("|", "\\|")


def write_report(results: Sequence[CheckResult], machine: dict[str, Any], out: Path) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out / "gpu_check.json", out / "gpu_check.md"
    json_path.write_text(json.dumps(report_json(results, machine), indent=2) + "\n")
    md_path.write_text(report_markdown(results, machine))
    return json_path, md_path


# ---- what the checks share ----


class Context:
    """The device, SmolLM2 and this device's calibrated profile, each made once, when a check first asks;
    `budgets`: the seconds `--budget` gave checks (the pytest runs pass theirs on)."""

    device = "cuda"

    def __init__(self, budgets: dict[str, float] | None = None) -> None:
        self.budgets = budgets or {}

    @cached_property
    def model(self) -> Any:
        from ref_engine.model.loader import load_model

        return load_model(None, dtype="float32", device=self.device)

    @cached_property
    def calibrated(self) -> Any:
        """This device's profile, fitted now and not saved (the user's cache is left as it is)."""
        from serving_lab.calibrate import calibrate

        return calibrate(self.model, save=False, verbose=False)

    @cached_property
    def datasheet(self) -> Any:
        return datasheet_profile(self.machine["device"])

    @cached_property
    def machine(self) -> dict[str, Any]:
        import torch

        return {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "cuda": torch.version.cuda,
                "python": platform.python_version(), "date": datetime.datetime.now(datetime.timezone.utc)
                .isoformat(timespec="minutes")}


def datasheet_profile(device_name: str) -> Any:
    """The built-in datasheet profile of a GPU named as torch names it ("NVIDIA H200"), None for another."""
    from sim.hardware import HardwareProfile

    for key, name in (("h200", "h200"), ("h100", "h100-sxm"), ("a100", "a100-80gb-sxm"), ("l40s", "l40s"),
                      ("b200", "b200")):
        if key in device_name.lower():
            return HardwareProfile.named(name)
    return None


def greedy(max_tokens: int = PARITY_TOKENS) -> Any:
    from ref_engine import SamplingParams

    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def greedy_tokens(llm: Any, prompts: list[Any], max_tokens: int = PARITY_TOKENS) -> list[list[int]]:
    """An `LLM`'s greedy token ids for each prompt."""
    return token_ids(llm.generate(prompts, greedy(max_tokens), use_tqdm=False))


def token_ids(outputs: Sequence[Any]) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in outputs]


def parity_prompts(tokenizer: Any) -> list[list[int]]:
    """The prompts tests/engine/test_model_parity.py holds SmolLM2 to against transformers, token for token."""
    if str(ROOT / "tests" / "engine") not in sys.path:
        sys.path.insert(0, str(ROOT / "tests" / "engine"))
    from test_model_parity import SMOLLM2_CHATS, SMOLLM2_RAW

    return ([tokenizer.encode(tokenizer.apply_chat_template(chat)) for chat in SMOLLM2_CHATS]
            + [tokenizer.encode(text) for text in SMOLLM2_RAW])


# ---- the checks ----


def check_parity(ctx: Context) -> CheckResult:
    import torch
    import transformers

    from ref_engine import LLM
    from ref_engine.model.store import default_model_path

    path = default_model_path()
    prompts = parity_prompts(ctx.model.tokenizer)
    numbers: dict[str, Any] = {}
    failures = []
    for dtype in ("float32", "bfloat16"):
        hf = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                               dtype=getattr(torch, dtype)).to(ctx.device).eval()
        hf.generation_config.eos_token_id = None  # decode exactly PARITY_TOKENS, as the engine's ignore_eos
        hf.generation_config.pad_token_id = 0
        expected = []
        with torch.inference_mode():
            for p in prompts:
                ids = torch.tensor([p], device=ctx.device)
                out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=PARITY_TOKENS,
                                  do_sample=False)
                expected.append(out[0, len(p):].tolist())
        del hf
        release_device_memory()
        with LLM(path, dtype=dtype, device=ctx.device, num_kv_blocks=512) as llm:
            batched = greedy_tokens(llm, prompts)
            solo = [greedy_tokens(llm, [p])[0] for p in prompts]
        with LLM(path, dtype=dtype, device=ctx.device, num_kv_blocks=512, enforce_eager=False) as llm:
            graphs = greedy_tokens(llm, prompts)
        for what, got, want in (("= transformers", batched, expected), ("batched = solo", batched, solo),
                                ("graphs = eager", graphs, batched)):
            same = sum(a == b for a, b in zip(got, want))
            numbers[f"{dtype} {what}"] = f"{same}/{len(prompts)}"
            if same < len(prompts):
                failures.append(f"{dtype} {what}")
    # float32 is the reference held token for token; bfloat16 rounds differently in another kernel, batch
    # shape or implementation, so its mismatches are reported, and fail nothing
    exact = [f for f in failures if f.startswith("float32")]
    detail = ("token for token" if not failures else "not token for token: " + ", ".join(failures))
    return CheckResult("parity", "failed" if exact else "passed", numbers, detail)


def check_two_engines(ctx: Context) -> CheckResult:
    import torch

    from ref_engine import LLM

    prompts = parity_prompts(ctx.model.tokenizer)
    baseline = torch.cuda.memory_allocated()
    outputs, blocks = [], []
    for _ in range(2):  # each takes gpu_memory_utilization of the device: the second needs the first's back
        llm = LLM(ctx.model)
        outputs.append(greedy_tokens(llm, prompts))
        blocks.append(llm.llm_engine.num_kv_blocks)
        llm.shutdown()
        del llm
        release_device_memory()
    left = torch.cuda.memory_allocated() - baseline
    numbers = {"kv blocks, first": blocks[0], "kv blocks, second": blocks[1], "MiB left after both": left / 2**20}
    ok = outputs[0] == outputs[1] and blocks[1] >= 0.95 * blocks[0]
    return CheckResult("two_engines", "passed" if ok else "failed", numbers,
                       "same outputs, the second pool as large as the first" if ok else
                       "the second engine's outputs or pool differ from the first's")


def check_disaggregated_pair(ctx: Context) -> CheckResult:
    from core.config import EngineConfig
    from ref_engine import LLM
    from ref_engine.disagg.llm import DisaggregatedLLM
    from ref_engine.model.store import default_model_path

    path = str(default_model_path())
    prompts = parity_prompts(ctx.model.tokenizer)
    with LLM(ctx.model, num_kv_blocks=512) as llm:
        expected = greedy_tokens(llm, prompts)
    release_device_memory()
    share = EngineConfig(gpu_memory_utilization=MEMORY_SHARE_PER_ROLE)
    try:
        pair = DisaggregatedLLM(path, share, share, device=ctx.device)
    except TypeError as error:  # a constructor without per-role knobs
        return CheckResult("disaggregated_pair", "skipped", detail=f"needs per-role device memory knobs: {error}")
    with pair:
        got = token_ids(pair.generate(prompts, greedy()))
    ok = got == expected
    return CheckResult("disaggregated_pair", "passed" if ok else "failed",
                       {"memory share per role": MEMORY_SHARE_PER_ROLE},
                       "equals one engine token for token" if ok else "outputs differ from one engine's")


def check_calibration(ctx: Context) -> CheckResult:
    import torch

    from serving_lab.calibrate import (
        MAX_FIT_MEAN_ERROR_PCT,
        CalibrationError,
        check_fit_error,
        measure_copy_bandwidth,
        measure_matmul_rate,
    )

    sheet = ctx.datasheet
    numbers: dict[str, Any] = {"copy GB/s": measure_copy_bandwidth(ctx.device, num_bytes=1 << 30) / 1e9}
    for dtype in ("float32", "bfloat16"):
        numbers[f"matmul {dtype} TFLOP/s"] = measure_matmul_rate(ctx.device, getattr(torch, dtype), n=8192) / 1e12
    if sheet is not None:
        numbers["copy / datasheet"] = numbers["copy GB/s"] * 1e9 / sheet.memory_bandwidth
        for dtype in ("float32", "bfloat16"):
            numbers[f"matmul {dtype} / datasheet"] = numbers[f"matmul {dtype} TFLOP/s"] * 1e12 / sheet.flops_for(dtype)
    profile = ctx.calibrated
    numbers["fit mean abs error %"] = profile.provenance["fit_mean_abs_error_pct"]
    numbers["profile memory GiB"] = profile.memory_bytes / 2**30
    try:
        check_fit_error(profile)
    except CalibrationError as error:
        return CheckResult("calibration", "failed", numbers, str(error))
    physical = sheet is None or all(numbers[k] <= 1.0 for k in numbers if k.endswith("/ datasheet"))
    problems = ([] if physical else ["a rate above the datasheet's: a timing is not synchronised"]) + (
        [] if profile.memory_bytes > 0 else ["the profile records no device memory: it cannot size a pool"])
    detail = "; ".join([f"fit within {MAX_FIT_MEAN_ERROR_PCT:g}%",
                        "no datasheet profile for this device" if sheet is None else f"rates against {sheet.name}'s "
                        "datasheet", *problems])
    return CheckResult("calibration", "failed" if problems else "passed", numbers, detail)


def check_simulator_vs_engine(ctx: Context) -> CheckResult:
    """The notebooks' full-mode engine workloads (01, 04, 05), with fewer caps, prefix lengths and repeats to fit
    the budget (01's longest cap alone, 1536 tokens under static batching, would take most of it)."""
    import course.prefix_caching as prefix
    import course.speculative_decoding as speculative
    from core import EngineConfig
    from course.continuous_batching import static_vs_continuous
    from serving_lab.pairing import Sides, pairs

    here = Sides(model=ctx.model, hardware=ctx.calibrated)
    rows = static_vs_continuous([128, 512], here, num_requests=128, prompt_len=64, mean_output=128, max_num_seqs=32)
    rows += prefix.shared_prefix_ttft((0, 1000, 2000), here, requests_per_group=8, suffix_len=50, output_len=16)
    prompt = speculative.grounded_prompts(ctx.model.tokenizer, 1)[0]
    rows += speculative.speculation([prompt], {"off": EngineConfig(), "ngram": EngineConfig(speculative_method="ngram")},
                                    here, output_len=256)
    numbers, errors = {}, []
    for measured, simulated in pairs(rows):
        label = ", ".join(f"{k} {simulated[k]}" for k in ("cap", "scheduling", "prefix_len", "caching", "config")
                          if k in simulated)
        error = simulated["output_throughput_err_pct"]
        numbers[f"{label}: measured / simulated tok/s"] = (f"{measured['output_throughput']:.0f} / "
                                                           f"{simulated['output_throughput']:.0f} ({error:+.0f}%)")
        errors.append(abs(error))
    return CheckResult("simulator_vs_engine", "passed", numbers, f"output throughput; worst error {max(errors):.0f}% "
                       "(reported, not bounded: the GPU's first measurement of it)")


def check_decode_floor(ctx: Context) -> CheckResult:
    from statistics import median

    from ref_engine import LLM
    from sim.cost_model import ROOFLINE_FEATURE_NAMES, BatchShape, CostModel

    sheet = ctx.datasheet
    if sheet is None:
        return CheckResult("decode_floor", "skipped", detail="no datasheet bandwidth for this device")
    cost = CostModel(ctx.model.arch, sheet, dtype="float32")
    bytes_of = ROOFLINE_FEATURE_NAMES.index("bytes_per_device")
    numbers, slower = {}, []
    for batch, output_len in ((1, 256), (64, 64)):  # 64-token prompts
        prompts = [[1 + (i * 7 + j) % 1000 for j in range(64)] for i in range(batch)]
        with LLM(ctx.model, num_kv_blocks=2048, max_num_seqs=batch) as llm:
            greedy_tokens(llm, prompts, max_tokens=output_len)
            steps = [s.duration for s in llm.llm_engine.step_records if s.query_lens == (1,) * batch]
        # priced at the median step's context, as the median step is compared
        shape = BatchShape.decode(batch, 64 + output_len // 2)
        floor = cost.roofline_features(shape)[bytes_of] / sheet.memory_bandwidth
        numbers[f"batch {batch} step ms"] = 1e3 * median(steps)
        numbers[f"batch {batch} floor ms"] = 1e3 * floor
        if batch == 1:
            numbers["single-stream tok/s"] = 1 / median(steps)
        slower.append(median(steps) >= floor)
    return CheckResult("decode_floor", "passed" if all(slower) else "failed", numbers,
                       f"floor: bytes read per step (float32 weights + KV) / {sheet.name}'s {sheet.memory_bandwidth / 1e12:g} TB/s"
                       + ("" if all(slower) else "; a step ran below the floor: its timing is not synchronised"))


def _pytest(name: str, args: list[str], budget_s: float, env: dict[str, str] | None = None) -> CheckResult:
    """A pytest run as one check; its summary line is the detail."""
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args]
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=budget_s - 5,
                              env={**os.environ, **(env or {})})
    except subprocess.TimeoutExpired:
        return CheckResult(name, "failed", detail=f"{' '.join(args)}: ran past {budget_s - 5:g} s")
    summary = (done.stdout.strip().splitlines() or ["no output"])[-1]
    return CheckResult(name, "passed" if done.returncode == 0 else "failed", {"exit code": done.returncode}, summary)


def check_engine_tests(ctx: Context) -> CheckResult:
    return _pytest("engine_tests", ["tests/engine", "--device", "cuda"], ctx.budgets.get("engine_tests", ENGINE_TESTS_S))


def check_notebooks(ctx: Context) -> CheckResult:
    return _pytest("notebooks", ["--nbval-lax", "--nbval-current-env", "notebooks"],
                   ctx.budgets.get("notebooks", NOTEBOOKS_S), env={"SERVING_LAB_MODE": "full"})


CHECKS = (  # 470 s in all; parity loads transformers' GGUF twice and compiles twice
    Check("parity", check_parity, 90),
    Check("two_engines", check_two_engines, 20),
    Check("disaggregated_pair", check_disaggregated_pair, 40),
    Check("calibration", check_calibration, 45),
    Check("simulator_vs_engine", check_simulator_vs_engine, 90),
    Check("decode_floor", check_decode_floor, 20),
    Check("engine_tests", check_engine_tests, ENGINE_TESTS_S),
    Check("notebooks", check_notebooks, NOTEBOOKS_S),
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", choices=[c.name for c in CHECKS], metavar="NAME",
                        help="run only this check (repeatable); --list names them")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or ROOT / "benchmarks"),
                        help="where gpu_check.json and gpu_check.md go (default: $OUT, else benchmarks/)")
    parser.add_argument("--budget", action="append", default=[], metavar="NAME=SECONDS",
                        help="another time budget for a check (repeatable), e.g. notebooks=590 run alone")
    parser.add_argument("--list", action="store_true", help="name the checks and their budgets, and exit")
    args = parser.parse_args(argv)
    budgets = parse_budgets(args.budget, parser)
    if args.list:
        print("\n".join(f"{c.name} ({budgets.get(c.name, c.budget_s):g} s)" for c in CHECKS))
        return 0
    import torch

    if not torch.cuda.is_available():
        print(f"gpu_check: no CUDA device here (torch {torch.__version__}"
              f"{', a CPU-only build' if torch.version.cuda is None else ''}); nothing to check. Run it on a GPU "
              "machine with a CUDA build of torch; the CPU side is what the test suite checks.")
        return 0
    context = Context(budgets)
    chosen = [replace(c, budget_s=budgets.get(c.name, c.budget_s)) for c in CHECKS if not args.only or c.name in args.only]
    results = run_checks(chosen, context)
    json_path, md_path = write_report(results, context.machine, args.out)
    print(f"wrote {json_path} and {md_path}")
    return 0 if all(r.status != "failed" for r in results) else 1


def parse_budgets(items: Sequence[str], parser: argparse.ArgumentParser) -> dict[str, float]:
    """--budget NAME=SECONDS items as a dict; a bad one ends the run naming it (parser.error)."""
    names, budgets = {c.name for c in CHECKS}, {}
    for item in items:
        name, _, seconds = item.partition("=")
        try:
            budgets[name] = float(seconds)
        except ValueError:
            parser.error(f"--budget {item!r}: SECONDS must be a number, as in notebooks=590")
        if name not in names or budgets[name] <= 0:
            parser.error(f"--budget {item!r}: NAME must be one of {sorted(names)} and SECONDS above 0")
    return budgets


if __name__ == "__main__":
    sys.exit(main())
