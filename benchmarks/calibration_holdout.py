"""The calibrated profile on step shapes its grid never measured: small decode batches and speculative verifies.

    python benchmarks/calibration_holdout.py [--threads 2]

Calibrates a profile (not saved), then, straight after, runs on the engine: decode at batch 2, 3 and 6
(prompts of 64, 12 tokens out) and, for batch 1, 2 and 8, the same input-grounded prompts without and with
prompt-lookup speculation (k = 5), the shapes of lesson 5. For each kind of step it prints the median measured
time, the profile's median price of the same steps (`BatchShape.from_step`: logit rows included), and the
median per-step error; then a verify's cost in plain decode steps, measured (`measured_verify_cost`) and priced
(`priced_verify_cost`). Each held-out run keeps the faster of two. Prints markdown for benchmarks/RESULTS.md
("The calibrated profile on held-out shapes"). A benchmark, not a test. ~4 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import datetime
import platform
from collections import defaultdict
from statistics import median

import torch

from core.config import EngineConfig
from core.metrics import RunMetrics, StepRecord
from core.workload import Workload
from course.speculative_decoding import grounded_prompts, measured_verify_cost, priced_verify_cost
from ref_engine import bench
from ref_engine.model.loader import LoadedModel, load_model
from serving_lab.calibrate import calibrate
from sim.cost_model import BatchShape, CostModel

K = 5
NGRAM = EngineConfig(speculative_method="ngram", num_speculative_tokens=K, speculative_disable_by_batch_size=None)


def faster(loaded: LoadedModel, workload: Workload, config: EngineConfig) -> RunMetrics:
    return min((bench.run(workload, config, model=loaded) for _ in range(2)), key=lambda m: m.duration)


def step_kind(step: StepRecord) -> str:
    batch = len(step.query_lens)
    if max(step.query_lens) == 1:
        return f"decode, batch {batch}"
    if all(q == 1 + K for q in step.query_lens):
        return f"verify of {K}, batch {batch}"
    return ""  # prefills and partly speculating steps: not what this benchmark is about


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    loaded = load_model(None)
    profile = calibrate(loaded, save=False, verbose=False)
    cost_model = CostModel(loaded.arch, profile, dtype="float32")

    runs: list[RunMetrics] = []
    for batch in (2, 3, 6):
        workload = Workload.synthetic(batch, prompt_len=64, output_len=12, seed=100 + batch, name="decode")
        runs.append(faster(loaded, workload, EngineConfig(max_num_seqs=batch)))
    ratios = []
    for batch in (1, 2, 8):
        workload = Workload.from_token_ids(grounded_prompts(loaded.tokenizer, batch), 32, name="speculation")
        plain, spec = faster(loaded, workload, EngineConfig()), faster(loaded, workload, NGRAM)
        runs += [plain, spec]
        try:
            measured = measured_verify_cost(plain, spec, K)
        except ValueError:  # no step in which every request verified K drafts (a large batch rarely has one)
            continue
        context = int(median(c for s in spec.steps for c in s.context_lens))
        ratios.append((batch, measured, priced_verify_cost(cost_model, batch, context, K)))

    by_kind: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for step in (s for run in runs for s in run.steps):
        if kind := step_kind(step):
            by_kind[kind].append((step.duration, cost_model.step_time(BatchShape.from_step(step))))
    provenance = profile.provenance
    print(f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.processor() or platform.machine()}, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads; profile fit: mean |error| "
          f"{provenance['fit_mean_abs_error_pct']}%, p90 {provenance['fit_p90_abs_error_pct']}% over "
          f"{provenance['num_points']} grid steps; steady: {provenance.get('steady')}; effective matmul rate "
          f"{profile.peak_flops['float32'] / 1e9:.0f} GFLOP/s, weight packing passes {profile.weight_packing_passes:.2f}")
    print("\n| held-out steps | count | measured (median ms) | priced (median ms) | median error per step |")
    print("| --- | --- | --- | --- | --- |")
    for kind, pairs in sorted(by_kind.items(), key=lambda item: (item[0].split(",")[0], int(item[0].split()[-1]))):
        error = median(100 * (p - m) / m for m, p in pairs)
        print(f"| {kind} | {len(pairs)} | {median(m for m, _ in pairs) * 1e3:.1f} | "
              f"{median(p for _, p in pairs) * 1e3:.1f} | {error:+.0f}% |")
    print("\n| batch | verify in decode steps, measured | priced |")
    print("| --- | --- | --- |")
    for batch, measured, priced in ratios:
        print(f"| {batch} | {measured:.2f} | {priced:.2f} |")


if __name__ == "__main__":
    main()
