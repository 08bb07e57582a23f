"""TTFT and throughput with a long shared prefix, prefix cache off vs on, measured and simulated.

    python benchmarks/prefix_caching.py [--prefix-len 1000] [--suffix-len 50] [--requests 8] [--repeats 2]

One warm-up request puts the shared prefix in the cache (not measured); then `--requests` requests, each
the prefix plus its own `--suffix-len`-token question, arrive at once. The engine keeps the fastest of
`--repeats` runs of each configuration, taken in alternation. The simulator prices the same workload with
this machine's calibrated profile. Prints one table; copy it with the machine and the command into
benchmarks/RESULTS.md. The issue's goal: warm-prefix TTFT at least 5x lower than cold, on CPU.
"""

from __future__ import annotations

import argparse
import os
import platform

import torch

from course.prefix_caching import shared_prefix_ttft
from ref_engine.model.loader import load_model
from serving_lab.calibrate import load_or_calibrate
from serving_lab.pairing import Sides, format_table


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prefix-len", type=int, default=1000)
    parser.add_argument("--suffix-len", type=int, default=50)
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--output-len", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()

    loaded = load_model(None, dtype="float32")
    sides = Sides(model=loaded, hardware=load_or_calibrate(loaded), repeats=args.repeats)
    rows = shared_prefix_ttft([args.prefix_len], sides, requests_per_group=args.requests,
                              suffix_len=args.suffix_len, output_len=args.output_len)
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch "
          f"{torch.__version__}, threads {torch.get_num_threads()}")
    print(format_table(rows, ["caching", "side", "mean_ttft_ms", "mean_ttft_ms_err_pct", "output_throughput",
                              "output_throughput_err_pct", "prefix_cache_hit_rate", "same_hits"]))
    by = {(r["caching"], r["side"]): r for r in rows}
    for side in ("measured", "simulated"):
        cold, warm = by[False, side], by[True, side]
        print(f"{side}: warm TTFT {cold['mean_ttft_ms'] / warm['mean_ttft_ms']:.1f}x lower than cold, "
              f"throughput {warm['output_throughput'] / cold['output_throughput']:.2f}x")


if __name__ == "__main__":
    main()
