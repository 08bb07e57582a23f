"""Engine speed per numeric path (float32, float32 with a bfloat16 KV cache, bfloat16, float16, int8 and int4
weight-only), beside transformers, and each path's quality against float32 on the eval
set, side by side in one run.

    python benchmarks/engine_speed.py [--eval-prompts 50] [--eval-tokens 64]
    python benchmarks/engine_speed.py --kernels     # only the projection kernels, ~1 min
    python benchmarks/engine_speed.py --paths int8,int4 --no-transformers   # some paths (float32 is always
                                                                              # measured: the reference)
    python benchmarks/engine_speed.py --llama-cpp /path/to/venv/bin/python   # adds llama.cpp's single stream

(Not with OMP_WAIT_POLICY=PASSIVE, unlike the other benchmarks: a decode step runs hundreds of small
operators, and threads that sleep between them cost single-stream decode up to 2x on the course machine.)

- single stream: one prompt of 128 tokens, 128 output tokens (EOS ignored), greedy, output tok/s;
- batch 8 and 32: 8 or 32 such requests at once, output tok/s (continuous batching, all decode together);
- transformers `generate()` (float32 and bfloat16) on the same GGUF weights, the same two shapes;
- `--llama-cpp PYTHON`: llama.cpp in process (llama-cpp-python, installed in another environment, never a
  dependency of this project) on the same GGUF, single stream (benchmarks/llama_cpp_speed.py);
- quality: `serving_lab.eval_set.compare_quality` against float32 (greedy agreement, mean KL);
- `--kernels`: the projection kernels alone (float32, float32 through MKL's prepacked weights as inductor's
  `freezing` compiles it, the engine's int8 `Int8Linear` and int4 `Int4Linear`, both weight-only with
  bfloat16 activations), on SmolLM2's shapes, at 1, 8 and 32 rows; and the LM head, float32 against the quantized
  paths' int8-screened head, on real hidden states at 1 to 64 rows.

Each engine number is the faster of two runs after a warm-up. Prints markdown; copy it with the machine
and the command into benchmarks/RESULTS.md ("Engine speed"). A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from core.arch_config import ArchConfig
from ref_engine import LLM, SamplingParams
from ref_engine.model.int4 import Int4Linear, Int4Weight
from ref_engine.model.lm_head import ScreenedLMHead
from ref_engine.model.loader import LoadedModel, load_model
from ref_engine.model.quantization import Int8Linear
from ref_engine.model.store import default_model_path
from serving_lab.eval_set import chat_token_ids, compare_quality, eval_prompts, sequence_hidden_states

PROMPT_LEN, OUTPUT_LEN = 128, 128
# --paths id -> (the table's name, load_model's numerics, the engine's kv_cache_dtype)
PATHS = {"float32": ("float32", {}, "auto"), "bf16-kv": ("float32, bfloat16 KV cache", {}, "bfloat16"),
         "bfloat16": ("bfloat16", {"dtype": "bfloat16"}, "auto"), "float16": ("float16", {"dtype": "float16"}, "auto"),
         "int8": ("int8 (weight-only)", {"quantization": "int8"}, "auto"),
         "int4": ("int4 (weight-only, Q4_1 blocks)", {"quantization": "int4"}, "auto")}
BATCHES = (1, 8, 32)


def prompts(batch: int) -> list[list[int]]:
    return [[1000 + (17 * i + 31 * j) % 20000 for j in range(PROMPT_LEN)] for i in range(batch)]


def fastest(run: Callable[[], None], repeats: int = 2) -> float:
    run()  # warm-up: first-call dispatch, allocations
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def engine_tok_s(loaded: LoadedModel, batch: int, kv_cache_dtype: str = "auto") -> float:
    llm = LLM(loaded, max_num_seqs=max(batch, 1), kv_cache_dtype=kv_cache_dtype)
    params = SamplingParams(max_tokens=OUTPUT_LEN, temperature=0.0, ignore_eos=True)
    batch_prompts = prompts(batch)
    return batch * OUTPUT_LEN / fastest(lambda: llm.generate(batch_prompts, params, use_tqdm=False))


def transformers_tok_s(dtype: torch.dtype, batch: int) -> float:
    path = default_model_path()
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype).eval()
    ids = torch.tensor(prompts(batch))

    def run() -> None:
        with torch.inference_mode():
            model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=OUTPUT_LEN,
                           min_new_tokens=OUTPUT_LEN, do_sample=False, pad_token_id=0)

    return batch * OUTPUT_LEN / fastest(run, repeats=1)


def kernel_ms(arch: ArchConfig, rows: int) -> dict[str, float]:
    """Milliseconds for one pass through every layer's projections (q|k|v, o, gate|up, down; distinct random
    weights per layer, so they stream from DRAM as a decode step's do) at `rows` rows, per kernel."""
    shapes = [(arch.hidden_size, arch.q_size + 2 * arch.kv_size), (arch.q_size, arch.hidden_size),
              (arch.hidden_size, 2 * arch.intermediate_size), (arch.intermediate_size, arch.hidden_size)]
    layers = [[torch.randn(n_out, n_in) * 0.02 for n_in, n_out in shapes] for _ in range(arch.num_layers)]
    inputs = {n_in: torch.randn(rows, n_in) for n_in, _ in shapes}

    def float32(weight: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
        stored = weight.t().contiguous()  # [in, out], as the engine's TransposedLinear stores it
        return lambda x: x @ stored

    def mkl_prepacked(weight: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
        packed = torch.ops.mkl._mkl_reorder_linear_weight(weight, rows)  # what inductor's freezing makes of x @ W
        return lambda x: torch.ops.mkl._mkl_linear(x, packed, weight, None, rows)

    kernels = {
        "float32 x @ W": float32,
        "float32, MKL prepacked (inductor freezing)": mkl_prepacked,
        "int8 weight-only, bfloat16 activations (Int8Linear)": lambda w: Int8Linear(w, None),
        "int4 weight-only, group 32, bfloat16 activations (Int4Linear)": lambda w: Int4Linear(
            Int4Weight.quantize(w, 32), None),
    }
    result = {}
    for name, make in kernels.items():
        ops = [[(make(w), inputs[w.shape[1]]) for w in layer] for layer in layers]
        result[name] = 1000 * fastest(lambda ops=ops: [op(x) for layer in ops for op, x in layer])
    return result


def lm_head_ms(loaded: LoadedModel, rows: int) -> dict[str, float]:
    """Milliseconds for the LM head at `rows` rows of real final hidden states (an eval prompt's), float32
    against the quantized paths' screened head (ref_engine/model/lm_head.py), and the screen's candidates."""
    token_ids = chat_token_ids(loaded, eval_prompts(1))[0]
    hidden = sequence_hidden_states(loaded, (token_ids * (1 + rows // len(token_ids)))[:max(rows, 64)])[-rows:]
    weight = loaded.model.lm_head.weight
    screened = ScreenedLMHead(weight)
    with torch.inference_mode():
        logits, bound = screened.approximate(hidden)
        candidates = (logits + bound >= (logits - bound).amax(dim=1, keepdim=True)).sum(dim=1).float()
        return {"float32 x @ W (49,152 x 576)": 1000 * fastest(lambda: hidden @ weight.T, repeats=5),
                "int8 screen + float32 candidates (ScreenedLMHead)": 1000 * fastest(lambda: screened(hidden), repeats=5),
                "candidates per row, median": float(candidates.median()),
                "largest int8 error / its bound": float(((hidden @ weight.T - logits).abs() / bound).max())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--eval-prompts", type=int, default=50, help="eval-set prompts per path (200: all)")
    parser.add_argument("--eval-tokens", type=int, default=64)
    parser.add_argument("--kernels", action="store_true",
                        help="only the projection kernels: ms per pass through every layer, per kernel")
    parser.add_argument("--paths", default=",".join(PATHS),
                        help=f"the numeric paths to measure, of {', '.join(PATHS)} (float32 always: the reference)")
    parser.add_argument("--no-transformers", action="store_true", help="leave out transformers' generate()")
    parser.add_argument("--llama-cpp", metavar="PYTHON",
                        help="a Python with llama-cpp-python installed: add llama.cpp's single stream on the same GGUF")
    args = parser.parse_args()
    chosen = ["float32", *(p for p in args.paths.split(",") if p != "float32")]
    if unknown := [p for p in chosen if p not in PATHS]:
        parser.error(f"--paths: unknown {', '.join(unknown)}; choices: {', '.join(PATHS)}")
    print(f"machine: {platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads, "
          f"torch {torch.__version__}")
    reference = load_model(None)
    if args.kernels:
        table = {rows: kernel_ms(reference.arch, rows) for rows in (1, 8, 32)}
        print(f"\n| kernel ({reference.arch.num_layers} layers of projections, ms) | 1 row | 8 rows | 32 rows |")
        print("| --- | --- | --- | --- |")
        for name in table[1]:
            print(f"| {name} | " + " | ".join(f"{table[rows][name]:.1f}" for rows in table) + " |")
        heads = {rows: lm_head_ms(reference, rows) for rows in (1, 8, 32, 64)}
        print("\n| LM head (ms) | 1 row | 8 rows | 32 rows | 64 rows |")
        print("| --- | --- | --- | --- | --- |")
        for name in heads[1]:
            print(f"| {name} | " + " | ".join(f"{heads[rows][name]:.2g}" for rows in heads) + " |")
        return
    print(f"prompt {PROMPT_LEN}, output {OUTPUT_LEN} tokens; eval {args.eval_prompts} prompts x {args.eval_tokens} tokens")
    print("\n| system | single stream (tok/s) | batch 8 (tok/s) | batch 32 (tok/s) | greedy agreement "
          "| mean KL (nats/token) |")
    print("| --- | --- | --- | --- | --- | --- |")
    models = {path: load_model(None, **PATHS[path][1]) if PATHS[path][1] else reference for path in chosen}
    prompts = eval_prompts(args.eval_prompts)
    qualities = {}
    for kv_cache_dtype in {PATHS[path][2] for path in chosen}:
        judged_paths = [p for p in chosen if PATHS[p][2] == kv_cache_dtype and p != "float32"]
        if not judged_paths:
            continue
        judged = compare_quality(reference, [models[p] for p in judged_paths], prompts, args.eval_tokens,
                                 kv_cache_dtype)
        qualities |= dict(zip(judged_paths, judged))
    for path, loaded in models.items():
        name, _, kv_cache_dtype = PATHS[path]
        speeds = " | ".join(f"{engine_tok_s(loaded, batch, kv_cache_dtype):.1f}" for batch in BATCHES)
        quality = (f"{qualities[path].agreement:.3f} | {qualities[path].mean_kl:.5f}" if path in qualities
                   else "reference | reference")
        print(f"| engine, {name} | {speeds} | {quality} |", flush=True)
    if not args.no_transformers:
        for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
            speeds = " | ".join(f"{transformers_tok_s(dtype, batch):.1f}" for batch in BATCHES)
            print(f"| transformers generate, {name} | {speeds} |  |  |", flush=True)
    if args.llama_cpp:
        print(f"| llama.cpp in process, Q4_1 GGUF | {llama_cpp_tok_s(args.llama_cpp)} |  |  |  |  |", flush=True)


def llama_cpp_tok_s(python: str) -> str:
    """llama.cpp's single-stream output tok/s on the default GGUF, run by `python` (another environment)."""
    script = Path(__file__).with_name("llama_cpp_speed.py")
    result = subprocess.run([python, str(script), str(default_model_path()), "--threads",
                             str(torch.get_num_threads()), "--prompt-len", str(PROMPT_LEN), "--output-len",
                             str(OUTPUT_LEN)], capture_output=True, text=True)
    if result.returncode:
        sys.exit(f"--llama-cpp: {python} {script.name} failed:\n{result.stderr.strip()}")
    return result.stdout.strip()


if __name__ == "__main__":
    main()
