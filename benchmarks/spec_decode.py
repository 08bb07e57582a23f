"""Speculative decoding on SmolLM2-135M: output tokens/s with and without it, measured and simulated.

    python benchmarks/spec_decode.py [--output-len 128] [--repeats 2]

Two prompt kinds: input-grounded (copy a fixed text or code, `course.speculative_decoding.GROUNDED_TEXTS`, where
n-gram prompt lookup shines) and open chat (nothing to look up). Single stream and batch 8; configurations: off, n-gram (k = 5, default
batch-size threshold), n-gram with the threshold off, and a self-draft (the target's first 8 layers,
k = 3). Greedy; the fastest of `--repeats` runs is kept. The simulated column replays each run's own
draft and acceptance counts on this machine's calibrated profile. Prints a Markdown table for
benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import platform

import torch

from core import EngineConfig
from course.speculative_decoding import CHAT_TEMPLATE, grounded_prompts, speculation
from ref_engine.model.loader import load_model
from serving_lab.pairing import Sides

OPEN_CHAT = ["Write a short story about a dragon who learns to bake bread.",
             "What are three good habits for staying healthy?", "Explain why the sky is blue to a child.",
             "Give me ideas for a weekend trip in the mountains.", "Describe your ideal breakfast.",
             "How do I start learning to play the guitar?", "Write a poem about the sea at night.",
             "What makes a good team leader?"]
CONFIGS = {
    "off": EngineConfig(),
    "ngram": EngineConfig(speculative_method="ngram"),
    "ngram, threshold off": EngineConfig(speculative_method="ngram", speculative_disable_by_batch_size=None),
    "self:8 draft, k=3": EngineConfig(speculative_method="draft_model", speculative_model="self:8",
                                      num_speculative_tokens=3, speculative_disable_by_batch_size=None),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    torch.manual_seed(0)
    loaded = load_model(None)
    sides = Sides(model=loaded, repeats=args.repeats)
    kinds = {"input-grounded": grounded_prompts(loaded.tokenizer, 8),
             "open chat": [loaded.tokenizer.encode(CHAT_TEMPLATE.format(q)) for q in OPEN_CHAT]}
    print(f"{platform.processor() or platform.machine()}, torch {torch.__version__}, {torch.get_num_threads()} "
          f"threads, float32, output {args.output_len} tokens, fastest of {args.repeats}")
    print("| prompts | batch | configuration | measured tok/s | speed-up | simulated tok/s | sim. error "
          "| accepted / drafted | tokens per verify |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for kind, prompts in kinds.items():
        for batch in (1, 8):
            configs = CONFIGS if batch == 8 else {k: v for k, v in CONFIGS.items() if k != "ngram, threshold off"}
            rows = speculation(prompts[:batch], configs, sides, output_len=args.output_len, kind=kind)
            measured = [r for r in rows if r["side"] == "measured"]
            simulated = [r for r in rows if r["side"] == "simulated"]
            base = measured[0]["output_throughput"]
            for m, s in zip(measured, simulated):
                spec = f"{m['num_accepted_tokens']} / {m['num_draft_tokens']}" if m["num_draft_tokens"] else "-"
                per_verify = f"{m['mean_acceptance_length']:.2f}" if m["num_draft_tokens"] else "-"
                print(f"| {kind} | {batch} | {m['config']} | {m['output_throughput']:.1f} | "
                      f"{m['output_throughput'] / base:.2f}x | {s['output_throughput']:.1f} | "
                      f"{s['output_throughput_err_pct']:+.1f}% | {spec} | {per_verify} |", flush=True)


if __name__ == "__main__":
    main()
