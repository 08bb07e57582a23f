"""The engine's cold start on this machine, part by part: measured, and predicted by the simulator's `ColdStart`.

    python benchmarks/cold_start.py [--rounds 3]

Measured, each round in a fresh Python process (its own timestamps against the parent's clock at spawn):
- process start: spawn until torch and the engine are imported;
- weight load: `load_model` (the GGUF's header, tokenizer, 4-bit blocks dequantized into float32 weights);
- KV allocation: the engine's construction around the loaded model, which zeroes its KV pool;
- first step: a first one-token `generate` minus a second one, the warm-up an eager engine pays once.

Predicted by `sim.autoscaler.ColdStart(...).parts(simulator)`, with SmolLM2 on this machine's calibrated profile
and the engine's own pool size, from inputs measured apart from the engine (a machine's constants, as a user
would state them for a GPU):
- process_start_s: a fresh process that only imports torch;
- load_bandwidth: float32 bytes per second the checkpoint reader yields on the first `--sample` tensors of the
  file (dequantization), applied to the whole model's float32 bytes; the weights' first touch is priced at the
  allocation rate below, as `ColdStart` does;
- allocation_bandwidth: bytes per second of `torch.zeros` on one fresh float32 tensor as large as the weights
  and the pool together (its first touch: the OS maps and zeroes each page on its first write, and on this VM
  the hypervisor backs a page the guest never used on its first touch too, so the rate falls as more memory
  is touched; measured over the same amount, it is the machine's rate for this size);
- compile_s: 0 (the engine runs eagerly); the first step's warm-up is reported beside it.

Prints the table and the median of each part over the rounds. A benchmark, not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Run in a fresh interpreter; `T0` is the parent's time.time() just before the spawn.
ENGINE_CHILD = """
import json, sys, time
T0 = float(sys.argv[1])
import torch
from ref_engine.engine import LLM
from ref_engine.model.loader import load_model
from ref_engine.sampling_params import SamplingParams
imported = time.time()
loaded = load_model(None)
loaded_at = time.time()
llm = LLM(loaded)
built = time.time()
llm.generate(["Hello"], SamplingParams(max_tokens=1))
first = time.time()
llm.generate(["Hello"], SamplingParams(max_tokens=1))
second = time.time()
print(json.dumps({"process_start": imported - T0, "weight_load": loaded_at - imported, "kv_allocation": built - loaded_at,
                  "first_step": (first - built) - (second - first), "num_kv_blocks": llm.llm_engine.num_kv_blocks}))
"""

TORCH_CHILD = """
import sys, time
T0 = float(sys.argv[1])
import torch
print(time.time() - T0)
"""

RATES_CHILD = """  # argv[2]: tensors to read, argv[3]: bytes to allocate
import itertools, json, sys, time
import torch
from ref_engine.model import store
from ref_engine.model.loader_gguf import GGUFCheckpoint
checkpoint = GGUFCheckpoint(store.default_model_path())
start = time.perf_counter()
nbytes = sum(tensor.numel() * 4 for _, tensor in itertools.islice(checkpoint.weights(), int(sys.argv[2])))
load = nbytes / (time.perf_counter() - start)
start = time.perf_counter()
fresh = torch.zeros(int(sys.argv[3]) // 4)  # float32, as much memory as the engine touches
allocation = fresh.numel() * 4 / (time.perf_counter() - start)
print(json.dumps({"load_bandwidth": load, "allocation_bandwidth": allocation}))
"""


def spawn(code: str, *args: str) -> str:
    t0 = time.time()
    done = subprocess.run([sys.executable, "-c", code, f"{t0:.6f}", *args], cwd=ROOT, capture_output=True, text=True,
                          check=True)
    return done.stdout.strip().splitlines()[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sample", type=int, default=40, help="tensors read to measure the load bandwidth")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from core.arch_config import DEFAULT_MODEL_NAME, ArchConfig
    from core.config import EngineConfig
    from sim.autoscaler import ColdStart
    from sim.simulator import Simulator, default_hardware

    arch = ArchConfig.named(DEFAULT_MODEL_NAME)
    measured, inputs = [], []
    for _ in range(args.rounds):  # alternate the engine and the inputs, so both see the same machine
        measured.append(json.loads(spawn(ENGINE_CHILD)))
        touched = arch.num_params * 4 + measured[-1]["num_kv_blocks"] * arch.kv_bytes_per_block(16, 4)
        rates = json.loads(spawn(RATES_CHILD, str(args.sample), str(touched)))
        rates["process_start_s"] = float(spawn(TORCH_CHILD))
        inputs.append(rates)
    median = {part: statistics.median(m[part] for m in measured) for part in measured[0]}
    given = {key: statistics.median(i[key] for i in inputs) for key in inputs[0]}
    cold = ColdStart(process_start_s=given["process_start_s"], load_bandwidth=given["load_bandwidth"],
                     allocation_bandwidth=given["allocation_bandwidth"])
    simulator = Simulator(DEFAULT_MODEL_NAME, default_hardware(), EngineConfig(), dtype="float32",
                          num_kv_blocks=int(median["num_kv_blocks"]))
    predicted = cold.parts(simulator)
    print(f"{platform.machine()}, Python {platform.python_version()}, {args.rounds} rounds (medians); inputs: torch "
          f"import {given['process_start_s']:.2f} s, load {given['load_bandwidth'] / 1e9:.2f} GB/s (first "
          f"{args.sample} tensors), first touch {given['allocation_bandwidth'] / 1e9:.2f} GB/s; pool "
          f"{int(median['num_kv_blocks'])} blocks")
    print("| part | measured (s) | simulated (s) | error |")
    print("| --- | --- | --- | --- |")
    for part in ("process_start", "weight_load", "kv_allocation"):
        error = predicted[part] / median[part] - 1
        print(f"| {part} | {median[part]:.2f} | {predicted[part]:.2f} | {error:+.0%} |")
    total_measured = sum(median[p] for p in ("process_start", "weight_load", "kv_allocation"))
    total_predicted = sum(predicted[p] for p in ("process_start", "weight_load", "kv_allocation"))
    print(f"| total | {total_measured:.2f} | {total_predicted:.2f} | {total_predicted / total_measured - 1:+.0%} |")
    print(f"| first step's warm-up (compile: 0 in the model) | {median['first_step']:.3f} | 0 | - |")
    print("rounds: " + json.dumps(measured))


if __name__ == "__main__":
    main()
