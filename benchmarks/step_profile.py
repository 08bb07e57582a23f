"""Where one engine step's time goes: decode steps at batch 1, 16 and 64, and one 512-token prefill.

    python benchmarks/step_profile.py [--dtype float32] [--quantization int8] [--kv-cache-dtype bfloat16]
                                      [--steps 8] [--batches 1 16 64] [--context 128] [--threads N]

For each shape it times steps without a profiler (the wall time per step, and within it the core's
`schedule` and `update_from_output`), then runs the same steps under `torch.profiler` with Python stacks
and files every top-level operator under the engine function that called it:

- **matmuls**: the projections (`TransposedLinear`, `Int8Linear`, `Int4Linear`) and the LM head (`compute_logits`);
- **attention**: writing the new K/V into the cache, the block gathers, the masks and SDPA
  (`paged_attention`, `write_kv_cache`) and the per-step metadata (`AttentionMetadata`);
- **elementwise**: RMSNorm, rotary, SiLU-and-mul, residual adds, the embedding lookup, splits;
- **sampling**: the sampler's operators;
- **runner glue**: building the flat input tensors and picking the logits rows.

What no operator accounts for, wall time less every operator's time and less the core, is Python and
dispatch in the runner and the model ("Python, runner and model"). Operator times are taken under the
profiler, which inflates them a little, so that line is a lower bound. It also counts the top-level operators
a step runs and times the cheapest one eager torch can run here (adding two hidden-size vectors into a third):
their product is what dispatch alone costs a step, before any arithmetic. Prints a markdown table for
benchmarks/RESULTS.md ("Where a step's time goes"). A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import inspect
import platform
import time
from collections import defaultdict
from collections.abc import Callable

import torch
from torch.autograd.profiler_util import FunctionEvent
from torch.profiler import ProfilerActivity, profile

from ref_engine import SamplingParams
from ref_engine.engine import LLMEngine
from ref_engine.model.int4 import Int4Linear
from ref_engine.model.linear import TransposedLinear
from ref_engine.model.loader import LoadedModel, load_model
from ref_engine.model.quantization import Int8Linear

# The innermost engine function on an operator's Python stack -> the category it is filed under.
CATEGORY_OF_FUNCTION = {
    "compute_logits": "matmuls",
    "paged_attention": "attention",
    "_decode_attention": "attention",
    "_gather_decode_kv": "attention",
    "write_kv_cache": "attention",
    "__post_init__": "attention",  # AttentionMetadata's per-step derived tensors
    "build": "attention",
    "execute_model": "runner glue",
}
CATEGORIES = ["matmuls", "attention", "elementwise", "sampling", "runner glue"]


def _source_lines(function: Callable) -> tuple[str, range]:
    lines, first = inspect.getsourcelines(function)
    path = inspect.getsourcefile(function)
    return path[path.rindex("ref_engine/"):], range(first, first + len(lines))


PROJECTIONS = [_source_lines(TransposedLinear.forward), _source_lines(Int8Linear.forward),
               _source_lines(Int4Linear.forward)]


def category(operator: FunctionEvent) -> str:
    """File a top-level operator by the innermost engine function above it. With `with_stack`, the profiler
    records Python calls as events named 'path(line): function', the parents of the operators they run."""
    frame = operator.cpu_parent
    while frame is not None and "ref_engine/" not in frame.name:
        frame = frame.cpu_parent
    if frame is None:
        return "runner glue"
    where, _, function = frame.name.rpartition(": ")
    path, _, line = where.rpartition("(")
    path = path[path.rindex("ref_engine/"):]
    if any(path == file and int(line.rstrip(")")) in lines for file, lines in PROJECTIONS):
        return "matmuls"
    if path.endswith(("sampler.py", "spec_decode.py")):
        return "sampling"
    return CATEGORY_OF_FUNCTION.get(function, "elementwise")


def is_operator(event: FunctionEvent) -> bool:
    return "::" in event.name  # aten::mm, quantized::linear_dynamic; Python frames are 'path(line): name'


def top_level(event: FunctionEvent) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if is_operator(parent):
            return False
        parent = parent.cpu_parent
    return True


def decode_engine(loaded: LoadedModel, batch: int, kv_cache_dtype: str, enforce_eager: bool = True,
                  context: int = 128) -> LLMEngine:
    """An engine with `batch` requests of `context` prompt tokens, all prefilled in its first step, so every
    later step decodes one token for each."""
    engine = LLMEngine(loaded, max_num_seqs=batch, max_num_batched_tokens=context * batch, enable_prefix_caching=False,
                       kv_cache_dtype=kv_cache_dtype, enforce_eager=enforce_eager)
    params = SamplingParams(max_tokens=4000, temperature=0.0, ignore_eos=True)
    for i in range(batch):
        engine.add_request(f"r{i}", [1000 + (17 * i + 31 * j) % 20000 for j in range(context)], params)
    engine.step()
    return engine


def prefill_step(loaded: LoadedModel, kv_cache_dtype: str) -> tuple[LLMEngine, Callable[[], None]]:
    """One 512-token prompt prefilled in one step, then again (prefix caching off)."""
    engine = LLMEngine(loaded, max_num_seqs=1, max_num_batched_tokens=512, enable_prefix_caching=False,
                       kv_cache_dtype=kv_cache_dtype)
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    prompt = [1000 + (31 * j) % 20000 for j in range(512)]

    def run() -> None:
        engine.add_request("p", prompt, params)
        while engine.has_unfinished_requests():
            engine.step()

    return engine, run


def core_timed(engine: LLMEngine, seconds: dict[str, float]) -> None:
    """Wrap the engine's core calls so `seconds["core"]` accumulates their wall time."""
    scheduler = engine.scheduler
    for name in ("schedule", "update_from_output"):
        inner = getattr(scheduler, name)

        def timed(*args: object, _inner: Callable = inner) -> object:
            start = time.perf_counter()
            try:
                return _inner(*args)
            finally:
                seconds["core"] += time.perf_counter() - start

        setattr(scheduler, name, timed)


def median_wall(run: Callable[[], None], repeats: int) -> float:
    """Median wall seconds of `repeats` calls of `run`, timed without the profiler."""
    walls = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        walls.append(time.perf_counter() - start)
    return sorted(walls)[len(walls) // 2]


def seconds_by_category(run: Callable[[], None], repeats: int) -> tuple[dict[str, float], float]:
    """Seconds per call of `run` in each category, and top-level operators per call, from `repeats` calls
    under torch.profiler."""
    per_category = dict.fromkeys(CATEGORIES, 0.0)
    operators = 0
    with profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof:
        for _ in range(repeats):
            run()
    for event in prof.events():
        if is_operator(event) and top_level(event):
            per_category[category(event)] += event.cpu_time_total / 1e6 / repeats
            operators += 1
    return per_category, operators / repeats


def cheapest_operator_us(hidden_size: int, calls: int = 20_000) -> float:
    """Microseconds of one eager `torch.add(a, b, out=c)` on hidden-size float32 vectors: dispatch, nearly no
    arithmetic. The best of five rounds, so a busy machine overstates it less."""
    a, b, c = torch.randn(hidden_size), torch.randn(hidden_size), torch.empty(hidden_size)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            torch.add(a, b, out=c)
        best = min(best, (time.perf_counter() - start) / calls)
    return best * 1e6


def breakdown(run: Callable[[], None], engine: LLMEngine, steps: int) -> dict[str, float]:
    """Milliseconds per step by category, from `steps` calls of `run` (one step each)."""
    run()  # warm-up
    seconds: dict[str, float] = defaultdict(float)
    core_timed(engine, seconds)
    wall = median_wall(run, steps)
    core = seconds["core"] / steps
    per_category, operators = seconds_by_category(run, steps)
    result = {name: per_category[name] * 1e3 for name in CATEGORIES}
    result["core (schedule + update)"] = core * 1e3
    result["Python, runner and model"] = max(0.0, wall - sum(per_category.values()) - core) * 1e3
    result["wall"] = wall * 1e3
    result["top-level operators"] = operators
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--quantization", default=None)
    parser.add_argument("--kv-cache-dtype", default="auto")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--context", type=int, default=128, help="the decode requests' prompt length")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    loaded = load_model(None, dtype=args.dtype, quantization=args.quantization)
    print(f"machine: {platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; {loaded.model_id}, dtype {args.dtype}, "
          f"quantization {args.quantization}, kv_cache_dtype {args.kv_cache_dtype}, decode context {args.context}; "
          f"median wall of {args.steps} "
          "steps, categories from torch.profiler")
    columns: dict[str, dict[str, float]] = {}
    for batch in args.batches:
        engine = decode_engine(loaded, batch, args.kv_cache_dtype, context=args.context)
        columns[f"decode, batch {batch}"] = breakdown(engine.step, engine, args.steps)
    engine, run = prefill_step(loaded, args.kv_cache_dtype)
    columns["prefill, 512 tokens"] = breakdown(run, engine, max(2, args.steps // 2))
    rows = [*CATEGORIES, "core (schedule + update)", "Python, runner and model", "wall", "top-level operators"]
    print("\n| ms per step | " + " | ".join(columns) + " |")
    print("| --- |" + " --- |" * len(columns))
    for row in rows:
        cells = []
        for values in columns.values():
            share = "" if row in ("wall", "top-level operators") else f" ({values[row] / values['wall']:.0%})"
            cells.append(f"{values[row]:.0f}" if row == "top-level operators" else f"{values[row]:.1f}{share}")
        print(f"| {row} | " + " | ".join(cells) + " |")
    dispatch_us = cheapest_operator_us(loaded.arch.hidden_size)
    print(f"\nthe cheapest eager operator here: {dispatch_us:.1f} us; so dispatch alone, before any arithmetic: "
          + ", ".join(f"{name} {values['top-level operators'] * dispatch_us / 1e3:.1f} ms"
                      for name, values in columns.items()))


if __name__ == "__main__":
    main()
