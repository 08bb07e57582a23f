"""The machine's own speed limits, as torch sees them: the numbers a CPU roofline starts from.

    python benchmarks/machine.py [--threads 2] [--repeats 3]

Measures, with torch on `--threads` threads, keeping the fastest of `--repeats` runs of each:
- DRAM copy bandwidth: `dst.copy_(src)` of a 256 MiB float32 tensor, counting bytes read + written;
- large matmul rates: a 2048 x 2048 x 2048 product in float32 and in bfloat16;
- small-batch GEMM rates, the shape of a SmolLM2-135M projection: `x @ W` with x [B, 576] and W [576, 1536]
  at B = 1, 16, 64, 256, in float32 and bfloat16, cycling through copies of W that together fill 128 MiB,
  so the weights stream from DRAM as in a real decode step; and the same product through
  `F.linear(x, W.T)` (W stored [out, in], `nn.Linear`'s layout) in float32.

Where a kernel is very slow (bf16 on a CPU without bf16 instructions), the matmul shrinks and the GEMM uses
fewer copies of W, so that the run stays under a minute; the table names the size it used. Prints one
Markdown table with the machine, torch version and date. A
benchmark, not a test: nothing here asserts a speed. Results are in benchmarks/RESULTS.md ("The machine"),
next to the course machine's rates that sim/hardware.py's `LOCAL_CPU` profile and lesson 1's
back-of-envelope numbers start from.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

HIDDEN, OUT = 576, 1536  # SmolLM2-135M: hidden size, and the widest projection's width (gate | up is 2 x 1536)
STREAM_BYTES = 128 * 2**20  # the weight copies x @ W cycles through: several times any last-level cache
BATCHES = (1, 16, 64, 256)
# The longest one timed call may take, so that the whole run stays well under a minute on a slow machine.
MATMUL_SECONDS = 1.0
PASS_SECONDS = 0.25


def fastest(fn: Callable[[], object], repeats: int) -> float:
    """Seconds of the fastest of `repeats` calls, after one warm-up call."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def copy_bandwidth(repeats: int) -> float:
    """Bytes per second of a large tensor copy, read + written."""
    src = torch.ones(64 * 2**20, dtype=torch.float32)  # 256 MiB
    dst = torch.empty_like(src)
    seconds = fastest(lambda: dst.copy_(src), repeats)
    return 2 * src.numel() * src.element_size() / seconds


def matmul_rate(dtype: torch.dtype, repeats: int, n: int = 2048) -> tuple[float, int]:
    """(FLOP/s, size) of one size x size x size matrix product: size = n, or smaller where one product of size n
    would take over MATMUL_SECONDS (a CPU without bf16 instructions runs bf16 products ~100x slower than
    fp32). The size starts at 256 and doubles while the next one is predicted (FLOPs grow 8x) to fit."""
    size = 256
    while True:
        a, b = torch.randn(size, size).to(dtype), torch.randn(size, size).to(dtype)
        seconds = fastest(lambda: a @ b, 1)  # noqa: B023 (a and b of this size, used at once)
        if size >= n or 8 * seconds > MATMUL_SECONDS:
            return 2 * size**3 / min(seconds, fastest(lambda: a @ b, repeats - 1)), size  # noqa: B023
        size *= 2


def gemm_rate(batch: int, dtype: torch.dtype, repeats: int, linear: bool = False) -> tuple[float, float]:
    """(FLOP/s, weight bytes/s) of `x @ W` (or `F.linear(x, W.T)`) over copies of W that stream from DRAM.

    The copies fill STREAM_BYTES, unless one pass over them would take over PASS_SECONDS: then fewer copies,
    which only happens where the product is so slow that it is compute-bound anyway."""
    x = torch.randn(batch, HIDDEN).to(dtype)
    weight = torch.randn(OUT, HIDDEN).to(dtype) if linear else torch.randn(HIDDEN, OUT).to(dtype)
    product = (lambda w: F.linear(x, w)) if linear else (lambda w: x @ w)  # linear: nn.Linear's [out, in]
    product(weight)
    start = time.perf_counter()
    product(weight)
    one = time.perf_counter() - start
    weight_bytes = weight.numel() * weight.element_size()
    copies = int(max(1, min(STREAM_BYTES // weight_bytes, PASS_SECONDS / max(one, 1e-9))))
    weights = [weight.clone() for _ in range(copies)]

    def run() -> None:
        for w in weights:
            product(w)

    seconds = fastest(run, repeats)
    return 2 * batch * HIDDEN * OUT * copies / seconds, weight_bytes * copies / seconds


def rate(flops: float) -> str:
    """GFLOP/s with three significant digits at most."""
    return f"{flops / 1e9:.3g}"


def cpu_name() -> str:
    """The CPU model and the vector extensions that matter to torch's kernels (Linux; else platform's words)."""
    try:
        with open("/proc/cpuinfo") as f:
            info = f.read()
    except OSError:
        return platform.processor() or platform.machine()
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")),
                 platform.machine())
    flags = next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), [])
    isa = [name for name in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if name in flags]
    return f"{model} ({', '.join(isa) or 'no AVX2'})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2, help="torch threads (the course machine has 2 cores)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per measurement; the fastest is kept")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    started = time.perf_counter()

    rows = [("DRAM copy bandwidth (bytes read + written)", f"{copy_bandwidth(args.repeats + 2) / 1e9:.1f} GB/s")]
    for dtype, label in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
        flops, n = matmul_rate(dtype, args.repeats)
        rows.append((f"matmul {n} x {n} x {n}, {label}", f"{rate(flops)} GFLOP/s"))
    for dtype, label, linear in ((torch.float32, "fp32", False), (torch.bfloat16, "bf16", False),
                                 (torch.float32, "fp32", True)):
        cells = []
        for batch in BATCHES:
            flops, bandwidth = gemm_rate(batch, dtype, args.repeats, linear=linear)
            cells.append(f"B={batch}: {rate(flops)}" + (f" ({bandwidth / 1e9:.3g} GB/s)" if batch == 1 else ""))
        what = "`F.linear(x, W.T)`, W stored [1536, 576]" if linear else "`x @ W`, W stored [576, 1536]"
        rows.append((f"{what}, x [B, 576], weights from DRAM, {label} (GFLOP/s)", "; ".join(cells)))

    print(f"Machine: {cpu_name()}, {os.cpu_count()} logical CPUs, {platform.system()} {platform.machine()}; "
          f"Python {platform.python_version()}, torch {torch.__version__}, {torch.get_num_threads()} threads; "
          f"{datetime.datetime.now().isoformat(timespec='minutes')}; fastest of {args.repeats} runs; "
          f"{time.perf_counter() - started:.0f} s")
    print()
    print("| what | measured |")
    print("| --- | --- |")
    for what, number in rows:
        print(f"| {what} | {number} |")


if __name__ == "__main__":
    main()
