"""Lesson 3's scheduler on this CPU, measured and simulated: the prefill stall, fairness between tenants, and
prefill/decode disaggregation (issue 12).

    OMP_WAIT_POLICY=PASSIVE python benchmarks/scheduler.py [--repeats 2] [--quick]

SmolLM2-135M (float32) in the engine; the simulator prices it with this machine's calibrated profile
(`load_or_calibrate`: the saved one while the drift probe agrees, else a fresh calibration). Prints markdown
for benchmarks/RESULTS.md: per section a table and a line per goal of the issue.
- Stall (`prefill_stall`): 8 requests decoding (48 tokens each) when one 1,000-token prompt arrives; the
  decodes' p50, p99 and largest inter-token gap and the long prompt's TTFT, unchunked vs token budgets
  64/128/256. Goals: chunking cuts the largest gap at least 3x; the simulator predicts each p99 within 20%.
- Fairness (`tenant_fairness`, `weighted_service_ratio`): two tenants with the same backlog (48 requests
  each, all at once) under "fair" with weights 1:3 and 1:1: service ratio until the first one is done;
  then tenant "heavy" floods 32 requests ahead of tenant "light"'s 4, under "fcfs" and "fair": the light
  tenant's mean TTFT. Goals: ratio within 5% of the weights; light TTFT at least 5x lower under "fair".
- Disaggregation (`run_pair`, `disaggregation_vs_simulated`, `colocated_vs_disaggregated`, `kv_link_sweep`):
  8 prompts of 128-1,000 tokens at once, 32 tokens out, on one colocated engine (2 threads) and on a real
  1P+1D pair (two engine processes, one thread each, the shared-memory KV connector): TTFT, ITL, KV bytes
  moved, transfer time. The pair is simulated on the KV link fitted to its own transfers and priced with
  a profile calibrated on one thread (`load_or_calibrate(threads=1)`, saved beside the default one).
  Then DistServe's comparison, simulated: Llama-3.1-8B on two H100s, colocated vs 1P+1D goodput under
  TTFT and TPOT SLOs over a rate sweep, and the KV link swept. Goal: the simulated 1P+1D TTFT and ITL
  within 20% of measured.
The engine keeps the fastest of `--repeats` runs of each stall, fairness and colocated configuration (the
1P+1D pair runs once, after a warm-up). A benchmark, not a test: nothing here asserts. About 6 minutes on 2
cores with both profiles saved and current; each profile calibrated afresh adds 2-3 minutes (the one-thread
profile the first time). `--quick` runs tiny sizes: a smoke test of every path, not a result.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import random
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from core.config import EngineConfig
from core.workload import Workload
from course.chunked_prefill_and_disaggregation import (
    colocated_vs_disaggregated,
    disaggregation_vs_simulated,
    fairness_workload,
    kv_link_sweep,
    max_rate_within,
    prefill_stall,
    tenant_fairness,
    weighted_service_ratio,
)
from ref_engine.model.loader import LoadedModel, load_model
from serving_lab.calibrate import load_or_calibrate
from serving_lab.pairing import Sides, pairs, run_pair


@dataclass(frozen=True)
class Sizes:
    """Every size the benchmark runs at; `FULL` is the issue's, `QUICK` a smoke test."""

    stall_budgets: tuple[int | None, ...]
    stall: dict[str, int]  # prefill_stall's workload knobs
    weighted: dict[str, int]  # fairness_workload knobs of the weighted-ratio runs (both tenants backlogged)
    flood: dict[str, int]  # fairness_workload knobs of the flooding run
    pd_prompt_lens: tuple[int, ...]
    pd_output_len: int
    gpu_rates: tuple[float, ...]
    gpu_requests: int


FULL = Sizes(
    stall_budgets=(None, 64, 128, 256),
    stall=dict(num_decodes=8, decode_prompt_len=32, decode_output_len=48, long_prompt_len=1000, arrival_after_steps=8),
    weighted=dict(heavy=48, light=48, prompt_len=32, output_len=8),
    flood=dict(heavy=32, light=4, prompt_len=64, output_len=16),
    pd_prompt_lens=(128, 256, 384, 512, 640, 768, 896, 1000), pd_output_len=32,
    gpu_rates=(10, 20, 30, 40), gpu_requests=200,
)
QUICK = Sizes(
    stall_budgets=(None, 64),
    stall=dict(num_decodes=2, decode_prompt_len=16, decode_output_len=16, long_prompt_len=160, arrival_after_steps=4),
    weighted=dict(heavy=6, light=6, prompt_len=32, output_len=6),
    flood=dict(heavy=6, light=2, prompt_len=32, output_len=6),
    pd_prompt_lens=(32, 64), pd_output_len=4,
    gpu_rates=(10, 40), gpu_requests=40,
)

WEIGHTS = ({"heavy": 1.0, "light": 3.0}, {"heavy": 1.0, "light": 1.0})
# DistServe's comparison on a GPU (the notebook's): Llama-3.1-8B on the H100 profile, 1,024-token prompts,
# 64 tokens out, no chunked prefill, TTFT <= 150 ms and TPOT <= 7.5 ms.
GPU = Sides(arch="llama-3.1-8b", hardware="h100-sxm", measure=False)
GPU_CONFIG = EngineConfig(enable_chunked_prefill=False, max_num_batched_tokens=4096, max_model_len=4096,
                          max_num_seqs=256)
TTFT_SLO_MS, TPOT_SLO_MS = 150.0, 7.5
LINKS = {"NVLink 450 GB/s": 450e9, "IB 400 Gb/s": 50e9, "100 GbE": 12.5e9, "10 GbE": 1.25e9}


def cell(row: dict[str, Any], key: str, digits: int = 0) -> str:
    """`key` of a row, with its simulated error in parentheses when the row has one."""
    error = row.get(f"{key}_err_pct")
    return f"{row[key]:.{digits}f}" + (f" ({error:+.1f}%)" if error is not None else "")


def table(header: Iterable[str], lines: Iterable[Iterable[Any]]) -> str:
    header = list(header)
    return "\n".join(["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
                     + ["| " + " | ".join(str(v) for v in line) + " |" for line in lines])


def stall(sides: Sides, sizes: Sizes) -> None:
    rows = prefill_stall(sizes.stall_budgets, sides, **sizes.stall)
    print(f"\n### Stall: {sizes.stall['num_decodes']} decodes, one {sizes.stall['long_prompt_len']}-token prompt "
          f"arriving at {1000 * rows[0]['long_arrival_s']:.0f} ms\n")
    print(table(["budget", "side", "machine slowdown", "max step tokens", "decode p50 ITL ms", "decode p99 ITL ms",
                 "decode max ITL ms", "long prompt TTFT ms"],
                [[r["budget"], r["side"], f"{r['slowdown']:.2f}" if "slowdown" in r else "", r["max_step_tokens"],
                  cell(r, "decode_p50_itl_ms"), cell(r, "decode_p99_itl_ms"), cell(r, "decode_max_itl_ms"),
                  cell(r, "long_ttft_ms")] for r in rows]))
    by = {(r["budget"], r["side"]): r for r in rows}
    print()
    for side in ("measured", "simulated"):
        unchunked = by["unchunked", side]["decode_max_itl_ms"]
        cuts = ", ".join(f"{b}: {unchunked / by[b, side]['decode_max_itl_ms']:.1f}x"
                         for b in sizes.stall_budgets if b is not None)
        print(f"- {side}: chunking cuts the largest gap ({unchunked:.0f} ms unchunked) by budget {cuts} (goal >= 3x)")
    within = [m["budget"] for m, s in pairs(rows) if abs(s["decode_p99_itl_ms_err_pct"]) <= 20]
    print(f"- simulated p99 ITL within 20% of measured (goal: every budget): {len(within)} of {len(pairs(rows))}, "
          f"budgets {', '.join(map(str, within))}", flush=True)


def fairness(sides: Sides, sizes: Sizes) -> None:
    w = sizes.weighted
    print(f"\n### Fairness: weighted service, both tenants backlogged ({w['heavy']} + {w['light']} requests at once, "
          f"prompts {w['prompt_len']}, outputs {w['output_len']}, max_num_seqs 4)\n")
    lines = []
    for weights in WEIGHTS:
        target = weights["light"] / weights["heavy"]
        for r in tenant_fairness(["fair"], sides, workload=fairness_workload(**w), tenant_weights=weights):
            ratio = weighted_service_ratio(r["metrics"], "heavy", "light")
            lines.append([f"{weights['heavy']:g}:{weights['light']:g}", r["side"], f"{ratio:.3f}", f"{target:g}",
                          f"{100 * (ratio / target - 1):+.1f}%", f"{r['jain']:.3f}", r.get("same_policy", "")])
    print(table(["weights heavy:light", "side", "light / heavy service", "target", "off by (goal within 5%)",
                 "Jain (weighted)", "same decisions as measured"], lines))

    f = sizes.flood
    rows = tenant_fairness(["fcfs", "fair"], sides, workload=fairness_workload(**f))
    print(f"\n### Fairness: tenant \"heavy\" floods {f['heavy']} requests ahead of \"light\"'s {f['light']} (all at once, "
          f"prompts {f['prompt_len']}, outputs {f['output_len']}, max_num_seqs 4)\n")
    print(table(["policy", "side", "machine slowdown", "light mean TTFT ms", "heavy mean TTFT ms", "Jain",
                 "output tok/s", "same decisions as measured"],
                [[r["policy"], r["side"], f"{r['slowdown']:.2f}" if "slowdown" in r else "",
                  cell(r, "light_mean_ttft_ms"), f"{r['heavy_mean_ttft_ms']:.0f}", f"{r['jain']:.3f}",
                  f"{r['output_throughput']:.1f}", r.get("same_policy", "")] for r in rows]))
    by = {(r["policy"], r["side"]): r for r in rows}
    print()
    for side in ("measured", "simulated"):
        gain = by["fcfs", side]["light_mean_ttft_ms"] / by["fair", side]["light_mean_ttft_ms"]
        print(f"- {side}: the light tenant's mean TTFT is {gain:.1f}x lower under fair than under fcfs (goal >= 5x)",
              flush=True)


def disaggregation(loaded: LoadedModel, sides: Sides, sizes: Sizes) -> None:
    rng = random.Random(0)
    prompts = [[rng.randrange(100, 40000) for _ in range(n)] for n in sizes.pd_prompt_lens]
    out = sizes.pd_output_len
    colocated = run_pair(Workload.from_token_ids(prompts, out), EngineConfig(), sides)
    one_thread = load_or_calibrate(loaded, threads=1)  # as each engine of the pair runs
    pd = disaggregation_vs_simulated(prompts, Sides(hardware=one_thread), output_len=out)
    print(f"\n### Disaggregation on this CPU: {len(prompts)} prompts of {min(sizes.pd_prompt_lens)}-"
          f"{max(sizes.pd_prompt_lens)} tokens at once, {out} tokens out, default EngineConfig\n")
    print(f"1P+1D priced with a one-thread profile (fit mean |error| "
          f"{one_thread.provenance['fit_mean_abs_error_pct']}%, steady: {one_thread.provenance.get('steady')}); "
          f"KV link fitted to the pair's transfers: {pd[0]['kv_link_gb_per_s']:.2f} GB/s + "
          f"{pd[0]['kv_link_latency_ms']:.2f} ms\n")
    lines = [["colocated (1 engine, 2 threads)", r["side"], cell(r, "mean_ttft_ms"), cell(r, "mean_itl_ms", 1),
              0, "", "", ""] for r in colocated]
    lines += [["1P+1D (2 processes, 1 thread each)", r["side"], cell(r, "mean_ttft_ms"), cell(r, "mean_itl_ms", 1),
               f"{r['transfer_bytes']:,}", f"{r['mean_transfer_ms']:.1f}",
               f"{r['mean_prefill_ms']:.0f}" if "mean_prefill_ms" in r else "",
               f"{r['mean_decode_ms']:.0f}" if "mean_decode_ms" in r else ""] for r in pd]
    print(table(["layout", "side", "mean TTFT ms", "mean ITL ms", "KV bytes moved", "mean transfer ms",
                 "mean prefill ms", "mean decode ms"], lines))
    print(f"\n- 1P+1D simulated vs measured: TTFT {pd[1]['mean_ttft_ms_err_pct']:+.1f}%, ITL "
          f"{pd[1]['mean_itl_ms_err_pct']:+.1f}% (goal within 20%)", flush=True)

    rows = colocated_vs_disaggregated(GPU, sizes.gpu_rates, num_requests=sizes.gpu_requests, prompt_len=1024,
                                      output_len=64, ttft_slo_ms=TTFT_SLO_MS, tpot_slo_ms=TPOT_SLO_MS,
                                      config=GPU_CONFIG)
    print(f"\n### Disaggregation on a GPU (simulated): Llama-3.1-8B on 2 H100-SXM, {sizes.gpu_requests} Poisson "
          f"requests, prompts 1,024, outputs 64, no chunked prefill, SLOs TTFT {TTFT_SLO_MS:g} ms and TPOT "
          f"{TPOT_SLO_MS:g} ms\n")
    print(table(["layout", "rate req/s", "goodput req/s", "per GPU", "SLO attainment", "p90 TTFT ms",
                 "mean TPOT ms"],
                [[r["layout"], f"{r['rate']:g}", f"{r['goodput']:.1f}", f"{r['goodput_per_gpu']:.1f}",
                  f"{r['slo_attainment']:.0%}", f"{r['p90_ttft_ms']:.0f}", f"{r['mean_tpot_ms']:.2f}"]
                 for r in rows]))
    print("\n- highest rate with >= 90% of requests within both SLOs: "
          + ", ".join(f"{layout} {max_rate_within(rows, layout):g} req/s" for layout in ("colocated", "1P+1D")))
    links = kv_link_sweep(GPU, LINKS, rate=sizes.gpu_rates[0], prompt_len=1024, num_requests=sizes.gpu_requests,
                          ttft_slo_ms=TTFT_SLO_MS, tpot_slo_ms=TPOT_SLO_MS, config=GPU_CONFIG)
    print(f"\n1P+1D at {sizes.gpu_rates[0]:g} req/s with the KV link swept:\n")
    print(table(["link", "transfer ms (1,024 tokens)", "mean TTFT ms", "p90 TTFT ms", "SLO attainment"],
                [[r["link"], f"{r['transfer_ms']:.1f}", f"{r['mean_ttft_ms']:.0f}", f"{r['p90_ttft_ms']:.0f}",
                  f"{r['slo_attainment']:.0%}"] for r in links]), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2, help="engine runs per configuration; the fastest is kept")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test, not a result")
    args = parser.parse_args()
    sizes = QUICK if args.quick else FULL
    start = time.perf_counter()
    loaded = load_model(None, dtype="float32")
    profile = load_or_calibrate(loaded)
    sides = Sides(model=loaded, hardware=profile, repeats=args.repeats)
    print(f"{datetime.datetime.now():%Y-%m-%d %H:%M}, {platform.processor() or platform.machine()}, {os.cpu_count()} "
          f"cores, torch {torch.__version__} ({torch.get_num_threads()} threads), {loaded.model_id}, float32; "
          f"profile calibrated {profile.provenance.get('date')} (fit mean |error| "
          f"{profile.provenance.get('fit_mean_abs_error_pct')}%, steady: {profile.provenance.get('steady')}); "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '')} `python {' '.join(sys.argv)}`")
    stall(sides, sizes)
    fairness(sides, sizes)
    disaggregation(loaded, sides, sizes)
    print(f"\nwall time {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
